"""Where `learn.adapt` writes, whole or not at all: the folder it builds beside `--out` (`building`), renamed into
place when every step is done (`publish`) and removed if any fails; what `--out` may replace (`check_destination`);
what its config.json records of the adaptation (`adaptation_record`); the name of a fine-tuning run's checkpoints
(`run_key`); and the command that swaps the folder into running servers (`swap_command`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from config import DEFAULT_WEIGHTS_DIR
from learn.adapt_settings import AdaptSettings
from model.adaptation import Adaptation, AdaptationError
from model.contract import sha256
from model.masked_lm import check_folder
from model.weights_meta import AdaptationRecord, MaskedLMRecord, PartFile, WeightsMeta, WeightsMetaError


@contextmanager
def building(out: Path) -> Iterator[Path]:
    """A new folder beside `out` to build it in: moved into place (`publish`) when the block ends, removed whole when
    it raises (whatever the exception)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        yield build
        publish(build, out)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise


def publish(build: Path, out: Path) -> None:
    """Move the finished folder into place: readable by others as the umask allows, an earlier one replaced whole."""
    umask = os.umask(0)
    os.umask(umask)
    build.chmod(0o777 & ~umask)
    for file in build.iterdir():
        file.chmod(0o666 & ~umask)
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        out.rename(old / out.name)
        build.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        build.rename(out)


def masked_lm_record(folder: Path) -> MaskedLMRecord:
    """What an adapted folder whose stage weighs a masked LM records of it: where it was, its weights file, and that
    file's sha256 (what serving checks: `model.contract.check_masked_lm`)."""
    weights = check_folder(folder)
    return MaskedLMRecord(str(folder.resolve()), weights.name, sha256(weights))


def swap_command(out: Path, link: str = "current") -> str:
    """The one command that swaps `out` into every running server whose `WEIGHTS_DIR` is the symlink `link` beside it
    (api.swap): the link repointed, which each worker sees within `WEIGHTS_POLL_S`, loads beside its model and swaps
    in between two batches. Run it again with the previous folder to swap back. The link's target is relative (the
    folder's name), so that it resolves wherever the folder holding both is mounted (a container's volume)."""
    out = out.resolve()
    return f"ln -sfn {shlex.quote(out.name)} {shlex.quote(str(out.parent / link))}"


def check_destination(out: Path, init_from: Path) -> None:
    """Refuse an OUT that would overwrite the weights adapt starts from, the shipped model, or a folder that is not an
    earlier adapted one (raises AdaptationError)."""
    if out.is_symlink() and not out.exists():
        raise AdaptationError(f"--out {out} is a symbolic link to {os.readlink(out)}, which does not exist: name a "
                              f"folder, or create the link's target first (nothing was written)")
    target = out.resolve()
    starts_from = ("the weights it starts from (--init-from)", init_from)
    for name, folder in (starts_from, ("the shipped model", DEFAULT_WEIGHTS_DIR)):
        if target == Path(folder).resolve():
            raise AdaptationError(f"--out {out} is {name}: choose another folder (nothing was written)")
    if target.exists() and not target.is_dir():
        raise AdaptationError(f"--out {out} is a file: choose a folder (nothing was written)")
    if target.is_dir() and any(target.iterdir()) and not is_adapted(target):
        raise AdaptationError(f"--out {out} holds something other than an adapted weights folder: choose an empty or "
                              f"new folder (nothing was written)")


def is_adapted(folder: Path) -> bool:
    """Tell whether `folder`'s config.json records an adaptation, finished or not."""
    try:
        return WeightsMeta.load(folder).adaptation is not None
    except WeightsMetaError:
        return False


def adaptation_record(folder: Path, provenance: dict[str, Any] | None = None) -> AdaptationRecord:
    """What config.json records of the parts adapt saved in `folder` (names and sha256), and of the run."""
    files = {part: PartFile(**entry) for part, entry in Adaptation.files_record(folder).items()}
    return AdaptationRecord(files, provenance)


def run_key(args: AdaptSettings, files: list[dict[str, Any]]) -> str:
    """Name a fine-tuning run by what it learns from: the data's sha256, the weights it starts from, the settings."""
    named = {"data": [f["sha256"] for f in files], "init": sha256(args.init_from / "model.safetensors"),
             **{k: getattr(args, k) for k in ("dev_share", "test_share", "seed", "epochs", "lr", "batch_size")}}
    return hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()[:16]
