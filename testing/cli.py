"""The client tools' entry points: a problem the user can fix is one line on stderr, never a traceback.

Imports a little of the standard library only: `concurrent_requests` imports this before grequests monkey-patches it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

from cli import missing_line

INSTALL_STEP = "make install-dev"


class ToolError(Exception):
    """A problem the user can fix (a missing file, a bad input); its message is one line."""


def missing_module_line(prog: str, module: str | None) -> str:
    """Say which package is missing and which install step brings it (the project's one such line, cli's)."""
    return missing_line(prog, module or "a package", install=INSTALL_STEP)


@contextmanager
def dev_requirements(prog: str) -> Iterator[None]:
    """Exit with one line naming the install step when a module imported in the block is missing (when prog is the
    program run; a tool imported by another, as ab imports the benchmark, leaves the line to it)."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", prog) != prog:
            raise
        print(missing_module_line(prog, exc.name), file=sys.stderr)
        raise SystemExit(2) from None


def require_weights(fake: bool, missing: list[str]) -> None:
    """Stop a tool that serves the shipped model (not `--fake`'s) where model/weights/ lacks files."""
    if missing and not fake:
        raise ToolError(f"model/weights/ lacks {', '.join(missing)}: train the model first (make train)")


def run(main: Callable[[], int], prog: str) -> NoReturn:
    """Exit with main's status; a ToolError, a bad setting (config.ConfigError) or a missing module
    (`dev_requirements`) becomes one line on stderr and status 2."""
    try:
        with dev_requirements(prog):
            code = main()
    except ToolError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        code = 2
    except ValueError as exc:  # a bad setting in the environment (config.ConfigError), as the service says it
        from config import ConfigError  # imported here: this module imports little before grequests patches

        if not isinstance(exc, ConfigError):
            raise
        print(f"{prog}: config error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
