"""api/logs.py: every package's records as JSON lines on stderr, one line per request, overload answers summed."""

from __future__ import annotations


def test_configure_logging_writes_every_package_s_records_as_json(capsys):
    """Regression: `batching.*` records (a dead model process replaced) came out as plain text, and INFO was lost."""
    import json
    import logging

    from api.logs import configure_logging

    configure_logging("INFO")
    try:
        raise RuntimeError("batch function failed")
    except RuntimeError:
        logging.getLogger("batching.process").exception("worker process 1 exited with code -9; started another")
    logging.getLogger("batching.threaded").info("batcher started")
    logging.getLogger("some.library").warning("a library's warning")
    logging.getLogger("some.library").info("a library's chatter")
    logging.getLogger("service_streamer.service_streamer").info("run_once batch_size: 4")  # a line per batch
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(r["logger"], r["level"]) for r in lines] == [
        ("batching.process", "ERROR"), ("batching.threaded", "INFO"), ("some.library", "WARNING")]
    assert "RuntimeError: batch function failed" in lines[0]["exc"]


def _lines_from_many_threads(tmp_path, monkeypatch, writer=None) -> list[str]:
    """16 threads log 200 long request lines each into a file as stderr (through `writer` when given); the
    uuids of the lines the file holds, each line parsed whole."""
    import json
    import threading

    from api.logs import configure_logging, log_request
    from api.paths import AnswerPath

    configure_logging("INFO")
    path = tmp_path / "stderr.log"
    with open(path, "w", encoding="utf-8") as stderr:
        monkeypatch.setattr("sys.stderr", stderr)

        def answer_many(thread: int) -> None:
            for i in range(200):
                log_request(f"uuid-{thread}-{i}-" + "長" * 300, 0, AnswerPath.MODEL, 41.0, 7, None)

        threads = [threading.Thread(target=answer_many, args=(t,)) for t in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if writer is not None:
            writer.stop()
    return sorted(json.loads(line)["esun_uuid"].split("-長")[0]
                  for line in path.read_text(encoding="utf-8").splitlines())


ALL_LINES = sorted(f"uuid-{t}-{i}" for t in range(16) for i in range(200))


def test_request_lines_from_many_threads_reach_a_file_whole_and_all_of_them(tmp_path, monkeypatch):
    """The request log's handler writes without a lock (one write() per line): no line lost or cut into another."""
    assert _lines_from_many_threads(tmp_path, monkeypatch) == ALL_LINES


def test_a_request_line_is_the_same_written_directly_or_through_a_logging_record(tmp_path, monkeypatch, caplog):
    """log_request skips the logging record where the project's handler is the only one listening; the line is the
    one the handler's formatter makes of the record (a listener added, e.g. a test's capture, gets the record)."""
    import json
    import logging

    from api.logs import REQUEST_LOG, JsonFormatter, configure_logging, log_request
    from api.paths import AnswerPath

    configure_logging("INFO")
    root = logging.getLogger()
    path = tmp_path / "stderr.log"
    with open(path, "w", encoding="utf-8") as stderr:
        monkeypatch.setattr("sys.stderr", stderr)
        with monkeypatch.context() as only_ours:  # pytest's own capture handlers off
            only_ours.setattr(root, "handlers", [h for h in root.handlers if isinstance(h.formatter, JsonFormatter)])
            log_request("q-長", 1, AnswerPath.MODEL_LOADING, 0.26, None, "the model is loading", queued_ms=1.5)
        assert not caplog.records  # no record was made
        with caplog.at_level(logging.INFO, logger=REQUEST_LOG.name):
            log_request("q-長", 1, AnswerPath.MODEL_LOADING, 0.26, None, "the model is loading", queued_ms=1.5)
    direct = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    through_record = json.loads(JsonFormatter().format(caplog.records[0]))
    assert abs(direct.pop("ts") - through_record.pop("ts")) < 5
    assert direct == through_record
    assert direct["path"] == "model_loading" and direct["level"] == "WARNING" and direct["esun_uuid"] == "q-長"


def test_request_lines_from_many_threads_through_the_log_writer_reach_a_file_whole_and_all(tmp_path, monkeypatch):
    """The worker's path: lines queued by many threads, written by one, several to a write(): none lost or cut."""
    import sidecar.log_writer
    from sidecar.log_writer import LogWriter

    writer = LogWriter(capacity=100_000).start()
    monkeypatch.setattr(sidecar.log_writer, "LOG_WRITER", writer)
    assert _lines_from_many_threads(tmp_path, monkeypatch, writer) == ALL_LINES
    assert writer.dropped == 0


def test_overload_answers_log_one_info_line_each_and_one_summed_warning_a_second_per_path(monkeypatch, caplog):
    """Issue 40: under overload every shed / pool_full answer wrote a WARNING line, 5,000 a second at 5x. Now the
    request line is INFO as any answer's, and the WARNING sums a path's answers, at most one line a second."""
    import logging

    import api.logs
    from api.logs import OverloadSums, log_request
    from api.paths import AnswerPath

    now = [100.0]
    sums = OverloadSums(clock=lambda: now[0])
    monkeypatch.setattr(api.logs, "OVERLOAD_SUMS", sums)
    with caplog.at_level(logging.INFO, logger="api.requests"):
        for i in range(10):  # 10 answers of each path within 0.9 s
            log_request(f"shed-{i}", 0, AnswerPath.SHED, 1.0, None, None)
            log_request(f"full-{i}", 0, AnswerPath.POOL_FULL, 1.0, None, None)
            now[0] += 0.09
        sums.flush_due()  # the writer's tick: nothing due yet
        now[0] = 101.0
        log_request("shed-10", 0, AnswerPath.SHED, 1.0, None, None)  # a second after the first: due
        now[0] = 102.5
        sums.flush_due()  # pool_full's 9 left untold since 100.0, shed's none since 101.0
        log_request("error", 0, AnswerPath.ERROR, 1.0, None, "the model failed")  # not an overload path
    requests = [r for r in caplog.records if r.name == "api.requests"]
    summed = [(r.levelname, r.fields["path"], r.fields["answers"], r.fields["since_s"]) for r in caplog.records
              if r.name == "api.requests.summed"]
    assert [r.levelname for r in requests] == ["INFO"] * 21 + ["WARNING"]
    assert summed == [("WARNING", "shed", 1, None), ("WARNING", "pool_full", 1, None),
                      ("WARNING", "shed", 10, 1.0), ("WARNING", "pool_full", 9, 2.5)]
    assert all(AnswerPath(p).under_load for p in ("shed", "pool_full", "overload", "late_accept", "deadline"))
    assert not any(p.under_load for p in AnswerPath if p.value not in (
        "shed", "pool_full", "overload", "late_accept", "deadline"))


def test_readyz_names_a_stuck_log_writer_while_answers_go_on(monkeypatch, make_app, make_body):
    """Issue 40: /healthz and /readyz answered 200 while every request hung on a full stderr pipe. Now answers go
    on, /readyz says 503 naming the log writer, and /metrics counts the dropped lines."""
    import os
    import time

    import sidecar.log_writer
    from sidecar.log_writer import LogWriter

    read_end, write_end = os.pipe()
    stderr = os.fdopen(write_end, "w")
    monkeypatch.setattr("sys.stderr", stderr)
    writer = LogWriter(capacity=10, stuck_after_s=0.1).start()
    monkeypatch.setattr(sidecar.log_writer, "LOG_WRITER", writer)
    try:
        writer.put("{" + " " * 70_000 + "}")  # more than the pipe takes
        client = make_app().test_client()
        time.sleep(0.2)
        for i in range(50):
            answer = client.post("/inference", json=make_body(esun_uuid=f"q-{i}", retry=0))
            assert answer.status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert any("log writer" in reason for reason in ready.get_json()["reasons"])
        metrics = client.get("/metrics").get_data(as_text=True)
        dropped = next(line for line in metrics.splitlines() if line.startswith("esun_log_lines_dropped_total"))
        assert float(dropped.split()[1]) == writer.dropped > 0
    finally:
        os.close(read_end)  # the stuck write() fails (EPIPE): the writer comes back and stops
        writer.stop(timeout_s=2)
        stderr.close()
