"""server/gunicorn_logger.py: gunicorn's own access line only when an access log is asked for (the app writes one per
request)."""

from __future__ import annotations

from gunicorn.config import Config as GunicornConfig

from server.gunicorn_logger import GunicornLogger

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
