"""model.weights_meta: a weights folder's config.json read whole, checked field by field, and written whole."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from config import DEFAULT_WEIGHTS_DIR, REPO_ROOT, Config, ConfigError
from model.contract import check_weights, check_weights_dir, sha256
from model.corrector import Corrector
from model.weights_meta import CONFIG_FILE, NETWORK_FILE, VOCAB_FILE, RerankStage, WeightsMeta, WeightsMetaError
from preprocess.text import NBest

# config.json, confusions.json and domain_lm.arpa of a folder `python -m learn.adapt` wrote at 427ba62 (the
# 10-hypothesis file of tests/learn/test_adapt.py, --epochs 1): its network has the shipped one's shape, so the tests
# pair these with the shipped model.safetensors and vocab.json
ADAPTED_427BA62 = Path(__file__).parent / "fixtures" / "adapted_427ba62"


def _raw(folder: Path) -> dict:
    return json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))


@pytest.fixture
def adapted(tmp_path: Path) -> Path:
    """The 427ba62 adapted folder, whole."""
    out = tmp_path / "adapted"
    shutil.copytree(ADAPTED_427BA62, out)
    for name in (NETWORK_FILE, VOCAB_FILE):
        (out / name).symlink_to(DEFAULT_WEIGHTS_DIR / name)
    return out


def _shipped_with(tmp_path: Path, **fields: object) -> Path:
    """The shipped folder with config.json's top-level `fields` replaced (a field set to None is removed)."""
    out = tmp_path / "weights"
    out.mkdir()
    for name in (NETWORK_FILE, VOCAB_FILE):
        (out / name).symlink_to(DEFAULT_WEIGHTS_DIR / name)
    raw = _raw(DEFAULT_WEIGHTS_DIR) | fields
    (out / CONFIG_FILE).write_text(json.dumps({k: v for k, v in raw.items() if v is not None}), encoding="utf-8")
    return out


def test_weights_meta_reads_the_shipped_folder_and_writes_back_the_same_json(tmp_path):
    meta = WeightsMeta.load(DEFAULT_WEIGHTS_DIR)

    assert meta.threshold == 0.96 and meta.net.hidden == 256 and set(meta.rerank) == {"full", "lm"}
    assert meta.adaptation is None and meta.evaluation is not None
    meta.save(tmp_path)
    shipped = (DEFAULT_WEIGHTS_DIR / CONFIG_FILE).read_text("utf-8")
    assert (tmp_path / CONFIG_FILE).read_text(encoding="utf-8") == shipped


def test_a_folder_adapted_at_427ba62_loads_and_passes_the_start_up_check(adapted, tmp_path):
    meta = check_weights_dir(adapted)

    assert meta.adaptation is not None and meta.adaptation.provenance is not None
    assert set(meta.adaptation.files) == {"domain_lm", "confusions"}
    assert meta.evaluation is None and set(meta.rerank) == {"full", "lm"}
    assert meta.to_dict() == _raw(adapted)  # nothing read is dropped or changed
    check_weights(Config.from_env({"WEIGHTS_DIR": str(adapted)}))


@pytest.mark.real_model
def test_a_folder_adapted_at_427ba62_is_served_with_its_adaptation(adapted):
    corrector = Corrector(adapted, device="cpu")
    corrector.setup()

    assert corrector.adaptation is not None and corrector.adaptation.conventions.allows("台", "臺")
    assert corrector.info["adapted"]["split"]["seed"] == 7
    assert corrector.predict_batch([NBest(("我 想 申請 貸款",))]) == ["我想申請貸款"]


def _with_trust_floor(folder: Path, key: str, floor: float) -> Path:
    """`folder` with its confusions.json holding the trust floor under `key` (and config.json its new sha256)."""
    confusions = folder / "confusions.json"
    confusions.write_text(json.dumps(json.loads(confusions.read_text(encoding="utf-8")) | {key: floor},
                                     ensure_ascii=False), encoding="utf-8")
    raw = _raw(folder)
    raw["adaptation"]["files"]["confusions"]["sha256"] = sha256(confusions)
    (folder / CONFIG_FILE).write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    return folder


@pytest.mark.real_model
def test_a_folder_whose_confusions_json_names_its_trust_floor_gate_is_served_under_that_floor(adapted, tmp_path):
    # learn.adapt wrote the trust floor as "gate" until it was renamed; such a folder serves as it did. The fixture's
    # rules are all at rate 1: without a floor 台 → 臺 acts, under the closed floor (1.01) none does
    folders = {"none": adapted}
    for key in ("gate", "trust_floor"):
        folders[key] = _with_trust_floor(shutil.copytree(adapted, tmp_path / key, symlinks=True), key, 1.01)
    lists = [NBest(("台灣 的 銀行", "台灣 得 銀行")), NBest(("我 在 台北 工作",))]
    answers = {}
    for name, folder in folders.items():
        check_weights_dir(folder)
        corrector = Corrector(folder, device="cpu")
        corrector.setup()
        assert corrector.adaptation is not None
        answers[name] = (corrector.adaptation.confusions.floor, corrector.predict_batch(lists))

    assert answers["none"] == (None, ["臺灣的銀行", "我在台北工作"])
    assert answers["gate"] == answers["trust_floor"] == (1.01, ["台灣的銀行", "我在台北工作"])


def test_a_folder_trained_at_427ba62_without_a_second_stage_loads(tmp_path):
    """learn.train wrote no `rerank` and, where a folder had no figures, `"evaluation": null`."""
    meta = WeightsMeta.load(_shipped_with(tmp_path, rerank=None, evaluation=None))

    assert meta.rerank == {} and meta.evaluation is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"threshold": "high"}, "threshold must be a number, got 'high'"),
    ({"threshold": None}, "threshold is missing"),
    ({"net": {"n_chars": 4598, "n_syllables": 398, "hidden": 256.0, "layers": 3, "heads": 4, "ffn": 1024,
              "dropout": 0.1}}, "net.hidden must be a whole number >= 1, got 256.0"),
    ({"features": {"candidate": "keep", "position": [], "scales": {}}},
     "features.candidate must be a list of strings, got 'keep'"),
    ({"rerank": {"full": {"weights": {"lm": "0.6"}}}}, "rerank.full.weights.lm must be a number, got '0.6'"),
    ({"rerank": {"fast": {"weights": {}}}}, "rerank.fast is not a field this code knows"),
    ({"rerank": {"full": {"weights": {"acoustic": 1.0}}}},
     "rerank.full.weights.acoustic is not a field this code knows"),
    ({"rerank": {"full": {"weights": {}, "gate": {"weights": {"lead": "x"}, "margin": 1.0}}}},
     "rerank.full.gate.weights.lead must be a number, got 'x'"),
    ({"rerank": {"full": {"weights": {}, "gate": {"weights": {}}}}}, "rerank.full.gate.margin is missing"),
    ({"rerank": {"full": {"weights": {}, "gate": {"weights": {"acoustic": 1.0}, "margin": 1.0}}}},
     "rerank.full.gate.weights.acoustic is not a field this code knows"),
    ({"rerank": {"full": {"weights": {}, "gate": {"weights": {}, "margin": 1.0, "focus_margin": "low"}}}},
     "rerank.full.gate.focus_margin must be a number, got 'low'"),
    ({"trained": ["steps"]}, "trained must be a JSON object or null, got ['steps']"),
    ({"adaptation": {"files": {"confusions": {"name": "../c.json", "sha256": "0" * 64}}, "provenance": {}}},
     "adaptation.files.confusions.name must be a file name inside the folder, got '../c.json'"),
    ({"adaptation": {"files": {"confusions": {"name": "c.json", "sha256": "XY"}}}},
     "adaptation.files.confusions.sha256 must be 64 lowercase hex digits, got 'XY'"),
    ({"thresold": 0.9}, "thresold is not a field this code knows"),
    ({"masked_lm": {"path": "/m", "file": "model.safetensors"}}, "masked_lm.sha256 is missing"),
    ({"masked_lm": {"path": "/m", "file": "model.safetensors", "sha256": "XY"}},
     "masked_lm.sha256 must be 64 lowercase hex digits, got 'XY'"),
])
def test_weights_meta_names_the_bad_field_in_one_line(tmp_path, fields, message):
    with pytest.raises(WeightsMetaError) as raised:
        WeightsMeta.load(_shipped_with(tmp_path, **fields))

    assert str(raised.value).startswith(f"{tmp_path / 'weights' / CONFIG_FILE}: {message}")
    assert "\n" not in str(raised.value)


def test_a_gate_with_a_focused_regime_is_read_and_written_back_as_it_was(tmp_path):
    gate = {"weights": {"lead": 1.0}, "margin": -1.0, "focus_scatter": 2.0, "focus_margin": 1.9}
    folder = _shipped_with(tmp_path, rerank={"full": {"weights": {"lm": 1.0}, "gate": gate}})
    meta = WeightsMeta.load(folder)
    assert meta.rerank["full"].gate == gate
    meta.save(folder)
    assert json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))["rerank"]["full"]["gate"] == gate


def test_the_masked_lm_a_folder_was_fitted_with_is_read_and_written_back_as_it_was(tmp_path):
    record = {"path": "/models/macbert", "file": "model.safetensors", "sha256": "ab" * 32}
    folder = _shipped_with(tmp_path, masked_lm=record)
    meta = WeightsMeta.load(folder)
    assert meta.masked_lm is not None and meta.masked_lm.sha256 == "ab" * 32
    meta.save(folder)
    assert json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))["masked_lm"] == record


def test_a_wrong_typed_field_stops_start_up_in_one_line_naming_it(tmp_path):
    weights = _shipped_with(tmp_path, threshold="high")

    with pytest.raises(ConfigError, match=r"^weights_dir: .*config\.json: threshold must be a number, got 'high'$"):
        check_weights(Config.from_env({"WEIGHTS_DIR": str(weights)}))
    run = subprocess.run([sys.executable, "-m", "api"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PORT": "0", "WEIGHTS_DIR": str(weights)})
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "threshold must be a number" in run.stderr


def test_weights_meta_save_replaces_the_file_whole_keeping_its_permissions(tmp_path):
    folder = _shipped_with(tmp_path)
    (folder / CONFIG_FILE).chmod(0o644)
    meta = WeightsMeta.load(folder)

    meta.with_stage("lm", RerankStage({"lm": 1.0, "margin": 2.0})).save(folder)

    assert WeightsMeta.load(folder).rerank["lm"] == RerankStage({"lm": 1.0, "margin": 2.0})
    assert WeightsMeta.load(folder).rerank["full"] == meta.rerank["full"]
    assert (folder / CONFIG_FILE).stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in folder.iterdir()) == sorted([CONFIG_FILE, NETWORK_FILE, VOCAB_FILE])


def test_weights_meta_save_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    folder = _shipped_with(tmp_path)
    before = (folder / CONFIG_FILE).read_text(encoding="utf-8")

    def fail(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        WeightsMeta.load(folder).replace(threshold=0.5).save(folder)

    assert (folder / CONFIG_FILE).read_text(encoding="utf-8") == before
    assert sorted(p.name for p in folder.iterdir()) == sorted([CONFIG_FILE, NETWORK_FILE, VOCAB_FILE])
