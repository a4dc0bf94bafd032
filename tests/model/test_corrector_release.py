"""model.corrector.Corrector.release and forget_shared: a corrector swapped out (hosting.host) is freed at once,
although its objects were frozen (gc.freeze), and so is what was read for a folder no longer served."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from config import DEFAULT_WEIGHTS_DIR
from model import corrector as corrector_module
from model.contract import sha256
from model.corrector import Corrector, forget_shared
from model.weights_meta import CONFIG_FILE, NETWORK_FILE, VOCAB_FILE


def _freed_when_released_frozen(held: list[Corrector], parts: dict[str, weakref.ref]) -> dict[str, bool]:
    """Freeze every object (as a served corrector is: hosting.loading.freeze_set_up, which no collection frees
    again), release the one corrector `held` holds and drop it; which of `parts` reference counting freed."""
    gc.collect()
    gc.freeze()
    try:
        held.pop().release()
        return {name: ref() is None for name, ref in parts.items()}
    finally:
        gc.unfreeze()


@pytest.mark.real_model
def test_a_released_corrector_is_freed_by_reference_counting_although_frozen():
    corrector = Corrector(device="cpu", stage="full")
    corrector.setup()
    parts = {name: weakref.ref(getattr(corrector, name)) for name in ("lm", "featurizer", "reranker", "net")}
    held = [corrector]
    del corrector  # the helper drops the last reference
    assert _freed_when_released_frozen(held, parts) == dict.fromkeys(parts, True)


@pytest.mark.real_model
def test_a_released_corrector_frees_its_masked_lm_although_frozen(tmp_path: Path):
    """The masked LM's output projection holds a hook bound to it (model.masked_lm): a cycle no frozen collection
    would free, broken by release."""
    from tests.model.tiny_mlm import tiny_masked_lm, weighing_folder

    mlm = tiny_masked_lm(tmp_path / "mlm")
    corrector = Corrector(weighing_folder(tmp_path / "weighs", mlm), device="cpu", masked_lm_dir=mlm)
    corrector.setup()
    assert corrector.masked_lm is not None
    parts = {"masked_lm": weakref.ref(corrector.masked_lm), "model": weakref.ref(corrector.masked_lm.model)}
    held = [corrector]
    del corrector  # the helper drops the last reference
    assert _freed_when_released_frozen(held, parts) == dict.fromkeys(parts, True)


def test_forget_shared_drops_what_was_read_for_other_vocabularies_only(tmp_path: Path):
    """Keeps the served folder's reads and the master's (preloaded before the fork), drops the rest."""
    other = tmp_path / "other"
    other.mkdir()
    (other / VOCAB_FILE).write_text('{"chars": []}', encoding="utf-8")  # another vocabulary: another key
    shared, preloaded = corrector_module._SHARED, corrector_module._PRELOADED
    saved, saved_preloaded = dict(shared), set(preloaded)
    served = sha256(DEFAULT_WEIGHTS_DIR / VOCAB_FILE)
    try:
        shared[("vocab", sha256(other / VOCAB_FILE))] = object()
        shared[("vocab", served)] = kept = object()
        shared[("confusion", "f" * 64)] = master = object()
        preloaded.add(("confusion", "f" * 64))
        shared[("lexicon", "/somewhere/lexicon")] = lexicon = object()

        assert forget_shared(DEFAULT_WEIGHTS_DIR) == 1

        assert ("vocab", sha256(other / VOCAB_FILE)) not in shared
        assert shared[("vocab", served)] is kept and shared[("confusion", "f" * 64)] is master
        assert shared[("lexicon", "/somewhere/lexicon")] is lexicon
    finally:
        shared.clear()
        shared.update(saved)
        preloaded.clear()
        preloaded.update(saved_preloaded)


def test_folders_with_the_same_vocabulary_file_share_one_reading(tmp_path: Path):
    """learn.adapt copies the shipped vocab.json into each adapted folder: a swap to one reads no vocabulary again."""
    copy = tmp_path / "adapted"
    copy.mkdir()
    for name in (CONFIG_FILE, NETWORK_FILE):
        (copy / name).symlink_to(DEFAULT_WEIGHTS_DIR / name)
    (copy / VOCAB_FILE).write_bytes((DEFAULT_WEIGHTS_DIR / VOCAB_FILE).read_bytes())

    assert corrector_module._vocab(copy) is corrector_module._vocab(DEFAULT_WEIGHTS_DIR)
