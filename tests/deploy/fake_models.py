"""Picklable fakes for the process-based batcher: module-level, so spawned workers can import them by name.

Test-only stand-ins: the served path always runs the real corrector.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from service_streamer.managed_model import ManagedModel

from preprocess.text import NBest, han_chars


class EchoModel(ManagedModel):
    """Answer each string item upper-cased, with commands in the items for the tests.

    "boom" anywhere in a batch makes predict raise; "sleep:S" makes the batch sleep S seconds (once per batch);
    "pid" answers the worker's process id; "gpu" answers the worker's CUDA_VISIBLE_DEVICES; "lambda" answers
    something that cannot be pickled; "short" makes predict answer one result too few; "exit" kills the worker.
    """

    def init_model(self, prefix: str = "") -> None:
        self.prefix = prefix

    def predict(self, batch: list[str]) -> list[Any]:
        if "boom" in batch:
            raise RuntimeError("boom")
        if "exit" in batch:
            os._exit(3)
        if "short" in batch:
            return [self.prefix + item for item in batch[1:]]
        sleeps = [float(item.split(":", 1)[1]) for item in batch if item.startswith("sleep:")]
        time.sleep(max(sleeps, default=0.0))
        answers: list[Any] = []
        for item in batch:
            if item == "pid":
                answers.append(os.getpid())
            elif item == "gpu":
                answers.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
            elif item == "lambda":
                answers.append(lambda: None)
            else:
                answers.append(self.prefix + item.upper())
        return answers


class FailingInitModel(ManagedModel):
    """A model whose init_model raises, as a missing weights file would."""

    def init_model(self) -> None:
        raise FileNotFoundError("model/weights/model.safetensors")

    def predict(self, batch: list[Any]) -> list[Any]:
        return batch


class PicklableCorrector:
    """The corrector the app builds in each worker (via ImportedModel) in tests: answers 改 + TOP1's Han text."""

    MARK = "改"

    def __init__(self, weights_dir: Path | None = None, device: str = "auto", lm_path: Path | None = None,
                 stage: str = "full", cpu_precision: str = "int8", cpu_runtime: str = "torch",
                 masked_lm_dir: Path | None = None) -> None:
        self.ready = False

    def setup(self) -> None:
        self.ready = True

    def predict_batch(self, items: list[NBest]) -> list[str]:
        return [self.MARK + han_chars(item.top1) for item in items]


class SlowSetupCorrector(PicklableCorrector):
    """PicklableCorrector whose every worker takes SETUP_S to build its model: a replaced set loads for that long."""

    SETUP_S = 1.5

    def setup(self) -> None:
        time.sleep(self.SETUP_S)
        self.ready = True
