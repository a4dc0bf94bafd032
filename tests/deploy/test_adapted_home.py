"""Where a team's adapted weights folders go: adapted/, which neither git nor the image's build takes in (issue 41)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_an_adapted_folder_in_the_default_home_is_ignored_by_git():
    """`make adapt ... OUT=weights-mine`, as README showed, left a folder git offered to commit."""
    run = subprocess.run(["git", "check-ignore", "-q", "adapted/mine/model.safetensors"], cwd=REPO_ROOT)

    assert run.returncode == 0


def test_an_adapted_folder_is_left_out_of_the_image():
    """`make image` copied every adapted folder in the project root into the image."""
    lines = (REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()

    assert "adapted" in lines


def test_make_adapt_writes_into_adapted_unless_told_otherwise():
    run = subprocess.run(["make", "-n", "-p", "adapt", "DATA=x.json"], cwd=REPO_ROOT, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})

    assert "adapt: OUT = adapted/mine" in run.stdout  # make -p prints the target-specific default it would use
