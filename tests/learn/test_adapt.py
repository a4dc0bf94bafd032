"""`python -m learn.adapt` end to end on tiny labelled files the tests write (10 hypotheses, and TOP1 alone)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from rapidfuzz.distance import Levenshtein

from config import Config, ConfigError
from learn.adapt import MIN_LISTS, main
from learn.adapt_folder import run_key, swap_command
from learn.adapt_settings import data_paths, parse_args
from learn.data.labelled import Labelled, write_labelled
from model.adaptation import DOMAIN_LM_FILE, AdaptationError, DomainLM
from model.contract import check_weights, sha256
from model.corrector import Corrector
from preprocess.text import NBest, han_chars
from tests.deploy.procs import free_port, gunicorn

pytestmark = pytest.mark.real_model

REPO_ROOT = Path(__file__).resolve().parents[2]
PLACES = ("台北", "台中", "台南", "台東", "台灣")
TEMPLATES = ("我 住 在 {}", "{} 的 分行 在 哪裡", "我 要 去 {} 辦 卡", "請問 {} 有 營業 嗎", "我 想 在 {} 開戶",
             "{} 的 客服 電話 幾號", "我 明天 到 {}", "{} 下雨 了", "我 的 帳戶 是 在 {} 開 的", "{} 的 匯款 要 多久")
RIGHT = ("我 想 查詢 信用卡 帳單", "請 幫 我 轉接 客服", "我 要 辦理 掛失", "這 個 月 的 利息 是 多少",
         "我 想 申請 貸款", "今天 的 匯率 是 多少", "我 忘記 網路 銀行 的 密碼", "信用卡 的 額度 可以 調高 嗎")


def _rows(top1_alone: bool) -> list[Labelled]:
    """Lists whose transcribers write 臺 where the recogniser writes 台, and lists whose TOP1 is right."""
    rows = []
    for t, template in enumerate(TEMPLATES):
        for place in PLACES:
            top1 = template.format(place)
            others = () if top1_alone else (top1.replace("我", "哦"), top1.replace("在", "再"))
            rows.append((top1.replace(" ", "").replace("台", "臺"), (top1, *others), f"c{t}{place}"))
    for k, sentence in enumerate(RIGHT * 2):
        others = () if top1_alone else (sentence.replace("我", "哦"),)
        rows.append((sentence.replace(" ", ""), (sentence, *others), f"r{k}"))
    return [Labelled(name, truth, NBest(hyps)) for truth, hyps, name in rows]


def _adapt(tmp_path: Path, top1_alone: bool) -> tuple[Path, str]:
    data = tmp_path / "labelled.jsonl"
    write_labelled(_rows(top1_alone), data)
    out = tmp_path / "adapted"
    code = main(["--data", str(data), "--out", str(out), "--epochs", "1", "--dev-share", "0.4", "--test-share",
                 "0.2", "--prior-lists", "5", "--batch-size", "8", "--ckpt-dir", str(tmp_path / "ckpt"),
                 "--device", "cpu"])
    assert code == 0
    return out, data


@pytest.mark.parametrize("top1_alone", [False, True], ids=["nbest", "top1-alone"])
def test_adapt_writes_a_complete_folder_that_applies_the_files_convention(tmp_path, capsys, top1_alone):
    out, data = _adapt(tmp_path, top1_alone)
    printed = capsys.readouterr().out

    assert "split by id (seed 7)" in printed and "## held-out test split" in printed
    assert "| answer_cer |" in printed and "shipped | adapted" in printed
    assert printed.rstrip().splitlines()[-1] == swap_command(out)  # it ends with the command that swaps it in
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    provenance = meta["adaptation"]["provenance"]
    assert provenance["data"][0]["rows"] == len(_rows(top1_alone))
    assert len(provenance["data"][0]["sha256"]) == 64
    assert sum(provenance["split"][k] for k in ("train", "dev", "test")) == len(_rows(top1_alone))
    assert {"full", "lm"} <= set(meta["rerank"])
    assert {c["source"] + c["target"] for c in provenance["conventions"]} >= {"台臺"}
    check_weights(Config.from_env({"WEIGHTS_DIR": str(out)}))  # the folder passes the start-up check

    corrector = Corrector(out, device="cpu")
    corrector.setup()
    assert corrector.adaptation is not None and corrector.adaptation.conventions.allows("台", "臺")
    # a sentence never seen in the file: the convention applies to it; a right TOP1 stays as it is
    answers = corrector.predict_batch([NBest(("台中 的 分行 幾點 開",)), NBest(("我 想 申請 貸款",))])
    assert answers == ["臺中的分行幾點開", "我想申請貸款"]


def test_shipped_model_keeps_variant_forms_the_adapted_one_learned(tmp_path):
    """The shipped rule (never bring in a variant form) stays the default: only an adapted folder gives way."""
    shipped = Corrector(device="cpu")
    shipped.setup()
    assert shipped.predict_batch([NBest(("台中 的 分行 幾點 開",))]) == ["台中的分行幾點開"]


def test_adapt_builds_a_domain_lm_the_second_stage_uses(tmp_path):
    out, _ = _adapt(tmp_path, top1_alone=False)
    domain = DomainLM(out / DOMAIN_LM_FILE)
    assert domain.score("我住在臺北") > domain.score("我住在台北")  # the truths' form is the domain's
    corrector = Corrector(out, device="cpu")
    corrector.setup()
    example = corrector.featurizer.featurize(NBest(("我 住 在 台北",)))
    reranker = corrector.reranker
    cands = reranker.candidates(example, None)
    feats = dict(zip((c.text for c in cands), reranker.features(example, None, cands), strict=True))
    assert feats["我住在臺北"].domain > 0 and feats["我住在臺北"].confusion > 0
    assert reranker.weights.domain >= 0 and reranker.weights.confusion > 0


def _deep_truth_rows() -> list[Labelled]:
    """Lists whose truth is the third hypothesis and TOP1 and the second hypothesis other places: the trigram cannot
    tell the places apart, the ranks favour the wrong ones, and each place is written wrong as often as right."""
    rows = []
    for t, template in enumerate(TEMPLATES):
        for p, place in enumerate(PLACES):
            top1, second = (template.format(PLACES[(p + d) % len(PLACES)]) for d in (1, 2))
            truth = template.format(place)
            rows.append(Labelled(f"d{t}{p}", truth.replace(" ", ""), NBest((top1, second, truth))))
    return rows


class OracleMaskedLM:
    """A masked LM that knows the test file's truths: a candidate's gain is how many errors it takes off TOP1's."""

    def __init__(self, folder: Path, device: object, cpu_precision: str = "int8") -> None:
        self.folder = folder
        self.truths = {han_chars(it.nbest.top1): han_chars(it.truth) for it in _deep_truth_rows()}

    def gains(self, top1s: list[str], choices: list[list[tuple[str, ...]]]) -> list[list[float]]:
        def gain(top1: str, choice: tuple[str, ...]) -> float:
            truth = self.truths.get(top1, top1)  # a list of another file (the warm-up's): no preference
            return float(Levenshtein.distance(top1, truth) - Levenshtein.distance("".join(choice), truth))

        return [[gain(top1, c) for c in cands] for top1, cands in zip(top1s, choices, strict=True)]

    def describe(self) -> dict[str, str]:
        return {"path": str(self.folder)}


def test_adapt_with_a_masked_lm_that_helps_weighs_it_and_the_folder_serves_only_with_that_model(
        tmp_path, monkeypatch, capsys):
    from learn import adapt
    from tests.model.tiny_mlm import tiny_masked_lm

    mlm = tiny_masked_lm(tmp_path / "mlm")  # served at the test split and after: a random model, as a team's might be
    monkeypatch.setattr(adapt, "MaskedLM", OracleMaskedLM)  # what the stage is fitted with: one that helps
    monkeypatch.setattr("model.corrector.MaskedLM", OracleMaskedLM)  # and what answers the test split
    data = tmp_path / "labelled.jsonl"
    write_labelled(_deep_truth_rows(), data)
    out = tmp_path / "adapted"
    assert main(["--data", str(data), "--out", str(out), "--epochs", "0", "--dev-share", "0.4", "--test-share", "0.2",
                 "--device", "cpu", "--mlm-dir", str(mlm)]) == 0
    assert "the masked LM weighed (2-fold CER" in capsys.readouterr().out
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert meta["rerank"]["full"]["weights"]["mlm"] > 0
    assert meta["masked_lm"] == {"path": str(mlm.resolve()), "file": "model.safetensors",
                                 "sha256": sha256(mlm / "model.safetensors")}
    with pytest.raises(ConfigError, match="^mlm_dir: .* set MLM_DIR to that folder"):
        check_weights(Config.from_env({"WEIGHTS_DIR": str(out)}))
    check_weights(Config.from_env({"WEIGHTS_DIR": str(out), "MLM_DIR": str(mlm)}))


def test_adapt_with_a_masked_lm_that_does_not_help_writes_a_folder_that_needs_none(tmp_path, capsys):
    from tests.model.tiny_mlm import tiny_masked_lm

    mlm = tiny_masked_lm(tmp_path / "mlm")
    data = tmp_path / "labelled.jsonl"
    write_labelled(_rows(top1_alone=True), data)
    out = tmp_path / "adapted"
    assert main(["--data", str(data), "--out", str(out), "--epochs", "0", "--dev-share", "0.4", "--test-share", "0.2",
                 "--device", "cpu", "--mlm-dir", str(mlm)]) == 0
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    if meta["rerank"]["full"]["weights"].get("mlm"):
        pytest.fail(f"a random masked LM was weighed: {meta['rerank']['full']['dev']['masked_lm']}")
    assert "masked_lm" not in meta and "the masked LM not weighed" in capsys.readouterr().out
    check_weights(Config.from_env({"WEIGHTS_DIR": str(out)}))  # served without MLM_DIR


def test_adapt_refuses_a_masked_lm_folder_that_is_none_in_one_line_writing_nothing(tmp_path, capsys):
    data = tmp_path / "labelled.jsonl"
    write_labelled(_rows(top1_alone=True), data)
    assert main(["--data", str(data), "--out", str(tmp_path / "out"), "--mlm-dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("adapt: --mlm-dir: ") and "is not a folder" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.building-*"))


def test_sigterm_to_make_adapt_leaves_no_building_folder_and_says_so_in_one_line(tmp_path):
    """What `timeout`, `docker stop` and a CI cancel send reaches the run through make and unwinds it as Ctrl-C."""
    data = tmp_path / "labelled.jsonl"
    write_labelled(_rows(top1_alone=False), data)
    out = tmp_path / "adapted"
    make = subprocess.Popen(["make", "--no-print-directory", "-o", ".venv/.installed", "-o", ".venv/.installed-dev",
                             "adapt", f"DATA={data}", f"OUT={out}"], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".adapted.building-*")) and time.monotonic() < deadline and make.poll() is None:
        time.sleep(0.05)
    assert list(tmp_path.glob(".adapted.building-*")), "the run never started building its folder"
    os.kill(make.pid, signal.SIGTERM)  # make alone, as `timeout` does: make passes it on to its recipe
    _, err = make.communicate(timeout=120)

    assert make.returncode != 0
    assert not list(tmp_path.glob(".adapted.building-*")) and not out.exists()
    said = [line for line in err.splitlines() if line.startswith("adapt: ")]
    assert said == [f"adapt: terminated (SIGTERM); {out} was not written and nothing of the run is left beside it"]
    assert "Traceback" not in err


def test_adapt_names_and_counts_malformed_rows(tmp_path, capsys):
    data = tmp_path / "labelled.jsonl"
    write_labelled(_rows(top1_alone=False), data)
    with data.open("a", encoding="utf-8") as f:
        f.write('{"id": "bad1", "sentence_list": ["我 要 去"]}\n')  # no truth
        f.write("not json\n")
    out = tmp_path / "adapted"
    assert main(["--data", str(data), "--out", str(out), "--epochs", "0", "--dev-share", "0.4"]) == 0
    printed = capsys.readouterr().out
    assert f"{data}: {len(_rows(False))} rows read, 2 malformed" in printed
    assert "malformed: " in printed and "(id 'bad1'): ground_truth_sentence" in printed
    assert "not valid JSON" in printed


def test_the_swap_command_points_the_current_link_beside_the_folder_at_it(tmp_path):
    (tmp_path / "run 1").mkdir()
    (tmp_path / "run 2").mkdir()
    (tmp_path / "current").symlink_to(tmp_path / "run 1")

    subprocess.run(["sh", "-c", swap_command(tmp_path / "run 2")], check=True)

    assert (tmp_path / "current").resolve() == tmp_path / "run 2"


def test_adapt_stops_in_one_line_on_a_file_without_rows(tmp_path, capsys):
    data = tmp_path / "empty.jsonl"
    data.write_text("\n", encoding="utf-8")
    assert main(["--data", str(data), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("adapt: ") and "no rows" in err


def test_an_incomplete_adapted_folder_stops_start_up_in_one_line(tmp_path):
    out, _ = _adapt(tmp_path, top1_alone=True)
    (out / DOMAIN_LM_FILE).unlink()
    with pytest.raises(ConfigError, match="incomplete adapted folder: its domain_lm file 'domain_lm.arpa' is missing"):
        check_weights(Config.from_env({"WEIGHTS_DIR": str(out)}))
    command = [str(Path(sys.executable).parent / "gunicorn"), "-c", "server/gunicorn_conf.py", "api:create_app()"]
    run = subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "PORT": "0", "WEIGHTS_DIR": str(out)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "incomplete adapted folder" in run.stderr


def test_an_adapted_folder_with_another_runs_part_is_refused(tmp_path):
    out, _ = _adapt(tmp_path, top1_alone=True)
    with (out / "confusions.json").open("a", encoding="utf-8") as f:
        f.write(" ")
    with pytest.raises(ConfigError, match="inconsistent: confusions.json is not the confusions"):
        check_weights(Config.from_env({"WEIGHTS_DIR": str(out)}))


@pytest.mark.live
def test_an_adapted_folder_is_served_by_make_runs_gunicorn(tmp_path):
    out, _ = _adapt(tmp_path, top1_alone=False)
    port = free_port()
    with gunicorn("api:create_app()", port, tmp_path / "server.log", {"WEIGHTS_DIR": str(out)}):
        body = {"esun_uuid": "adapted-1", "esun_timestamp": 1, "retry": 2, "sentence_list": ["台中 的 分行 幾點 開"],
                "phoneme_sequence_list": []}
        answer = requests.post(f"http://127.0.0.1:{port}/inference", json=body, timeout=2)
        info = requests.get(f"http://127.0.0.1:{port}/", timeout=2).json()
    assert answer.status_code == 200 and answer.json()["answer"] == "臺中的分行幾點開"
    assert json.dumps(info, ensure_ascii=False).count("adapted") >= 1


# A run that cannot finish writes nothing; a run that finishes writes one whole folder (issue 30).


def _quick(data: Path, out: Path, *extra: str) -> int:
    return main(["--data", str(data), "--out", str(out), "--epochs", "0", "--dev-share", "0.4", "--test-share",
                 "0.2", "--folds", "2", "--device", "cpu", *extra])


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_a_file_too_small_to_learn_from_is_refused_up_front_naming_the_minimum(tmp_path, capsys):
    data = tmp_path / "five.jsonl"
    write_labelled(_rows(top1_alone=True)[:5], data)
    assert _quick(data, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"5 labelled lists read: adapt needs at least {MIN_LISTS}" in err
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_a_run_that_fails_midway_leaves_no_folder_and_no_partial_one(tmp_path, monkeypatch, capsys):
    data = tmp_path / "labelled.jsonl"
    write_labelled(_rows(top1_alone=True), data)

    def fail(*args, **kwargs):
        raise AdaptationError("the test split could not be scored")

    monkeypatch.setattr("learn.adapt.test_figures", fail)
    assert _quick(data, tmp_path / "out") == 2
    assert "adapt: the test split could not be scored" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_a_rerun_replaces_the_folder_whole_and_keeps_no_checkpoint(tmp_path, capsys):
    rows = _rows(top1_alone=True)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    write_labelled(rows, first)
    write_labelled(rows[:-3], second)
    out = tmp_path / "out"
    ckpt = tmp_path / "ckpt"
    assert main(["--data", str(first), "--out", str(out), "--epochs", "1", "--batch-size", "8", "--dev-share", "0.4",
                 "--test-share", "0.2", "--folds", "2", "--device", "cpu", "--ckpt-dir", str(ckpt)]) == 0
    assert _quick(second, out) == 0
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert meta["adaptation"]["provenance"]["data"][0]["file"] == "second.jsonl"
    assert list(ckpt.iterdir()) == []  # the finished run's checkpoint folder is gone
    assert _leftovers(tmp_path) == [] and not (Path.cwd() / "checkpoints" / "adapt-out").exists()
    check_weights(Config.from_env({"WEIGHTS_DIR": str(out)}))


def test_out_naming_the_weights_it_starts_from_or_a_foreign_folder_is_refused(tmp_path, capsys):
    data = tmp_path / "labelled.jsonl"
    write_labelled(_rows(top1_alone=True), data)
    shipped = Corrector().weights_dir
    before = {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()}
    assert _quick(data, shipped) == 2
    assert "is the weights it starts from" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()} == before
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8")
    assert _quick(data, foreign) == 2
    assert "holds something other than an adapted weights folder" in capsys.readouterr().err
    assert [p.name for p in foreign.iterdir()] == ["cat.jpg"]


def test_the_folder_is_readable_by_others_and_reports_the_candidates_ceiling(tmp_path, capsys):
    data = tmp_path / "labelled.jsonl"
    rows = _rows(top1_alone=False)
    rows[0] = Labelled(rows[0].id, rows[0].truth, NBest(tuple(f"{rows[0].nbest.top1} {k}" if k else rows[0].nbest.top1
                                                               for k in range(20))))
    write_labelled(rows, data)
    old = os.umask(0o022)
    try:
        assert _quick(data, tmp_path / "out") == 0
    finally:
        os.umask(old)
    printed = capsys.readouterr().out
    assert "1 rows hold more than 10 hypotheses: the first 10 are used" in printed
    assert "| candidates_cer |" in printed and "| candidates_gap_closed |" in printed
    assert "than the shipped model's (" in printed and "relative CER" not in printed
    assert f"6/6 the rules and the domain language model the folder serves, from all {len(rows)} lists" in printed
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    assert set(modes.values()) == {0o644} and (tmp_path / "out").stat().st_mode & 0o777 == 0o755
    meta = json.loads((tmp_path / "out" / "config.json").read_text(encoding="utf-8"))
    assert meta["adaptation"]["provenance"]["domain_lm"]["lists"] == len(rows)


def test_data_names_are_split_as_a_shell_would_unless_the_value_names_a_file(tmp_path):
    spaced = tmp_path / "my lists.json"
    spaced.write_text("[]", encoding="utf-8")
    assert data_paths([str(spaced)]) == [spaced]
    assert data_paths([f"'{spaced}' b.jsonl"]) == [spaced, Path("b.jsonl")]
    assert data_paths(["a.jsonl b.jsonl", "c.jsonl"]) == [Path("a.jsonl"), Path("b.jsonl"), Path("c.jsonl")]


def test_an_adapted_folder_without_provenance_is_refused_as_unfinished(tmp_path):
    out, _ = _adapt(tmp_path, top1_alone=True)
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    del meta["adaptation"]["provenance"]
    (out / "config.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ConfigError, match="unfinished adapted folder"):
        check_weights(Config.from_env({"WEIGHTS_DIR": str(out)}))


def test_a_checkpoint_folder_is_named_by_the_datas_content_and_the_settings_not_by_paths(tmp_path):
    """An edited file, or other settings, never resume another run's training; the same bytes elsewhere do."""
    args = parse_args(["--data", "x.jsonl", "--out", str(tmp_path / "a" / "w")])
    files = [{"sha256": "1" * 64}]
    key = run_key(args, files)
    assert run_key(parse_args(["--data", "y.jsonl", "--out", str(tmp_path / "b" / "w")]), files) == key
    assert run_key(args, [{"sha256": "2" * 64}]) != key
    assert run_key(parse_args(["--data", "x.jsonl", "--out", "w", "--epochs", "2"]), files) != key


# Never serve worse than shipped; refuse a dangling OUT up front (issue 39).


def test_a_file_where_the_stage_cannot_win_is_served_by_the_shipped_stage_and_says_so(tmp_path, capsys):
    """Every TOP1 is right: no adapted stage can beat the shipped one on the test split, so the folder serves the
    shipped model (no rule acts), and the table still shows shipped, adapted and the memo."""
    data = tmp_path / "right.jsonl"
    rows = [Labelled(f"r{k}", sentence.replace(" ", ""), NBest((sentence,)))
            for k, sentence in enumerate([t.format(p) for t in TEMPLATES for p in PLACES] + list(RIGHT))]
    write_labelled(rows, data)
    out = tmp_path / "out"
    assert _quick(data, out) == 0
    printed = capsys.readouterr().out
    assert "does not beat the shipped one on the test split: the folder serves the shipped model" in printed
    assert "| metric | shipped | adapted | memo (margin 0) | memo (margin 2) |" in printed
    meta = json.loads((out / "config.json").read_text(encoding="utf-8"))
    shipped = json.loads((Corrector().weights_dir / "config.json").read_text(encoding="utf-8"))
    assert meta["adaptation"]["provenance"]["served"] == "shipped" and meta["rerank"] == shipped["rerank"]
    assert json.loads((out / "confusions.json").read_text(encoding="utf-8"))["trust_floor"] > 1
    check_weights(Config.from_env({"WEIGHTS_DIR": str(out)}))


def test_out_naming_a_dangling_symlink_is_refused_before_anything_is_read(tmp_path, capsys):
    data = tmp_path / "labelled.jsonl"
    write_labelled(_rows(top1_alone=True), data)
    link = tmp_path / "w"
    link.symlink_to(tmp_path / "nowhere" / "w")
    assert _quick(data, link) == 2
    err = capsys.readouterr().err
    assert "is a symbolic link to" in err and "which does not exist" in err and "rows read" not in err
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()
