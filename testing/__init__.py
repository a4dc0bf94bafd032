"""Clients and load runs against the service: grequests, JMeter, Postman, the benchmark (see README.md).

Not collected by pytest (its tests live in tests/clients/). Run the scripts from the repository root as
modules, e.g. `.venv/bin/python -m testing.concurrent_requests`.
"""
