"""Run the service on Flask's threaded development server: `python -m api [--port 8080] [...]`.

Every setting of `config.Config` is a flag (`--max-batch-size 32`) that overrides its environment
variable. For the judge, serve with gunicorn instead (`make run`, see server/gunicorn_conf.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

from cli import exit_outside_venv
from config import SECRET_FIELDS, Config, ConfigError
from machine import check_device
from model.contract import check_weights, ignored_masked_lm


def build_parser() -> argparse.ArgumentParser:
    """Make one flag per setting; a flag left out keeps the environment's (or the default) value."""
    parser = argparse.ArgumentParser(prog="python -m api", description=__doc__.splitlines()[0])
    defaults = Config()
    for f in dataclasses.fields(Config):
        parser.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, metavar=f.name.upper(), default=None,
            help=f"env {f.name.upper()}, default {getattr(defaults, f.name)!s}"
            if f.name not in SECRET_FIELDS else f"env {f.name.upper()}",
        )
    return parser


def parse_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> Config:
    """Build the config from the environment, then the command line's flags over it."""
    args = build_parser().parse_args(argv)
    flags = {name: value for name, value in vars(args).items() if value is not None}
    return Config.from_env(environ).with_overrides(flags)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted."""
    try:
        config = parse_config(argv)
        check_device(config)
        warning = ignored_masked_lm(config, check_weights(config))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    for line in (warning, *Config.misspelled(os.environ)):
        if line:
            print(f"warning: {line}", file=sys.stderr)
    try:
        from api import create_app
    except ModuleNotFoundError as missing:  # run by a Python outside the project's environment
        exit_outside_venv(missing, "api", instead="make run")
    from api.state import EXTENSION_KEY
    from sidecar import lifecycle

    app = create_app(config)
    state = app.extensions[EXTENSION_KEY]
    lifecycle.start(*state.starting())  # as in gunicorn's processes: no log line waits for stderr
    try:
        app.run(host=config.host, port=config.port, threaded=True, use_reloader=False)
    finally:
        # What gunicorn's worker_exit closes, in the same order (AppState.closing), then the queued log lines.
        lifecycle.stop(*state.closing())
    return 0


if __name__ == "__main__":
    sys.exit(main())
