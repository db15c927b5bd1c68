"""bpe/literals.py's LiteralFinder against the plain regex alternation (longest first) it replaces."""

from __future__ import annotations

import random

import pytest
import regex

from tokenkit.bpe.literals import LiteralFinder


def _alternation(literals) -> regex.Pattern:
    return regex.compile("|".join(regex.escape(s) for s in sorted(literals, key=lambda s: (-len(s), s))))


def test_finds_what_the_longest_first_alternation_finds():
    rng = random.Random(0)
    for _ in range(500):
        alphabet = "<|>ab é\n"[: rng.randint(2, 8)]
        literals = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 12))}
        text = "".join(rng.choice(alphabet + "xyz") for _ in range(rng.randint(0, 80)))
        finder = LiteralFinder(literals)
        expected = [(m.start(), m.end(), m.group()) for m in _alternation(literals).finditer(text)]
        assert list(finder.finditer(text)) == expected, (literals, text)
        assert finder.search(text) == (expected[0] if expected else None)


def test_many_literals_cost_no_more_than_a_few():
    """A tokenizer of 70,000 special tokens: its finder is built and searched at once."""
    finder = LiteralFinder(f"<s{i}>" for i in range(70_000))
    found = list(finder.finditer("a <s69999> b <s1> <s10> <s"))
    assert found == [(2, 10, "<s69999>"), (13, 17, "<s1>"), (18, 23, "<s10>")]


def test_empty_literals_are_refused():
    with pytest.raises(ValueError):
        LiteralFinder([])
    with pytest.raises(ValueError):
        LiteralFinder(["a", ""])
