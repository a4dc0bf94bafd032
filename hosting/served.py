"""What a host serves and how a swap fails: the folder served (`Served`), where a link leads (`resolve`), and the
one check every folder passes before it is served, at start as at a swap (`model.contract.check_weights_dir`)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.contract import FeatureContractError, check_weights_dir, sha256
from model.weights_meta import NETWORK_FILE, WeightsMeta


class SwapFailed(RuntimeError):
    """A weights folder could not be swapped in (refused by the weights contract, or its corrector failed to load or
    warm up); the corrector served before goes on answering."""


@dataclass(frozen=True)
class Served:
    """The weights folder a worker serves: where, what (its network's sha256, its adaptation run), since when."""

    folder: Path
    name: str
    sha256: str
    adaptation: dict[str, Any] | None
    since: float  # time.time()

    @classmethod
    def of(cls, folder: Path, meta: WeightsMeta, since: float) -> Served:
        provenance = meta.adaptation.provenance if meta.adaptation is not None else None
        return cls(folder, meta.name, sha256(folder / NETWORK_FILE), provenance, since)

    @property
    def adapted_from(self) -> str:
        """A short tag of the adaptation run: the sha256 prefixes of the files it learned from ("" if none)."""
        data = (self.adaptation or {}).get("data") or []
        return ",".join(str(d.get("sha256", ""))[:12] for d in data if isinstance(d, dict))

    def describe(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "name": self.name, "sha256": self.sha256, "adaptation": self.adaptation,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))}


def resolve(watched: Path) -> Path:
    """The folder `watched` leads to now (every symlink on the way followed)."""
    return Path(os.path.realpath(watched))


def check_folder(folder: Path) -> WeightsMeta:
    """Check a folder before it is served (its files, every field of its config.json, an adapted folder's parts
    and their sha256); raise SwapFailed in one line."""
    with swap_errors():
        return check_weights_dir(folder)


@contextmanager
def swap_errors() -> Iterator[None]:
    """Turn whatever checking or building a folder raises into SwapFailed, in one line, without a traceback."""
    try:
        yield
    except SwapFailed:
        raise
    except FeatureContractError as exc:
        raise SwapFailed(str(exc)) from None
    except Exception as exc:  # whatever setup() raises on a folder that is not a model
        raise SwapFailed(f"{type(exc).__name__}: {exc}") from None
