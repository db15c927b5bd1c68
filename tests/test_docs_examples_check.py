"""bench/readme_examples.py --check, which CI runs: what it counts as a timing, and what it does not."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "bench" / "readme_examples.py"
_SPEC = importlib.util.spec_from_file_location("readme_examples", _PATH)
readme_examples = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(readme_examples)


def test_a_table_column_of_timings_may_change_width():
    # the column is as wide as its widest timing: a faster machine shifts the padding
    old = ["encode speed       6.45 MB/s            7.33 MB/s", "tokens             12,324               16,380"]
    new = ["encode speed       11.34 MB/s           12.83 MB/s", "tokens             12,324               16,380"]
    assert readme_examples.differences(old, new) == []


def test_timings_in_any_unit_are_aside():
    pairs = [("done in 1.20 s", "done in 0.87 s"), ("12 ms a step", "9 ms a step"), ("3,100 tokens/s", "12 tokens/s")]
    for old, new in pairs:
        assert readme_examples.differences([old], [new]) == []


def test_counts_ids_and_words_still_differ():
    for old, new in [
        ("tokens             12,324", "tokens             12,325"),
        ("[15496, 995]", "[15496, 996]"),
        ("error: no such file", "error: no such files"),
        ("bytes per token    3.909", "bytes per token    3.910"),
    ]:
        assert readme_examples.differences([old], [new]) == [f"- {old}", f"+ {new}"]
