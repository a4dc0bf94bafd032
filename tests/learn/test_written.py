"""learn.written: a command says what it wrote over and how to undo it."""

from __future__ import annotations

from learn.written import PROJECT_ROOT, wrote


def test_wrote_says_how_to_get_back_a_committed_file_it_wrote_over():
    """`make tune` rewrote the shipped model/weights/config.json and printed no path (issue 41)."""
    line = wrote(PROJECT_ROOT / "model" / "weights" / "config.json")

    assert line.endswith("over the committed version: `git checkout -- model/weights/config.json` puts it back")
    assert "`git checkout -- docs/bench` puts it back" in wrote(PROJECT_ROOT / "docs" / "bench")


def test_wrote_names_a_file_of_the_users_own_in_full(tmp_path):
    assert wrote(tmp_path / "config.json") == f"wrote {tmp_path / 'config.json'}"
