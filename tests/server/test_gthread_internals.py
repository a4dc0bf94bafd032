"""The gunicorn internals the seam relies on are where it read them (gunicorn 27.0.1): server.worker's gthread ones
and those each other file of server/ lists (one_write, gunicorn_logger, gunicorn_conf). This fails when a gunicorn
upgrade moves one, before a live test meets it as a hang or a traceback."""

from __future__ import annotations

import ast
import inspect
import socket

import gunicorn
from gunicorn.config import Config as GunicornConfig
from gunicorn.http.message import Request
from gunicorn.http.unreader import Unreader
from gunicorn.workers.gthread import TConn, ThreadWorker

from config import REPO_ROOT
from server.worker import GTHREAD_INTERNALS, GUNICORN_VERSION, ReadingThreadWorker


def test_the_pinned_gunicorn_is_the_one_the_internals_were_read_from():
    assert gunicorn.__version__ == GUNICORN_VERSION


def test_every_overridden_or_called_threadworker_method_exists_with_the_arguments_used():
    for name in GTHREAD_INTERNALS["ThreadWorker methods"]:
        assert callable(getattr(ThreadWorker, name, None)), name
    assert list(inspect.signature(ThreadWorker.enqueue_req).parameters) == ["self", "conn"]
    assert list(inspect.signature(ThreadWorker.handle).parameters) == ["self", "conn"]
    assert list(inspect.signature(ThreadWorker.handle_request).parameters) == ["self", "req", "conn"]
    assert list(inspect.signature(ThreadWorker.handle_error).parameters) == ["self", "req", "client", "addr", "exc"]
    assert list(inspect.signature(ThreadWorker.set_accept_enabled).parameters) == ["self", "enabled"]
    assert list(inspect.signature(ThreadWorker.on_client_socket_readable).parameters) == ["self", "conn", "client"]


def test_every_threadworker_attribute_read_is_set_by_its_constructor_or_init_process():
    source = inspect.getsource(ThreadWorker) + inspect.getsource(ThreadWorker.__mro__[1])
    for name in GTHREAD_INTERNALS["ThreadWorker attributes"]:
        assert f"self.{name} =" in source or f"self.{name}=" in source, name


def test_every_tconn_attribute_read_is_set_by_tconn():
    with socket.socket() as sock:
        conn = TConn(GunicornConfig(), sock, ("127.0.0.1", 0), ("127.0.0.1", 0))
        for name in GTHREAD_INTERNALS["TConn attributes"]:
            assert hasattr(conn, name), name


def test_the_unreader_and_request_internals_exist():
    for name in GTHREAD_INTERNALS["Unreader methods"]:
        assert callable(getattr(Unreader, name, None)), name
    for name in GTHREAD_INTERNALS["Request attributes"]:
        assert hasattr(Request, name), name


def test_the_worker_overrides_nothing_beyond_the_listed_methods():
    own = {name for name, value in vars(ReadingThreadWorker).items()
           if callable(value) and not name.startswith("_") and hasattr(ThreadWorker, name)}
    assert own <= set(GTHREAD_INTERNALS["ThreadWorker methods"])


def test_the_gunicorn_functions_the_seam_calls_exist_with_the_arguments_used():
    import importlib

    for dotted in GTHREAD_INTERNALS["gunicorn functions"]:
        module, _, name = dotted.rpartition(".")
        function = getattr(importlib.import_module(f"gunicorn.{module}"), name, None)
        assert callable(function), dotted
    from gunicorn.http import get_parser
    from gunicorn.http2.negotiation import prior_knowledge_allowed, upgrade_allowed

    assert list(inspect.signature(get_parser).parameters)[:3] == ["cfg", "source", "source_addr"]
    assert list(inspect.signature(prior_knowledge_allowed).parameters) == ["cfg", "peer_addr"]
    assert list(inspect.signature(upgrade_allowed).parameters) == ["cfg", "peer_addr"]


def test_with_http2_cleartext_off_no_peer_may_switch_to_http2_as_the_worker_assumes():
    from gunicorn.http2.negotiation import prior_knowledge_allowed, upgrade_allowed

    cfg = GunicornConfig()
    assert cfg.http2_cleartext == "off"  # the default, and make run's
    for peer in (("127.0.0.1", 5000), ("10.1.2.3", 80)):
        assert not prior_knowledge_allowed(cfg, peer) and not upgrade_allowed(cfg, peer)


def test_the_application_and_logger_internals_exist():
    from gunicorn.app.wsgiapp import WSGIApplication
    from gunicorn.glogging import Logger

    from server.gunicorn_logger import GUNICORN_INTERNALS as LOGGER_INTERNALS

    for name in _conf_internals()["Application attributes"]:
        assert f"self.{name} =" in inspect.getsource(WSGIApplication), name
    for name in LOGGER_INTERNALS["Logger methods"]:
        assert callable(getattr(Logger, name, None)), name


def test_the_response_internals_the_one_write_wrapper_relies_on_exist():
    from gunicorn.http.wsgi import Response

    from server.one_write import GUNICORN_INTERNALS as ONE_WRITE_INTERNALS

    for name in ONE_WRITE_INTERNALS["Response methods"]:
        assert callable(getattr(Response, name, None)), name
    source = inspect.getsource(Response)
    assert "self.sock = " in source and callable(Response.start_response)
    for name in ONE_WRITE_INTERNALS["Response attributes"]:
        assert f"self.{name} =" in source or callable(getattr(Response, name, None)), name


def test_every_file_of_the_seam_that_reaches_into_gunicorn_lists_what_it_relies_on():
    lists = {"worker.py": "GTHREAD_INTERNALS", "one_write.py": "GUNICORN_INTERNALS",
             "gunicorn_logger.py": "GUNICORN_INTERNALS", "gunicorn_conf.py": "GUNICORN_INTERNALS"}
    for name, listed in lists.items():
        assert f"\n{listed} = {{" in (REPO_ROOT / "server" / name).read_text(encoding="utf-8"), name


def _conf_internals() -> dict[str, tuple[str, ...]]:
    """server/gunicorn_conf.py's GUNICORN_INTERNALS, read without running the file (it reads the config and checks
    the device at import)."""
    tree = ast.parse((REPO_ROOT / "server" / "gunicorn_conf.py").read_text(encoding="utf-8"))
    [value] = [node.value for node in tree.body if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "GUNICORN_INTERNALS" for t in node.targets)]
    return ast.literal_eval(value)
