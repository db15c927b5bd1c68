"""bpe/replay.py and `Tokenizer.replay`: the merges of a text step by step, against `encode` and a
plain rescan; the merge counts a trained tokenizer records.

The replay's last sequence must be `encode`'s ids on every text (random texts, specials allowed
or read as text, long chunks without a split pattern, GPT-2's vocabulary when ../shared/data is
there), and each step must be what rescanning the whole sequence finds.
"""

from __future__ import annotations

import random
import time
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tokenizer import make_corpus  # the same mixed corpus

from tokenkit.bpe import Tokenizer
from tokenkit.bpe.replay import replay_merges, replay_merges_naive
from tokenkit.bpe.train_corpus import MERGE_COUNTS

GPT2 = Path(__file__).parents[1] / ".." / "shared" / "data" / "gpt2"
HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SPECIALS = ["<|endoftext|>", "<| pad |>"]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train([make_corpus().encode()], vocab_size=420, special_tokens=SPECIALS, workers=1, quiet=True)


@pytest.fixture(scope="module")
def long_tok() -> Tokenizer:
    """No split pattern and a tiny alphabet: long chunks, runs of one pair (a a a)."""
    rng = random.Random(1)
    corpus = "".join(rng.choice("aab c") for _ in range(5000))
    return Tokenizer.train([corpus.encode()], vocab_size=300, min_frequency=1, pattern="none", workers=1, quiet=True)


@pytest.fixture(scope="module")
def gpt2() -> Tokenizer:
    if not (GPT2 / "encoder.json").exists():
        pytest.skip("../shared/data/gpt2 is not present")
    return Tokenizer.from_gpt2(GPT2 / "encoder.json", GPT2 / "vocab.bpe")


def check_replay(tok: Tokenizer, text: str, **policy) -> None:
    """The replay ends in encode's ids, steps rise in rank, and a plain rescan finds the same steps."""
    replay = tok.replay(text, **policy)
    assert replay.ids == tok.encode(text, **policy)
    bounds = [0] + [b for _, b in replay.chunks]  # the chunks cover `initial`, in order, none empty
    assert replay.chunks == list(pairwise(bounds)) and bounds[-1] == len(replay.initial)
    assert all(a < b for a, b in replay.chunks)
    ranks = [s.rank for s in replay.steps]
    assert ranks == sorted(set(ranks))
    pieces = [replay.initial[a:b] for a, b in replay.chunks]
    steps, ids = replay_merges_naive(pieces, {pair: 256 + r for r, pair in enumerate(tok.merges)})
    assert ids == replay.ids
    assert replay.steps == steps
    seq = list(replay.initial)  # each step's positions hold its pair in the sequence before it
    for step in replay.steps:
        for i in reversed(step.at):
            assert (seq[i], seq[i + 1]) == step.pair
            seq[i : i + 2] = [step.new_id]
    assert seq == replay.ids


@HYP
@given(text=st.text(alphabet="the cat sat naïve 日本😀'\n\t,.0123", max_size=300))
def test_replay_ends_in_encode_and_equals_a_rescan(tok, text):
    check_replay(tok, text)


@HYP
@given(text=st.text(alphabet="aab c", max_size=400))
def test_replay_of_long_chunks_and_runs(long_tok, text):
    check_replay(long_tok, text)


@HYP
@given(pieces=st.lists(st.sampled_from(["<|endoftext|>", "<| pad |>", " the", "cat", "\n", "é", "<|"]), max_size=12))
def test_replay_with_specials_allowed_or_as_text(tok, pieces):
    text = "".join(pieces)
    check_replay(tok, text, allowed_special="all")
    check_replay(tok, text, disallowed_special=())
    replay = tok.replay(text, allowed_special="all")
    specials = set(tok.special_tokens.values())
    for a, b in replay.chunks:  # a special token is a chunk of its own, one id from the start
        assert not specials & set(replay.initial[a:b]) or b - a == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200))
def test_replay_of_any_bytes(tok, data):
    assert tok.replay(data).ids == tok.encode(data)


def test_replay_of_seeded_random_texts_with_gpt2(gpt2):
    rng = random.Random(7)
    words = make_corpus(seed=3, n_words=400).split(" ")
    for _ in range(40):
        text = " ".join(rng.choices(words, k=rng.randint(1, 60)))
        check_replay(gpt2, text)
    check_replay(gpt2, "Hello world<|endoftext|> again", allowed_special="all")


def test_replay_of_a_long_text_is_quick(tok):
    text = make_corpus(seed=5, n_words=4000)[:20_000]
    start = time.perf_counter()
    replay = tok.replay(text, disallowed_special=())
    assert time.perf_counter() - start < 5
    assert replay.ids == tok.encode(text, disallowed_special=())


def test_merge_steps_on_the_docstring_example():
    steps, ids = replay_merges([[97, 97, 97, 98], [97, 97]], {(97, 97): 256, (256, 97): 257})
    assert [(s.rank, s.pair, s.at) for s in steps] == [(0, (97, 97), [0, 4]), (1, (256, 97), [0])]
    assert ids == [257, 98, 256]


def test_trained_tokenizer_records_its_first_merge_counts(tok, tmp_path):
    counts = tok.training["merge_counts"]
    assert counts == tok.train_report.counts[:MERGE_COUNTS]
    tok.save(tmp_path / "t.safetensors")
    assert Tokenizer.load(tmp_path / "t.safetensors").training["merge_counts"] == counts
    assert "merge_counts" not in Tokenizer(tok.merges).training  # made from merges alone: nothing recorded
