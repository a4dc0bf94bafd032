"""server.kept_alive: gthread's idle connections in timeout order, each operation gthread uses on its deque."""

from __future__ import annotations

import inspect
import re
from collections import deque

import pytest
from gunicorn.workers import gthread

from server.kept_alive import KeptAlive


class Conn:
    """A connection as gthread's deque sees it: any hashable object."""


def test_it_answers_every_operation_as_gthread_s_deque_does():
    conns = [Conn() for _ in range(5)]
    kept, reference = KeptAlive(), deque()
    for conn in conns:
        kept.append(conn)
        reference.append(conn)
    kept.remove(conns[2])
    reference.remove(conns[2])
    assert list(kept) == list(reference) and len(kept) == len(reference) == 4
    assert kept[0] is reference[0] is conns[0]
    assert kept.popleft() is reference.popleft() is conns[0]
    assert kept[0] is conns[1] and bool(kept)
    for conn in list(kept):
        kept.remove(conn)
    assert not kept and len(kept) == 0


def test_a_missing_connection_or_an_empty_set_fails_as_a_deque_would():
    kept = KeptAlive()
    with pytest.raises(ValueError):
        kept.remove(Conn())
    with pytest.raises(IndexError):
        kept.popleft()
    with pytest.raises(IndexError):
        kept[0]


def test_a_connection_kept_alive_again_goes_last():
    first, second = Conn(), Conn()
    kept = KeptAlive()
    kept.append(first)
    kept.append(second)
    kept.append(first)
    assert list(kept) == [second, first]


def test_gthread_uses_no_operation_on_its_idle_connections_that_kept_alive_lacks():
    source = inspect.getsource(gthread)
    used = set(re.findall(r"self\.keepalived_conns\.(\w+)", source))
    assert used == {"append", "remove", "popleft"}
    indexed = set(re.findall(r"self\.keepalived_conns\[([^\]]*)\]", source))
    assert indexed == {"0"}
    assert "self.keepalived_conns = deque()" in source  # what ReadingThreadWorker.init_process replaces
