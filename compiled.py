"""The model's hot modules compiled to C (Cython), built by `make run` and `make install-dev`, used only while current.

Featurizing and the second stage are interpreted Python around the network (issue 61): per batch, dictionaries,
strings and small tuples, one position and one candidate sentence at a time. Cython compiles those modules, unchanged,
to C extension modules: the `.py` files stay the one implementation, which runs interpreted wherever the compiled ones
are missing or out of date (a machine without a C compiler, a module edited since the build, `ESUN_INTERPRETED=1`).

`KERNELS` are the exception: C written in Cython's own language (`.pyx`), where Python objects per character were the
cost (the trigram's segmentation: `model/segmenter.pyx`); each has a Python reference that runs where it is not built,
and a test holds the two to the same results.

`python -m compiled` builds `.compiled/<package>/<module>.*.so` for `MODULES` and `KERNELS` (nothing when they are
current): the sources are copied into a new folder, compiled there, and the folder replaces the old one whole, with a
manifest of the sources' sha256. A package whose modules are listed calls `extend(__name__, __path__)` in its
`__init__`: its compiled folder goes first on its search path only while every one of its listed modules and kernels
matches the manifest, so a module edited since the build never runs stale.

Standard library only (the bottom layer): Cython runs in a child process, as `python -m Cython.Build.Cythonize`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from config import REPO_ROOT

# the hot path of a batch (featurizing, the trigram's segmentation, the second stage's rows and gate), by package
MODULES: dict[str, tuple[str, ...]] = {
    "model": ("bigram", "features", "gate", "lm", "memo", "rerank", "unanimous"),
    "preprocess": ("align",),
}
# C kernels (`<module>.pyx`), by package: importable only from the package's compiled folder, so only where it is used
KERNELS: dict[str, tuple[str, ...]] = {
    "model": ("segmenter",),
}
BUILD_DIR = REPO_ROOT / ".compiled"
MANIFEST = "manifest.json"
OFF = "ESUN_INTERPRETED"  # set to 1: run the modules interpreted even where they are compiled and current


def _sources() -> dict[str, Path]:
    modules = {f"{package}/{name}.py": REPO_ROOT / package / f"{name}.py"
               for package, names in MODULES.items() for name in names}
    return modules | {f"{package}/{name}.pyx": REPO_ROOT / package / f"{name}.pyx"
                      for package, names in KERNELS.items() for name in names}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(build_dir: Path) -> dict:
    try:
        return json.loads((build_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def stale(build_dir: Path = BUILD_DIR, package: str | None = None) -> list[str]:
    """The listed sources (of `package`, or all) that the build in `build_dir` does not hold as they are now (all of
    them without one, or with one for another Python)."""
    manifest = _manifest(build_dir)
    sources = {name: path for name, path in _sources().items() if package is None or name.startswith(f"{package}/")}
    if manifest.get("abi") != sys.implementation.cache_tag:
        return sorted(sources)
    built = manifest.get("sources", {})
    return sorted(name for name, path in sources.items() if not path.is_file() or built.get(name) != _digest(path))


def extend(package: str, path: list[str], build_dir: Path = BUILD_DIR) -> bool:
    """Put `package`'s compiled folder first on its search path (`path`, the package's `__path__`) when its listed
    modules are all current; return whether it did."""
    folder = build_dir / package
    if os.environ.get(OFF, "") not in ("", "0") or not folder.is_dir():
        return False
    if stale(build_dir, package):
        return False
    path.insert(0, str(folder))
    return True


def used() -> dict[str, bool]:
    """Whether each listed module and kernel runs compiled in this process (imports them)."""
    import importlib

    out = {}
    for package, names in MODULES.items():
        for name in names:
            module = importlib.import_module(f"{package}.{name}")
            out[f"{package}.{name}"] = not str(getattr(module, "__file__", "")).endswith(".py")
    for package, names in KERNELS.items():
        for name in names:
            out[f"{package}.{name}"] = kernel(package, name) is not None
    return out


def kernel(package: str, name: str) -> ModuleType | None:
    """The compiled kernel `package.name`, or None where it is not built and current (its Python reference runs)."""
    import importlib

    try:
        return importlib.import_module(f"{package}.{name}")
    except ImportError:  # no .pyx is importable: only a build puts the module on the package's path
        return None


def build(build_dir: Path = BUILD_DIR, jobs: int = min(8, os.cpu_count() or 1)) -> None:
    """Compile `MODULES` into a new folder beside `build_dir` and put it in its place whole (raises CalledProcessError
    or OSError, leaving `build_dir` as it was)."""
    sources = _sources()
    work = Path(tempfile.mkdtemp(prefix=f".{build_dir.name}.building-", dir=build_dir.parent))
    work.chmod(0o755)  # mkdtemp's 0700 would hide it from a server run as another user (the image's)
    try:
        copies = []
        for name, path in sources.items():
            copy = work / name
            copy.parent.mkdir(exist_ok=True)
            (copy.parent / "__init__.py").touch()  # Cython names the module by its package: model.lm, not lm
            shutil.copy2(path, copy)
            copies.append(str(copy.relative_to(work)))
        subprocess.run([sys.executable, "-m", "Cython.Build.Cythonize", "-i", "-3", "-j", str(jobs), "-q", *copies],
                       cwd=work, check=True, capture_output=True, text=True)
        for leftover in [*(found for pattern in ("*.py", "*.pyx", "*.c", "*.cpp") for found in work.rglob(pattern)),
                         *work.glob("build")]:
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        manifest = {"abi": sys.implementation.cache_tag, "sources": {n: _digest(p) for n, p in sources.items()}}
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        old = build_dir.with_name(f".{build_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if build_dir.exists():
            build_dir.rename(old)
        work.rename(build_dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _compilers() -> list[str]:
    """The C compiler (the modules) and the C++ one (the segmenter kernel calls KenLM's C++ interface)."""
    return [os.environ.get("CC", "cc").split()[0], os.environ.get("CXX", "c++").split()[0]]


def main() -> int:
    """`python -m compiled`: build where out of date; one line either way. Without a C or C++ compiler, or where the
    build fails (no Python headers, say), the model runs interpreted: said, not an error (tests/test_compiled.py holds
    a machine with the compilers to a build that works)."""
    if not stale(BUILD_DIR):
        print(f"compiled: {len(_sources())} modules current in {BUILD_DIR.name}/")
        return 0
    missing = [name for name in _compilers() if shutil.which(name) is None]
    if missing:
        print(f"compiled: no C or C++ compiler ({', '.join(missing)}): the model runs interpreted, slower"
              " (apt-get install gcc g++)")
        return 0
    started = time.monotonic()
    try:
        build(BUILD_DIR)
    except subprocess.CalledProcessError as exc:
        why = (exc.stderr or exc.stdout or "").strip().splitlines()
        print(f"compiled: the build failed, the model runs interpreted, slower: {why[-1] if why else exc}",
              file=sys.stderr)
        return 0
    print(f"compiled: {len(_sources())} modules into {BUILD_DIR.name}/ in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
