"""What each process runs beside the request path: its log writer, its metrics spool, its heap trimmer, and the
folder the master makes for its workers.

None of it answers a request, and all of it must never hold one up: each is per process (a thread or a file does not
survive gunicorn's fork, so each process starts its own) and is started and stopped at the process's edges, in one
place, `sidecar.lifecycle` (`start`, `stop`), which gunicorn's hooks (server/gunicorn_conf.py, server/worker.py) and
`python -m api` call. The package sits below every other (pyproject.toml's import-linter layers): it imports no
module of the project, so the app (api), the batchers and the gunicorn seam may all use it.

- `sidecar.log_writer`: every log line of the process on its way to stderr through a bounded queue and one writer
  thread, never waited for (issue 40), and the logging handler and JSON formatter that feed it.
- `sidecar.metrics_spool`: each worker's Prometheus series written to the shared folder once a second, and every live
  worker's served by whichever is scraped, labelled `worker`.
- `sidecar.heap`: glibc's `malloc_trim(0)` after a batch, at most once in 30 s (the batch workers call it).
- `sidecar.shared_dir`: the folder the master makes for its workers when they are several, removed at its exit.

Why a spool rather than prometheus_client's multiprocess mode: that mode needs PROMETHEUS_MULTIPROC_DIR set in
every process before prometheus_client is first imported (its value class is chosen at import), to a folder wiped
between runs; each process then keeps its metrics' values in mmap'd files named by its process id (one per metric
type), a scrape merges them with a `MultiProcessCollector`, and a dead worker's live gauges must be marked with
`mark_process_dead` from gunicorn's `child_exit` hook. It exports only the values of metrics built from its own
classes (all of them, whatever registry they were put in): custom collectors, which compute their series at each
scrape (here the admission's state, the batching engine's counters, the GC's pauses, the cache's size, the log
lines dropped), are not carried to the other workers; each gauge takes a `multiprocess_mode` to say how the workers'
values combine (by default one series per process); and every app built in one process (the tests build many)
would share one set of values where each now has its own registry. The spool writes each worker's whole exposition,
its collectors' series included, from the same registry as with one worker, and labels each worker's samples.
"""
