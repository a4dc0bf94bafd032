"""What serves: the corrector the service runs (features, network, second-stage reranker, language models, the
weights' contract, loading an adapted folder) and the shipped weights. Imports nothing from `learn/`, which trains,
tunes, adapts and measures it."""

from compiled import extend

extend(__name__, __path__)  # the compiled hot modules, where built and current (compiled.py)
