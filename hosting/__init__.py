"""The model's life in one room: build, check, load, warm, swap and release behind one host (`hosting.host.ModelHost`).

`hosting.build.build_host(config, ...)` builds the host a config asks for: the corrector in this process behind the
threaded batcher (`InProcessHost`, loading on a thread: `hosting.loading`), or in the process engine's worker
processes (`ProcessHost`); either watches where `WEIGHTS_DIR` leads (`hosting.swap.ModelSwapper`) and swaps the
folder it leads to in. `hosting.interfaces` names what crosses the layers (the corrector's and the engine's
protocols). The web layer (`api/`) asks the host; it never starts the model's threads or processes.

Below `api/`, above `batching/` and `cache/` (pyproject.toml's layers contract).
"""
