"""The one line `python -m api` ends with when run by the wrong Python (`exit_outside_venv`).

The service runs in the project's environment (`make install` builds .venv). Run by another Python, a system one
without the project's packages, its first import of one would end in a traceback; `api/__main__.py` imports them in
a `try` and, on ModuleNotFoundError, calls `exit_outside_venv` (the load tools have their own, `testing.cli`'s
`dev_requirements`, which names `make install-dev`). Standard library only, so that it imports anywhere.
"""

from __future__ import annotations

import sys
from typing import NoReturn


def exit_outside_venv(missing: ModuleNotFoundError, module: str, instead: str = "") -> NoReturn:
    """End `python -m <module>`, which needs a package this Python lacks: one line on stderr naming what to run
    (`instead`, else the module under .venv's Python), and exit 2, the command having been run the wrong way."""
    run = f"`.venv/bin/python -m {module}`"
    if instead:
        run = f"`{instead}` (or {run})"
    print(f"python -m {module} needs {missing.name or missing}, which this Python ({sys.executable}) lacks: "
          f"run {run} after `make install`", file=sys.stderr)
    raise SystemExit(2)
