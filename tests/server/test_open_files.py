"""server.open_files: the worker raises its open-file limit for its connections, or holds fewer connections."""

from __future__ import annotations

import resource

import pytest

from server import open_files
from server.open_files import RESERVED_FILES, fitted_connections


class Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str, *args: object) -> None:
        self.warnings.append(message % args)


def _limits(monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, raises: bool = False) -> list[tuple[int, int]]:
    set_to: list[tuple[int, int]] = []

    def setrlimit(_which: int, limits: tuple[int, int]) -> None:
        if raises:
            raise ValueError("not allowed")
        set_to.append(limits)

    monkeypatch.setattr(open_files.resource, "getrlimit", lambda _which: (soft, hard))
    monkeypatch.setattr(open_files.resource, "setrlimit", setrlimit)
    return set_to


def test_a_limit_that_fits_changes_nothing(monkeypatch):
    set_to = _limits(monkeypatch, soft=65536, hard=65536)
    log = Log()
    assert fitted_connections(4096, 96, log) is None
    assert set_to == [] and log.warnings == []


def test_a_low_soft_limit_is_raised_to_the_hard_one(monkeypatch):
    set_to = _limits(monkeypatch, soft=1024, hard=65536)
    assert fitted_connections(4096, 96, Log()) is None
    assert set_to == [(65536, 65536)]


def test_a_limit_that_cannot_be_raised_lowers_the_connections_with_a_warning(monkeypatch):
    _limits(monkeypatch, soft=1024, hard=1024, raises=True)
    log = Log()
    assert fitted_connections(4096, 96, log) == 1024 - 96 - RESERVED_FILES
    assert len(log.warnings) == 2 and "lowered from 4096" in log.warnings[1]


def test_an_unlimited_soft_limit_changes_nothing(monkeypatch):
    set_to = _limits(monkeypatch, soft=resource.RLIM_INFINITY, hard=resource.RLIM_INFINITY)
    assert fitted_connections(4096, 96, Log()) is None and set_to == []
