"""Give the C heap's free memory back to the system between batches: glibc's ``malloc_trim(0)``, at most once every
``TRIM_EVERY_S``.

A batch allocates its tensors, arrays and candidate lists on several threads (the batch thread, torch's intra-op
threads), and glibc keeps what they free in its arenas, returning only what sits at the top of each heap. Under load
each arena's retained memory ratchets up to the biggest batches it has seen: in the hour's soak (issue 40) a worker
serving a fixed set of 1,000 lists grew from 864 to 930 MiB over its first 17 minutes and only then stayed flat.
Measured in a process that had run the shipped corrector on those lists, ``malloc_trim(0)`` gave back 100-235 MiB
and took 9-22 ms; the next batches fault back in what they use. So the batch workers (``batching.threaded_worker``,
``batching.process_worker``) call `HeapTrimmer.after_batch` after each batch: once in 30 s, that is at most one
batch in ~1,000 waiting up to ~20 ms longer.

Where the C library has no ``malloc_trim`` (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

__all__ = ["TRIM_EVERY_S", "HeapTrimmer", "malloc_trim"]

TRIM_EVERY_S = 30.0


def _libc_malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0) as a function of no arguments, or None where the process's C library has none."""
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return lambda: function(0)


malloc_trim = _libc_malloc_trim()


class HeapTrimmer:
    """Trim the heap after a batch when the last trim is at least `every_s` old (the first batch trims)."""

    def __init__(self, every_s: float | None = None, trim: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s = TRIM_EVERY_S if every_s is None else every_s
        self._trim = trim or malloc_trim
        self._clock = clock
        self._last = float("-inf")
        self.trims = 0

    def after_batch(self) -> None:
        """Trim now if due; never raises (a failed trim only leaves the memory where it was)."""
        if self._trim is None:
            return
        now = self._clock()
        if now - self._last < self._every_s:
            return
        self._last = now
        try:
            self._trim()
        except Exception:  # noqa: BLE001 - best effort: the batch's answers are already out
            return
        self.trims += 1
