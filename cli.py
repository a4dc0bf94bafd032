"""The one line a command ends with when run by the wrong Python (`missing_line`), for every entry point: `python -m
api` (`exit_outside_venv`), the tools of `learn/` (`learn/__init__.py`) and of `testing/` (`testing.cli`).

The project runs in its environment (`make install` builds .venv, `make install-dev` adds the tools' packages). Run
by another Python, a system one without the project's packages, a command's first import of one would end in a
traceback; each entry point catches that and says, in this one line, what to run instead. Standard library only, so
that it imports anywhere.
"""

from __future__ import annotations

import sys
from typing import NoReturn


def missing_line(module: str, missing: str, install: str = "make install", instead: str = "") -> str:
    """Say that `python -m <module>` needs the package `missing`, which this Python lacks, and what to run: `instead`,
    else the module under .venv's Python, after `install`."""
    run = f"`.venv/bin/python -m {module}`"
    if instead:
        run = f"`{instead}` (or {run})"
    return (f"python -m {module} needs {missing}, which this Python ({sys.executable}) lacks: "
            f"run {run} after `{install}`")


def exit_outside_venv(missing: ModuleNotFoundError, module: str, instead: str = "") -> NoReturn:
    """End `python -m <module>`, which needs a package this Python lacks, in `missing_line` on stderr, and exit 2, the
    command having been run the wrong way."""
    print(missing_line(module, missing.name or str(missing), instead=instead), file=sys.stderr)
    raise SystemExit(2)
