"""model.corrector.Corrector.release and forget_shared: a corrector swapped out (api.swap) is freed at once, although
its objects were frozen (gc.freeze), and so is what was read for a folder no longer served."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from config import DEFAULT_WEIGHTS_DIR
from model import corrector as corrector_module
from model.corrector import Corrector, forget_shared
from model.weights_meta import CONFIG_FILE, NETWORK_FILE, VOCAB_FILE


@pytest.mark.real_model
def test_a_released_corrector_is_freed_by_reference_counting_although_frozen():
    corrector = Corrector(device="cpu", stage="full")
    corrector.setup()
    parts = {name: weakref.ref(getattr(corrector, name)) for name in ("lm", "featurizer", "reranker", "net")}
    gc.collect()
    gc.freeze()  # as a served corrector is (api.loading.freeze_set_up): no collection frees these again
    try:
        corrector.release()
        del corrector
        assert {name: ref() is None for name, ref in parts.items()} == dict.fromkeys(parts, True)
    finally:
        gc.unfreeze()


def test_forget_shared_drops_what_was_read_for_other_folders_only(tmp_path: Path):
    other = tmp_path / "other"
    other.mkdir()
    for name in (CONFIG_FILE, NETWORK_FILE, VOCAB_FILE):
        (other / name).symlink_to(DEFAULT_WEIGHTS_DIR / name)
    shared = corrector_module._SHARED
    saved = dict(shared)
    try:
        shared[("vocab", str(other.resolve()))] = object()
        shared[("vocab", str(DEFAULT_WEIGHTS_DIR.resolve()))] = kept = object()
        shared[("lexicon", "/somewhere/lexicon")] = lexicon = object()

        assert forget_shared(DEFAULT_WEIGHTS_DIR) >= 1

        assert ("vocab", str(other.resolve())) not in shared
        assert shared[("vocab", str(DEFAULT_WEIGHTS_DIR.resolve()))] is kept
        assert shared[("lexicon", "/somewhere/lexicon")] is lexicon
    finally:
        shared.clear()
        shared.update(saved)
