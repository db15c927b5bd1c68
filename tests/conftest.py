"""Fixtures more than one test module uses, registered once here (a session fixture imported into
two modules would start twice), and the constants several modules share: a module imports those
with `from conftest import NAME`. What a module sizes on purpose stays in that module."""

from browser import browser  # noqa: F401 -- the system Chromium, for test_page*.py

# A one-layer model of width 32 over windows of 16, 8 at a time: `train-model` and `pipeline`
# flags for runs that must only start, stop or repeat (test_children, test_reliability_runs,
# test_reliability_signals, test_run_dir).
TINY_MODEL = ["--n-layers", "1", "--n-heads", "2", "--d-model", "32", "--context-length", "16", "--batch-size", "8"]

# Twelve short words: a corpus drawn from them is one a tiny model learns in a few steps
# (test_run_dir's `write_words`, test_reliability_hangs's `base`).
HILL_WORDS = ["the", "fox", "ran", "up", "a", "hill", "and", "down", "again", "to", "see", "sun"]
