"""docs/configuration.md's settings table agrees with `config.Config`, as README's checks table does with the code."""

from __future__ import annotations

import dataclasses
import re

from config import REPO_ROOT, Config


def test_the_configuration_table_names_every_setting_config_has_and_no_other():
    text = (REPO_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    table = text[text.index("| variable | default | meaning |"):].split("\n\n")[0]
    documented = {name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])}

    assert documented == {f.name.upper() for f in dataclasses.fields(Config)}


def test_the_readme_stays_short_and_links_what_it_moved_out():
    """README.md was 293 lines (issue 41): settings, Docker, GPU and measurements now live in docs/."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")

    assert len(readme.splitlines()) <= 120
    for page in ("docs/configuration.md", "docs/deploy.md", "docs/benchmarks.md", "docs/architecture.md"):
        assert f"({page}" in readme and (REPO_ROOT / page).is_file()
