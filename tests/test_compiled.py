"""compiled.py: the hot modules compiled to C are used only while current, a failed build leaves the last one whole,
and where a C compiler is installed (CI, `make test`) every listed module runs compiled and answers as interpreted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import compiled
from config import REPO_ROOT


def _fake_build(tmp_path, sources: dict[str, str]):
    """A build folder whose manifest records these digests (no compiled module in it: the path test needs none)."""
    build = tmp_path / ".compiled"
    for package in compiled.MODULES:
        (build / package).mkdir(parents=True)
    manifest = {"abi": sys.implementation.cache_tag, "sources": sources}
    (build / compiled.MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    return build


def _digests() -> dict[str, str]:
    """The manifest of a build of the sources as they are: the modules' `.py` and the kernels' `.pyx`."""
    return {name: compiled._digest(path) for name, path in compiled._sources().items()}


def test_a_current_build_goes_first_on_the_packages_path(tmp_path, monkeypatch):
    monkeypatch.delenv(compiled.OFF, raising=False)
    build = _fake_build(tmp_path, _digests())
    path = [str(REPO_ROOT / "model")]
    assert compiled.stale(build) == []
    assert compiled.extend("model", path, build) is True
    assert path == [str(build / "model"), str(REPO_ROOT / "model")]


def test_a_module_edited_since_the_build_runs_interpreted_with_the_rest_of_its_package(tmp_path, monkeypatch):
    monkeypatch.delenv(compiled.OFF, raising=False)
    build = _fake_build(tmp_path, {**_digests(), "model/lm.py": "0" * 64})
    model_path, preprocess_path = ["model"], ["preprocess"]
    assert compiled.stale(build) == ["model/lm.py"]
    assert compiled.extend("model", model_path, build) is False and model_path == ["model"]
    assert compiled.extend("preprocess", preprocess_path, build) is True  # its own modules are current


def test_a_kernel_edited_since_the_build_leaves_its_package_to_the_python_reference(tmp_path, monkeypatch):
    monkeypatch.delenv(compiled.OFF, raising=False)
    build = _fake_build(tmp_path, {**_digests(), "model/segmenter.pyx": "0" * 64})
    model_path = ["model"]
    assert compiled.stale(build) == ["model/segmenter.pyx"]
    assert compiled.extend("model", model_path, build) is False and model_path == ["model"]


def test_a_build_for_another_python_is_stale_whole(tmp_path):
    build = _fake_build(tmp_path, _digests())
    manifest = json.loads((build / compiled.MANIFEST).read_text(encoding="utf-8"))
    (build / compiled.MANIFEST).write_text(json.dumps({**manifest, "abi": "cpython-399"}), encoding="utf-8")
    assert compiled.stale(build) == sorted(_digests())


def test_the_switch_runs_everything_interpreted(tmp_path, monkeypatch):
    monkeypatch.setenv(compiled.OFF, "1")
    path = ["model"]
    assert compiled.extend("model", path, _fake_build(tmp_path, _digests())) is False and path == ["model"]


def test_a_failed_build_leaves_the_last_one_whole_and_no_folder_behind(tmp_path, monkeypatch):
    build = _fake_build(tmp_path, _digests())
    before = sorted(p.relative_to(build) for p in build.rglob("*"))

    def fails(*args, **kwargs):
        raise subprocess.CalledProcessError(1, args[0], stderr="lm.c:1: error: Python.h: No such file or directory")

    monkeypatch.setattr(compiled.subprocess, "run", fails)
    with pytest.raises(subprocess.CalledProcessError):
        compiled.build(build)
    assert sorted(p.relative_to(build) for p in build.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir()] == [".compiled"]


def test_without_a_c_compiler_the_command_says_the_model_runs_interpreted(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compiled, "BUILD_DIR", tmp_path / ".compiled")
    monkeypatch.setenv("CC", "no-such-compiler")
    assert compiled.main() == 0
    assert capsys.readouterr().out == ("compiled: no C or C++ compiler (no-such-compiler): the model runs interpreted,"
                                       " slower (apt-get install gcc g++)\n")
    assert not (tmp_path / ".compiled").exists()


needs_a_compiler = pytest.mark.skipif(any(shutil.which(name) is None for name in compiled._compilers()),
                                      reason="no C or C++ compiler: the model runs interpreted here")


def _child(code: str, interpreted: bool) -> str:
    env = {**os.environ, compiled.OFF: "1" if interpreted else "0"}
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


@needs_a_compiler
def test_where_a_c_compiler_is_installed_make_leaves_every_listed_module_compiled_and_in_use():
    assert compiled.stale() == [], "run `make install-dev` (or `python -m compiled`): the build is out of date"
    used = json.loads(_child("import compiled, json; print(json.dumps(compiled.used()))", interpreted=False))
    assert used and all(used.values()), used
    off = json.loads(_child("import compiled, json; print(json.dumps(compiled.used()))", interpreted=True))
    assert not any(off.values()), off


ANSWER = """
import json
from model.corrector import Corrector
from preprocess.text import NBest
from testing.samples import request_bodies
lists = [NBest(tuple(b["sentence_list"]), tuple(b.get("phoneme_sequence_list") or ())) for b in request_bodies(256)]
corrector = Corrector(device="cpu")
corrector.setup()
print(json.dumps([a for s in range(0, len(lists), 64) for a in corrector.predict_batch(lists[s:s + 64])]))
"""


@pytest.mark.real_model
@needs_a_compiler
def test_the_compiled_modules_answer_every_list_as_the_interpreted_ones():
    compiled_answers = json.loads(_child(ANSWER, interpreted=False))
    assert len(compiled_answers) == 256
    assert compiled_answers == json.loads(_child(ANSWER, interpreted=True))
