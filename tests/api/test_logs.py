"""api/logs.py: every package's records as JSON lines on stderr."""

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


def test_request_lines_from_many_threads_reach_a_file_whole_and_all_of_them(tmp_path, monkeypatch):
    """The request log's handler writes without a lock (one write() per line): no line lost or cut into another."""
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
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert sorted(r["esun_uuid"].split("-長")[0] for r in lines) == sorted(
        f"uuid-{t}-{i}" for t in range(16) for i in range(200))


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
