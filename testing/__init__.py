"""Clients and load runs against the service (testing/README.md); not collected by pytest, run as modules."""
