"""What learns and measures, never served: training the network (`train`, its data in `train_data`), fitting the
second stage (`tune`), adapting to a team's labelled lists (`adapt`, the domain LM built by `domain_lm`), and the
figures (`evaluate`, `diagnose`). Run from the repository root as modules, e.g. `python -m learn.evaluate`."""
