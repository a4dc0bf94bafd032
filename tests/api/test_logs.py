"""api/logs.py: gunicorn's own access line only when an access log is asked for (the app writes one per request)."""

from __future__ import annotations

from gunicorn.config import Config as GunicornConfig

from api.logs import GunicornLogger

LOGCONFIG = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING", "handlers": []}}


def gunicorn_config(**settings: object) -> GunicornConfig:
    cfg = GunicornConfig()
    for name, value in settings.items():
        cfg.set(name, value)
    return cfg


def test_a_logconfig_dict_without_accesslog_writes_no_access_line():
    logger = GunicornLogger(gunicorn_config(logconfig_dict=LOGCONFIG))
    assert logger.access_log_enabled is False


def test_an_access_log_asked_for_is_still_written():
    logger = GunicornLogger(gunicorn_config(logconfig_dict=LOGCONFIG, accesslog="-"))
    assert logger.access_log_enabled is True


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
