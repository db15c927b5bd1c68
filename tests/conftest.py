"""Fixtures more than one test module uses, registered once here (a session fixture imported into
two modules would start twice)."""

from browser import browser  # noqa: F401 -- the system Chromium, for test_page*.py
