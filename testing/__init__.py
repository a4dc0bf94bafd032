"""Clients and load runs against the service: grequests, JMeter, Postman, the judge emulator, the benchmark (see
README.md). Not collected by pytest (the tests of these tools are in tests/clients/); run them from the repository
root as modules, e.g. `.venv/bin/python -m testing.concurrent_requests`."""
