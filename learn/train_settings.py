"""One training run's settings (`TrainSettings`, typed and checked once) and the command line that reads them
(`parse_args`); `learn.train` runs them, `learn.adapt` builds them directly.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from config import DEFAULT_WEIGHTS_DIR

DEFAULT_LR = {"scratch": 5e-4, "shipped": 1e-4}
Init = Literal["shipped", "scratch"]


@dataclass(frozen=True)
class TrainSettings:
    """Every setting of a training run, typed and checked once; the command line (`parse_args`) and `learn.adapt`
    build one. `init` defaults by whether `data` is given (shipped with it, else scratch), `lr` by `init`."""

    corpus: Path = Path("data/corpus")
    data: tuple[Path, ...] = ()
    exclude: tuple[Path, ...] = ()
    sim_ratio: float = 1.0
    dev_share: float = 0.05
    init: Init | None = None
    init_from: Path = DEFAULT_WEIGHTS_DIR
    out: Path = DEFAULT_WEIGHTS_DIR
    ckpt_dir: Path = Path("checkpoints")
    seed: int = 7
    variants: int = 3
    epochs: float = 4.0
    steps: int = 0
    batch_size: int = 64
    lr: float | None = None
    warmup: int = 500
    hidden: int = 256
    layers: int = 3
    max_minutes: float = 60.0
    ckpt_every: int = 500
    dev_sentences: int = 3000
    train_sentences: int = 0
    threads: int = 0
    tune_only: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.dev_share < 1.0:
            raise ValueError(f"dev_share must be in [0, 1), got {self.dev_share}")
        if self.sim_ratio < 0:
            raise ValueError(f"sim_ratio must be >= 0, got {self.sim_ratio}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.batch_size < 1 or self.ckpt_every < 1 or self.warmup < 0:
            raise ValueError(f"batch_size and ckpt_every must be >= 1 and warmup >= 0, got {self.batch_size}, "
                             f"{self.ckpt_every} and {self.warmup}")
        init = self.init or ("shipped" if self.data else "scratch")
        object.__setattr__(self, "data", tuple(self.data))
        object.__setattr__(self, "exclude", tuple(self.exclude))
        object.__setattr__(self, "init", init)
        object.__setattr__(self, "lr", self.lr if self.lr is not None else DEFAULT_LR[init])

    @property
    def learning_rate(self) -> float:
        assert self.lr is not None  # set in __post_init__
        return self.lr


def parse_args(argv: list[str] | None = None) -> TrainSettings:
    """Read the command line into settings; a flag not given keeps `TrainSettings`' default."""
    ap = argparse.ArgumentParser(description="Train the n-best corrector (from scratch, or on labelled lists).",
                                 argument_default=argparse.SUPPRESS)
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--data", type=Path, action="append",
                    help="labelled file (the competition's JSON list, or JSONL of its rows); repeatable")
    ap.add_argument("--exclude", type=Path, action="append",
                    help="labelled file whose truths no --data row may share (a test set's sentences); repeatable")
    ap.add_argument("--sim-ratio", type=float,
                    help="with --data: simulated lists per labelled training list (0 = labelled only)")
    ap.add_argument("--dev-share", type=float,
                    help="with --data: share of the labelled ids held out to choose the threshold")
    ap.add_argument("--init", choices=("shipped", "scratch"),
                    help="start from the weights in --init-from, or anew (default: shipped with --data, else scratch)")
    ap.add_argument("--init-from", type=Path, help="the weights --init shipped starts from")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ckpt-dir", type=Path)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--variants", type=int, help="without --data: simulated lists per sentence")
    ap.add_argument("--epochs", type=float)
    ap.add_argument("--steps", type=int, help="stop after N optimizer steps (0 = --epochs decides)")
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--lr", type=float, help="default: 1e-4 from shipped weights, 5e-4 from scratch")
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--hidden", type=int, help="--init scratch only")
    ap.add_argument("--layers", type=int, help="--init scratch only")
    ap.add_argument("--max-minutes", type=float, help="stop training after this long")
    ap.add_argument("--ckpt-every", type=int)
    ap.add_argument("--dev-sentences", type=int, help="most simulated dev lists")
    ap.add_argument("--train-sentences", type=int, help="use only the first N (0 = all)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--tune-only", action="store_true",
                    help="only re-choose the change threshold of the weights in --out on the dev split")
    try:
        return TrainSettings(**vars(ap.parse_args(argv)))
    except ValueError as e:
        ap.error(str(e))
