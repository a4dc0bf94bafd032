"""What learns and measures, never served: training the network (`train`, its settings in `train_settings`, its data
in `train_data`, its loop in `fit`), fitting the second stage (`tune`), adapting to a team's labelled lists (`adapt`,
its settings in `adapt_settings`, its output folder in `adapt_folder`, the domain LM built by `domain_lm`, the
confusion rules and their trust learned by `rule_trust`), and the figures (`evaluate`, `diagnose`; adapt
cross-validated on one labelled file, `crossval`, and what limits it, `limits`; the error statistics the stand-in data
is held to, `error_stats`). Run from the repository root as modules, e.g.
`.venv/bin/python -m learn.evaluate`.

Every tool here is guarded once, here: run by a Python that lacks the project's packages (the system Python, say),
`python -m learn.<tool>` stops in one line naming the package and the command to run instead, exit status 2.
"""

from __future__ import annotations

import importlib.util
import sys

NEEDED = ("numpy", "torch", "transformers", "safetensors", "rapidfuzz", "kenlm", "opencc", "tqdm")


def _tool() -> str:
    argv = getattr(sys, "orig_argv", [])
    return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else "learn"


_missing = next((name for name in NEEDED if importlib.util.find_spec(name) is None), None)
if _missing is not None:
    from cli import missing_line

    print(missing_line(_tool(), _missing, install="make install-dev"), file=sys.stderr)
    raise SystemExit(2)
