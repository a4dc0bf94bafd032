"""Prometheus metrics of one app, served at `/metrics` in the text exposition format.

Each app has its own `CollectorRegistry` (built by `create_app`, kept in `app.extensions[METRICS_KEY]`), so
test apps never share counters. With one gunicorn worker process that registry is the whole picture of a replica.
With several (server/gunicorn_conf.py), a scrape reaches whichever worker the kernel hands it, so each worker also
writes its series to the folder they share once a second (`sidecar.metrics_spool.MetricsSpool`), and `/metrics`
serves every live worker's series, each with a `worker` label (its process id): `sum without (worker) (...)` is the
replica. Prometheus scrapes each replica. The series are listed in deploy/README.md.

Per-batch figures (size, run time, each question's queue wait from submit to the start of its batch) come
through the engine's one hook, `on_batch(BatchReport)` (`observe_batch`): measured by the engine, which keeps
each job's submit time, in the threaded engine as in the process engine.

The cyclic garbage collector's collections and how long they stopped the process, by generation (`GC_PAUSES`, from
`gc.callbacks`): a full collection holds the GIL throughout, so every request of the process waits it out.

The admission's overload control (`api.admission`) is read at each scrape (`watch_admission`): its level, the limit it
puts on model requests in flight, the signals it watches (the least queued time and model wait of its last
interval) and how many requests it answered TOP1 (`shed`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Sized
from pathlib import Path

from flask import Flask, Response, current_app, g, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from api.accept import budget_start
from api.admission import Admission
from api.errors import REFUSAL_CODES
from api.paths import REJECTED, AnswerPath
from batching import BatchReport
from hosting.host import ModelHost
from hosting.interfaces import Engine
from hosting.swap import ModelSwapper
from sidecar import log_writer
from sidecar.log_writer import LogWriter
from sidecar.metrics_spool import MetricsSpool

METRICS_KEY = "asr_correction_metrics"
NAMESPACE = "esun"

CACHE_LEVELS = ("local", "redis", "sqlite")
CACHE_RESULTS = ("hit", "miss", "error", "skipped")
# Around the judge's 1 s timeout and the 0.75 s default budget.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.5, 2.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class GcPauses:
    """The cyclic GC's collections of this process and the time they took, by generation (0, 1, 2).

    Called by the interpreter at the start and the end of every collection (`gc.callbacks`), inside it, wherever an
    allocation triggered it, maybe under any lock: so it takes none (plain counters, changed by one collection at a
    time under the GIL) and allocates little."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        generation = info["generation"]
        self.collections[generation] += 1
        self.seconds[generation] += took
        if took > self.longest[generation]:
            self.longest[generation] = took

    def install(self) -> GcPauses:
        """Start counting (once per process, however many apps are built)."""
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self


GC_PAUSES = GcPauses()


class Metrics:
    """The service's series in their own registry; its methods are what the app's parts report through.

    With `spool_dir` (several worker processes share it), `render` serves every live worker's series (`MetricsSpool`).
    """

    def __init__(self, spool_dir: Path | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.spool = MetricsSpool(spool_dir, self.registry) if spool_dir is not None else None
        r = self.registry
        r.register(_GcCollector(GC_PAUSES.install()))
        r.register(_LogCollector(log_writer.LOG_WRITER))
        self.request_seconds = Histogram(
            "request_duration_seconds", "Time from accept to answer of /inference, by how it was answered.",
            ["path"], namespace=NAMESPACE, buckets=LATENCY_BUCKETS_S, registry=r)
        self.in_flight = Gauge(
            "requests_in_flight", "/inference requests being answered now.", namespace=NAMESPACE, registry=r)
        # Each answer is counted once, by its path, in request_seconds; the fallbacks and the overload control's
        # shed count are read from there at each scrape.
        r.register(_FallbacksCollector(self))
        self.batch_size = Histogram(
            "batch_size", "Questions per call of the corrector.", namespace=NAMESPACE,
            buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.batch_seconds = Histogram(
            "batch_duration_seconds", "Run time of one call of the corrector.", namespace=NAMESPACE,
            buckets=LATENCY_BUCKETS_S, registry=r)
        self.queue_wait_seconds = Histogram(
            "batch_queue_wait_seconds", "Time from a question's submit to the start of its batch (questions "
            "that ran).", namespace=NAMESPACE, buckets=LATENCY_BUCKETS_S, registry=r)
        self.cache_lookups = Counter(
            "cache_lookups", "Answer cache lookups by level (local; the shared level, sqlite or redis) and result "
            "(hit, miss, error, skipped: redis circuit open).", ["level", "result"], namespace=NAMESPACE, registry=r)
        self.redis_circuit_open = Gauge(
            "redis_circuit_open", "1 while the Redis circuit breaker is open (Redis not asked).",
            namespace=NAMESPACE, registry=r)
        # Connections the gunicorn worker's event loop dealt with before any thread (server.worker): slow clients.
        self.reads_timed_out = Counter(
            "request_reads_timed_out", "Connections closed unanswered because their request was not whole within "
            "REQUEST_READ_TIMEOUT_S.", namespace=NAMESPACE, registry=r)
        self.requests_refused = Counter(
            "requests_refused", "Requests answered by gunicorn's event loop before the app, by status (400 "
            "unframeable, 413 body over MAX_BODY_BYTES, 431 head too large, 501 a transfer coding other than "
            "chunked).", ["status"], namespace=NAMESPACE,
            registry=r)
        # Every label value exists from the start, so rates and alerts see zeros instead of missing series; each
        # path's series is looked up here once (`labels` costs a lock and a dict per call).
        self._request_seconds_of = {path: self.request_seconds.labels(path.value) for path in AnswerPath}
        self.request_seconds.labels(REJECTED)
        for status in REFUSAL_CODES:
            self.requests_refused.labels(str(status))
        self._cache_lookups_of = {(level, result): self.cache_lookups.labels(level, result)
                                  for level in CACHE_LEVELS for result in CACHE_RESULTS}

    def observe_request(self, path: AnswerPath, seconds: float) -> None:
        """Record one answered /inference request: its path (the one count of each path's answers) and latency."""
        self._request_seconds_of[path].observe(seconds)

    def answered(self) -> dict[str, float]:
        """The /inference requests answered so far, by path (request_seconds' counts)."""
        counts = dict.fromkeys((path.value for path in AnswerPath), 0.0)
        for family in self.request_seconds.collect():
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    counts[sample.labels["path"]] = sample.value
        return counts

    def observe_batch(self, report: BatchReport) -> None:
        """Record one call of the corrector and each of its questions' wait for it (the engine's on_batch hook)."""
        self.batch_size.observe(report.size)
        self.batch_seconds.observe(report.run_s)
        for seconds in report.queue_wait_s:
            self.queue_wait_seconds.observe(max(0.0, seconds))

    def cache_lookup(self, level: str, result: str) -> None:
        """Count one answer-cache lookup (cache.CacheObserver)."""
        self._cache_lookups_of[level, result].inc()

    def redis_circuit(self, is_open: bool) -> None:
        """Record the Redis circuit breaker's state (cache.CacheObserver)."""
        self.redis_circuit_open.set(1 if is_open else 0)

    def read_timed_out(self) -> None:
        """Count a connection closed because its request was not whole in time (the worker's event loop)."""
        self.reads_timed_out.inc()

    def request_refused(self, status: int) -> None:
        """Count a request the worker's event loop answered itself with an error status."""
        self.requests_refused.labels(str(status)).inc()

    def watch_admission(self, admission: Admission) -> None:
        """Expose the admission's state (its overload control), read at each scrape."""
        self.registry.register(_AdmissionCollector(admission, self))

    def watch_cache(self, local: Sized) -> None:
        """Expose how many answers the process's own cache holds, read at each scrape (testing.soak plots it)."""
        self.registry.register(_CacheCollector(local))

    def watch_engine(self, engine: Engine) -> None:
        """Expose the batching engine's readiness and its replaced workers, read at each scrape."""
        self.registry.register(_EngineCollector(engine))

    def watch_host(self, host: ModelHost) -> None:
        """Expose the host's engine, and the swaps of its watcher and the folder served (when it watches one)."""
        self.watch_engine(host.engine)
        if host.swapper is not None:
            self.registry.register(_SwapCollector(host.swapper))

    def render(self) -> bytes:
        """Return every series in the Prometheus text format: this process's, or every worker's with a spool."""
        if self.spool is not None:
            return self.spool.render()
        return generate_latest(self.registry)

    def close(self) -> None:
        """Stop writing this process's series for the others, and take them out of the shared folder."""
        if self.spool is not None:
            self.spool.close()


class _AdmissionCollector(Collector):
    """The admission's series, from one snapshot of its state per scrape."""

    def __init__(self, admission: Admission, metrics: Metrics) -> None:
        self._admission = admission
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state = self._admission.state()
        yield GaugeMetricFamily(f"{NAMESPACE}_overload_level", "Overload control: 0 normal, 1 model share reduced, "
                                "2 every new arrival answered TOP1 (shed).", value=state.level)
        yield GaugeMetricFamily(f"{NAMESPACE}_overload_model_limit", "Overload control: most /inference requests "
                                "allowed to wait on the model at once (pool_cap when normal).", value=state.limit)
        yield GaugeMetricFamily(f"{NAMESPACE}_overload_model_in_flight", "Questions the batcher admitted and has "
                                "not yet answered (the one count the overload control reads).", value=state.on_model)
        yield GaugeMetricFamily(f"{NAMESPACE}_pool_requests", "Requests in the thread pool (handed on by the worker's "
                                "event loop, not yet answered by the app); at pool_cap the event loop answers "
                                "/inference itself (path pool_full).", value=state.in_pool)
        yield GaugeMetricFamily(f"{NAMESPACE}_pool_cap", "Requests the thread pool takes before the event loop answers "
                                "/inference itself (two batches: 2 x MAX_BATCH_SIZE).", value=self._admission.pool_cap)
        yield GaugeMetricFamily(f"{NAMESPACE}_overload_queued_min_seconds", "A signal of the overload control: the "
                                "least time from accept to view of any request in its last interval.",
                                value=state.queued_min_s)
        yield GaugeMetricFamily(f"{NAMESPACE}_overload_model_wait_min_seconds", "A signal of the overload control: "
                                "the least wait on the model (admission to answer or deadline) of any request "
                                "answered in its last interval.", value=state.model_wait_min_s)
        yield CounterMetricFamily(f"{NAMESPACE}_overload_shed", "Requests answered TOP1 by the overload control "
                                  "(path shed).", value=self._metrics.answered()[AnswerPath.SHED.value])


class _FallbacksCollector(Collector):
    """The answers that are TOP1 instead of the model's, by reason (their path), from the count of each path."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(f"{NAMESPACE}_fallbacks", "Answers that are TOP1 instead of the model's, by "
                                     "reason.", labels=["reason"])
        answered = self._metrics.answered()
        for path in AnswerPath:
            if path.fallback:
                family.add_metric([path.value], answered[path.value])
        yield family


class _CacheCollector(Collector):
    """The local answer cache's size (`len`, under its lock: one scrape's cost, never a request's)."""

    def __init__(self, local: Sized) -> None:
        self._local = local

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(f"{NAMESPACE}_cache_entries", "Answers held in this process's own cache (the local "
                                "level; expired ones count until asked for or pushed out).", value=len(self._local))


# The batching engine's counters (batching.BatcherStats), each an `esun_batcher_<name>_total` series.
BATCHER_COUNTERS = {
    "batches": "Calls of the corrector.",
    "items": "Questions those calls carried.",
    "failures": "Calls that raised or answered the wrong count (their questions answered TOP1, path error).",
    "dropped_expired": "Questions that gave up before their batch started (or, across processes, never answered).",
    "overloaded": "Questions the batcher refused at its bound (path overload).",
    "padded_waste": "Padding the batches carried: over calls, the longest question's length x size - the lengths.",
}


class _EngineCollector(Collector):
    """The batching engine's series: whether every worker is up, dead workers replaced, and its counters."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._engine.stats()
        yield GaugeMetricFamily(f"{NAMESPACE}_batcher_alive", "1 when the batcher runs with every worker ready.",
                                value=float(self._engine.alive()))
        yield CounterMetricFamily(f"{NAMESPACE}_batcher_worker_restarts", "Dead batch workers replaced (for the "
                                  "process engine, each death replaces the whole set).", value=stats.restarts)
        for name, text in BATCHER_COUNTERS.items():
            yield CounterMetricFamily(f"{NAMESPACE}_batcher_{name}", text, value=getattr(stats, name))


class _SwapCollector(Collector):
    """The watcher's series: swaps by result, and the folder served with the time since when (`hosting.swap`)."""

    def __init__(self, swapper: ModelSwapper) -> None:
        self._swapper = swapper

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        swaps = CounterMetricFamily(f"{NAMESPACE}_model_swaps", "Weights folders swapped in (done), or that failed "
                                    "and changed nothing (failed), on either engine.", labels=["result"])
        for result, count in self._swapper.counts().items():
            swaps.add_metric([result], count)
        served = GaugeMetricFamily(f"{NAMESPACE}_model_served_since_seconds", "Unix time since which this worker "
                                   "serves the weights folder of its labels (its config's name, its network's "
                                   "sha256; adapted: the sha256 prefixes of the files its adaptation learned from).",
                                   labels=["folder", "name", "sha256", "adapted"])
        now = self._swapper.served
        if now is not None:
            served.add_metric([str(now.folder), now.name, now.sha256, now.adapted_from], now.since)
        yield from (swaps, served)


class _GcCollector(Collector):
    """The cyclic GC's series: collections, their total and their longest time, by generation."""

    def __init__(self, pauses: GcPauses) -> None:
        self._pauses = pauses

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        p = self._pauses
        collections = CounterMetricFamily(f"{NAMESPACE}_gc_collections", "Collections of Python's cyclic garbage "
                                          "collector, by generation (2: full).", labels=["generation"])
        seconds = CounterMetricFamily(f"{NAMESPACE}_gc_pause_seconds", "Time the process spent in those "
                                      "collections (the GIL held: every request waits).", labels=["generation"])
        longest = GaugeMetricFamily(f"{NAMESPACE}_gc_pause_longest_seconds", "The longest collection so far.",
                                    labels=["generation"])
        for generation in range(3):
            collections.add_metric([str(generation)], p.collections[generation])
            seconds.add_metric([str(generation)], p.seconds[generation])
            longest.add_metric([str(generation)], p.longest[generation])
        yield from (collections, seconds, longest)


class _LogCollector(Collector):
    """The log lines the process's log writer dropped (sidecar.log_writer.LogWriter: its queue full, stderr not
    taking them)."""

    def __init__(self, writer: LogWriter) -> None:
        self._writer = writer

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(f"{NAMESPACE}_log_lines_dropped", "Log lines dropped because stderr did not take "
                                  "them (the log writer's queue was full).", value=self._writer.dropped)


def instrument(app: Flask, endpoint: str = "inference") -> None:
    """Count every request of `endpoint` in flight, and time the ones answered with an error status (`rejected`):
    an answered one is timed by its path where it is answered (`api.answers.AnswerPolicy.respond`)."""

    @app.before_request
    def _arrived() -> None:
        if request.endpoint == endpoint:
            # From the accept stamp (api.accept), as the request log counts.
            g.metrics_arrival = budget_start(request.environ, time.monotonic())
            app_metrics().in_flight.inc()

    @app.teardown_request
    def _answered(_exc: BaseException | None) -> None:
        arrival = g.pop("metrics_arrival", None)
        if arrival is None:
            return
        metrics = app_metrics()
        metrics.in_flight.dec()
        if not g.get("answered", False):  # the view raised (bad request, body too large, a bug): an error status
            metrics.request_seconds.labels(REJECTED).observe(time.monotonic() - arrival)


def app_metrics() -> Metrics:
    """Return the metrics of the app handling the current request."""
    return current_app.extensions[METRICS_KEY]


def metrics_view() -> Response:
    """Serve the app's metrics to Prometheus."""
    return Response(app_metrics().render(), mimetype=None, content_type=CONTENT_TYPE_LATEST)
