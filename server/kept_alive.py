"""gthread's idle kept-alive connections, held in an ordered set instead of its deque.

gthread keeps the connections waiting for a next request in `keepalived_conns`, a deque in timeout order, and takes one
out with `deque.remove` each time it turns readable: a scan of every idle connection. Under open-loop overload
thousands wait at once; at 5,000 requests/s that scan was the event loop's largest single cost (14 % of its time
holding the GIL, py-spy, docs/benchmarks.md, issue 31). This keeps the deque's order and the operations gthread uses on
it (gunicorn 27.0.1: `append`, `remove`, `popleft`, `[0]`, `len`, iteration), each in O(1).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any


class KeptAlive:
    """Connections in the order they were kept alive (their timeouts' order), removable in O(1)."""

    def __init__(self) -> None:
        self._conns: OrderedDict[Any, None] = OrderedDict()

    def append(self, conn: Any) -> None:
        self._conns[conn] = None
        self._conns.move_to_end(conn)

    def remove(self, conn: Any) -> None:
        """Take `conn` out; ValueError if it is not here, as a deque's."""
        try:
            del self._conns[conn]
        except KeyError:
            raise ValueError("the connection is not kept alive") from None

    def popleft(self) -> Any:
        """Take out the connection kept alive longest (the first to time out); IndexError if none, as a deque's."""
        if not self._conns:
            raise IndexError("no connection is kept alive")
        return self._conns.popitem(last=False)[0]

    def __getitem__(self, index: int) -> Any:
        """Only `[0]`, the first to time out: gthread reads no other."""
        if index != 0 or not self._conns:
            raise IndexError(index)
        return next(iter(self._conns))

    def __len__(self) -> int:
        return len(self._conns)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._conns)
