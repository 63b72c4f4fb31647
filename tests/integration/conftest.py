"""Fixtures shared by the integration tests' modules."""

from tests.integration.webhook import server

__all__ = ["server"]  # a webhook on loopback: test_notify, test_notify_outcomes
