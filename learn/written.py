"""What a `learn` command records of where it ran, and says of what it wrote.

A command writes where its user named, or says what it wrote over and how to get it back: `wrote` names the file
and, where git tracks it (the shipped `model/weights/config.json`, `docs/bench/`), the command that restores the
committed version.
`portable` records a path as the project's relative one (or a file's bare name outside it), so that a weights
folder's provenance does not carry one machine's absolute paths.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def wrote(path: Path) -> str:
    """One line naming the file (or folder) written; where the project's git tracks it, how to get the committed
    version back."""
    path = Path(path).resolve()
    if not path.is_relative_to(PROJECT_ROOT) or not _tracked(path):
        return f"wrote {path}"
    relative = path.relative_to(PROJECT_ROOT).as_posix()
    return f"wrote {path}, over the committed version: `git checkout -- {relative}` puts it back"


def _tracked(path: Path) -> bool:
    try:
        run = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=PROJECT_ROOT,
                             capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return run.returncode == 0


def portable(value: Any) -> str:
    """A setting as provenance records it: a path inside the project relative to it, one outside by its name alone."""
    if isinstance(value, tuple | list):
        return ", ".join(portable(v) for v in value)
    if not isinstance(value, Path):
        return str(value)
    absolute = value.resolve()
    return absolute.relative_to(PROJECT_ROOT).as_posix() if absolute.is_relative_to(PROJECT_ROOT) else value.name
