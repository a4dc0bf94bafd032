"""Each worker process's Prometheus series in the folder the workers share, served together by whichever is scraped.

With several gunicorn workers a scrape reaches whichever worker the kernel hands it: each worker writes its series to
the shared folder once a second (`MetricsSpool`, a thread of its own beside the request path), and the scraped one
serves every live worker's, each sample labelled `worker` (its process id). The app's series themselves are defined
in api.metrics.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

# The name its lines have always had (the spool was part of api.metrics).
log = logging.getLogger("api.metrics")

# How often each worker writes its series to the shared folder, and how old a worker's file may be before it is
# taken for a dead worker's (a worker killed with SIGKILL never removes its own).
SPOOL_EVERY_S = 1.0
SPOOL_STALE_S = 10.0


class MetricsSpool:
    """Each worker process's series in a folder they share (one file per process id, rewritten whole every
    `SPOOL_EVERY_S` and at each scrape), served together by whichever worker is scraped, labelled `worker`: the
    scraped worker's as they are now, the others' as they were at most `SPOOL_EVERY_S` ago.

    The writer thread starts with the first `render` or `start` (an app built before a fork starts it in the process
    that serves). A file older than `SPOOL_STALE_S` is a dead worker's: it is left out and removed.
    """

    def __init__(self, folder: Path, registry: CollectorRegistry) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._registry = registry
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._writing = threading.Lock()  # the spool thread and a scrape write the same file

    @property
    def own_file(self) -> Path:
        return self.folder / f"{os.getpid()}.prom"

    def start(self) -> None:
        """Start writing this process's series every SPOOL_EVERY_S (once per process)."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="metrics-spool", daemon=True)
        self._thread.start()

    def write(self) -> bytes:
        """Write this process's series to its file (whole: a temporary file, then renamed) and return them."""
        own = generate_latest(self._registry)
        with self._writing:
            if self._stop.is_set():  # closed: this worker's series are out of the folder for good
                return own
            partial = self.own_file.with_suffix(".tmp")
            partial.write_bytes(own)
            os.replace(partial, self.own_file)
        return own

    def render(self) -> bytes:
        """Every live worker's series, each sample labelled with its worker's process id."""
        self.start()
        texts = {str(os.getpid()): self.write().decode()}
        now = time.time()
        for path in self.folder.glob("*.prom"):
            if path.stem in texts:
                continue
            try:
                if now - path.stat().st_mtime > SPOOL_STALE_S:
                    path.unlink(missing_ok=True)
                    continue
                texts[path.stem] = path.read_text(encoding="utf-8")
            except OSError:  # removed by its worker meanwhile
                continue
        return generate_latest(_Families(_labelled(texts)))

    def close(self) -> None:
        with self._writing:
            self._stop.set()
            self.own_file.unlink(missing_ok=True)

    def _run(self) -> None:
        while True:
            try:
                self.write()
            except OSError as exc:  # a full or removed folder: the next scrape shows this worker's series as stale
                log.warning("could not write this worker's metrics for the others",
                            extra={"fields": {"error": str(exc), "folder": str(self.folder)}})
            if self._stop.wait(SPOOL_EVERY_S):
                return


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _labelled(texts: dict[str, str]) -> Iterator[Metric]:
    """Merge workers' expositions into one family per name, every sample labelled with its worker."""
    merged: dict[str, Metric] = {}
    for worker, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type, family.unit))
            into.samples.extend(Sample(s.name, {**s.labels, "worker": worker}, s.value, s.timestamp, s.exemplar)
                                for s in family.samples)
    return iter(merged.values())
