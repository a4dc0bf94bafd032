"""learn.written: a command says what it wrote over and how to undo it; provenance records no machine's paths."""

from __future__ import annotations

from pathlib import Path

from learn.written import PROJECT_ROOT, portable, wrote


def test_wrote_says_how_to_get_back_a_committed_file_it_wrote_over():
    """`make tune` rewrote the shipped model/weights/config.json and printed no path (issue 41)."""
    line = wrote(PROJECT_ROOT / "model" / "weights" / "config.json")

    assert line.endswith("over the committed version: `git checkout -- model/weights/config.json` puts it back")
    assert "`git checkout -- docs/bench` puts it back" in wrote(PROJECT_ROOT / "docs" / "bench")


def test_wrote_names_a_file_of_the_users_own_in_full(tmp_path):
    assert wrote(tmp_path / "config.json") == f"wrote {tmp_path / 'config.json'}"


def test_portable_records_no_absolute_path():
    """config.json's provenance stored the machine's absolute init_from path (issue 41)."""
    assert portable(PROJECT_ROOT / "model" / "weights") == "model/weights"
    assert portable(Path("/home/someone/train_all.json")) == "train_all.json"
    assert portable((Path("/a/x.json"), Path("/b/y.json"))) == "x.json, y.json"
    assert portable(0.5) == "0.5"
