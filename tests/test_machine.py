"""machine: what the machine can give the service, asked at its start (memory for the workers, CUDA for cuda).

check_device's child process is tested in tests/server/test_master_device.py.
"""

from __future__ import annotations

import pytest

from config import Config, ConfigError


def test_available_memory_is_the_smaller_of_the_machines_and_the_cgroups(tmp_path):
    from machine import available_memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert available_memory(meminfo, cgroup) == 20000000 * 1024  # no cgroup files: the machine's
    (cgroup / "memory.max").write_text("max\n")
    assert available_memory(meminfo, cgroup) == 20000000 * 1024
    (cgroup / "memory.max").write_text(f"{4 << 30}\n")  # a container limited to 4 GiB, 1 GiB of it used
    (cgroup / "memory.current").write_text(f"{1 << 30}\n")
    assert available_memory(meminfo, cgroup) == 3 << 30
    assert available_memory(tmp_path / "none", tmp_path / "none") is None


@pytest.mark.parametrize(("settings", "fits"), [({"web_workers": 8}, 8), ({"web_workers": 9}, None),
                                                ({"web_workers": 2, "batcher_workers": 4}, 8),
                                                ({"web_workers": 3, "batcher_workers": 4}, None)])
def test_workers_the_memory_cannot_hold_are_refused_naming_what_fits(settings, fits):
    from machine import MASTER_BYTES, MODEL_PROCESS_BYTES, check_workers

    available = MASTER_BYTES + 8 * MODEL_PROCESS_BYTES + 1
    config = Config(**settings)
    if fits:
        assert check_workers(config, available=available, cores=64) is None
    else:
        with pytest.raises(ConfigError, match=rf"web_workers={config.workers} needs about .* at most \d+ fit"):
            check_workers(config, available=available, cores=64)


def test_more_workers_than_cores_is_a_warning_and_an_unknown_memory_refuses_nothing():
    from machine import check_workers

    assert check_workers(Config(web_workers=3), available=None, cores=2) == (
        "web_workers=3 is more than the 2 usable cores: the workers take turns on them (one per core or fewer serves "
        "more, docs/deploy.md)")
    assert check_workers(Config(web_workers=2), available=None, cores=2) is None
