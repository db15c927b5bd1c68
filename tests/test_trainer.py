"""The BPE trainer and the chunk counter against slow, obviously correct references.

- `naive_train` recounts every pair of every chunk before each merge (minbpe's loop, weighted by
  chunk counts, same tie rule); the incremental trainer must learn the same merges and counts.
- `naive_counts` splits the whole text at once; streamed, parallel counting must agree with it.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tokenkit.bpe.pretokenize as pretokenize
import tokenkit.bpe.trainer as trainer
from tokenkit.bpe import Tokenizer, TokenizerError
from tokenkit.bpe.cut import cut_pieces, find_cut
from tokenkit.bpe.pretokenize import count_chunks, resolve_pattern, split_text
from tokenkit.bpe.trainer import train_merges, train_merges_naive

DATA = Path(__file__).parents[1] / ".." / "shared" / "data"
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- references


def naive_train(chunk_counts, vocab_size=None, min_frequency=None):
    """bpe.trainer's plain reference: recount every pair before every merge."""
    result = train_merges_naive(chunk_counts, vocab_size, min_frequency)
    return result.merges, result.counts, result.stop_reason


def naive_counts(texts, pattern):
    """Split each whole text at once and count the chunks as bytes."""
    total = Counter()
    for data in texts:
        chunks = split_text(data.decode("utf-8", "surrogateescape"), pattern)
        total.update(c.encode("utf-8", "surrogateescape") for c in chunks)
    return dict(total)


def fast(chunk_counts, bulk_sites=None, **rules):
    """The trainer's answer; bulk_sites=1 sends every merge with a != b down the numpy path."""
    saved = trainer._BULK_SITES
    trainer._BULK_SITES = saved if bulk_sites is None else bulk_sites
    try:
        result = train_merges(chunk_counts, quiet=True, **rules)
    finally:
        trainer._BULK_SITES = saved
    return result.merges, result.counts, result.stop_reason


# ----------------------------------------------------------------------------- strategies

ALPHABETS = [
    b"a",  # one letter: nothing but overlapping runs
    b"ab",
    b"abc",
    b"ab ",
    "é中aé".encode(),  # multi-byte UTF-8 pieces
    bytes([0, 255, 128, 10, 32]),  # raw bytes, invalid UTF-8
    bytes(range(256)),
]


@st.composite
def corpora(draw, max_chunks=12, max_len=16):
    alphabet = draw(st.sampled_from(ALPHABETS))
    chunk = st.lists(st.sampled_from(list(alphabet)), max_size=max_len).map(bytes)
    return draw(st.dictionaries(chunk, st.integers(1, 6), max_size=max_chunks))


@st.composite
def stop_rules(draw):
    vocab_size = draw(st.one_of(st.none(), st.integers(256, 320)))
    min_frequency = draw(st.one_of(st.none(), st.integers(1, 5)))
    if vocab_size is None and min_frequency is None:
        min_frequency = 1
    return {"vocab_size": vocab_size, "min_frequency": min_frequency}


# Pieces that stress the split patterns at piece cuts: ASCII and Unicode whitespace of all
# kinds, CR/LF runs, contractions, punctuation before newlines, digits, letters from several
# scripts, and bytes that are not valid UTF-8.
TEXT_PARTS = [
    "a",
    "b",
    "Zq",
    "é",
    "中文",
    "1",
    "23",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    "'s",
    "'",
    ".",
    ",",
    "!?",
    "\xa0",
    "\u3000",
    "\x85",
    "\x1c",
    "\u2028",
]
BYTE_PARTS = [p.encode() for p in TEXT_PARTS] + [b"\xff", b"\xc3", b"\xe4\xb8", b"\xed\xb2\x80"]
texts = st.lists(st.sampled_from(BYTE_PARTS), max_size=60).map(b"".join)


# ----------------------------------------------------------------------------- trainer


@SETTINGS
@given(corpora(), stop_rules(), st.sampled_from([None, 1, 3]))
def test_trainer_matches_naive(chunk_counts, rules, bulk_sites):
    assert fast(chunk_counts, bulk_sites, **rules) == naive_train(chunk_counts, **rules)


@SETTINGS
@given(corpora(), stop_rules())
def test_the_trainers_token_count_is_the_encoding_of_the_corpus(chunk_counts, rules):
    """TrainResult.tokens, read off the trainer's final state, is what encoding every chunk with
    the learned merges gives (a merge never makes a pair that outranks it)."""
    chunk_counts = {chunk: n for chunk, n in chunk_counts.items() if chunk}  # as count_chunks gives them
    result = train_merges(chunk_counts, quiet=True, **rules)
    assert result.tokens == Tokenizer(result.merges).count_tokens(chunk_counts)


@SETTINGS
@given(corpora(max_chunks=3, max_len=120), st.integers(1, 3), st.sampled_from([None, 1]))
def test_long_chunks_match_naive(chunk_counts, min_frequency, bulk_sites):
    # Long chunks and low thresholds: many merges per chunk, deep overlaps, new ids merged again.
    expected = naive_train(chunk_counts, min_frequency=min_frequency)
    assert fast(chunk_counts, bulk_sites, min_frequency=min_frequency) == expected


@settings(max_examples=40, deadline=None)
@given(corpora(), st.randoms(use_true_random=False))
def test_result_does_not_depend_on_chunk_order(chunk_counts, rnd):
    items = list(chunk_counts.items())
    rnd.shuffle(items)
    assert fast(dict(items), min_frequency=1) == fast(chunk_counts, min_frequency=1)


def test_classic_example():
    # "aaabdaaabac": (a,a) occurs 4 times (overlaps count) and wins -> Z; merged left to right:
    # "Z a b d Z a b a c". Now (a,b) and (Z,a) both occur twice: the tie goes to the smaller
    # pair (97, 98) -> Y: "Z Y d Z Y a c". Then (Z,Y) occurs twice -> X: "X d X a c", where
    # every pair occurs once, below min_frequency=2.
    result = train_merges({b"aaabdaaabac": 1}, vocab_size=300, min_frequency=2, quiet=True)
    assert result.merges == [(97, 97), (97, 98), (256, 257)]
    assert result.counts == [4, 2, 2]
    assert result.stop_reason == "min_frequency"


def test_overlapping_runs_merge_left_to_right():
    # "aaaaa" x3: (a,a) occurs 4 times -> "aa aa a"; (aa,aa) and (aa,a) tie at 1 occurrence
    # (x3) and the smaller pair (256, 97) wins -> "aa aaa"; then (256, 257).
    result = train_merges({b"aaaaa": 3}, min_frequency=1, quiet=True)
    assert result.merges == [(97, 97), (256, 97), (256, 257)]
    assert result.counts == [12, 3, 3]
    for n in range(2, 12):
        corpus = {b"a" * n: 3, b"b" + b"a" * (n + 1): 1, b"ab" * n: 2}
        for bulk_sites in (None, 1):
            assert fast(corpus, bulk_sites, min_frequency=1) == naive_train(corpus, min_frequency=1)


def test_stop_rules():
    corpus = {b"the cat sat on the mat": 5, b"the hat": 2}
    by_vocab = train_merges(corpus, vocab_size=260, quiet=True)
    assert (len(by_vocab.merges), by_vocab.stop_reason) == (4, "vocab_size")
    by_freq = train_merges(corpus, min_frequency=7, quiet=True)
    assert by_freq.stop_reason == "min_frequency" and min(by_freq.counts) >= 7
    both = train_merges(corpus, vocab_size=100_000, min_frequency=7, quiet=True)
    assert both == by_freq
    exhausted = train_merges(corpus, vocab_size=100_000, quiet=True)
    assert exhausted.stop_reason == "no_pairs"
    assert train_merges(corpus, vocab_size=256, quiet=True).merges == []


def test_on_merge_reports_every_merge():
    seen = []
    result = train_merges({b"abababab": 2}, min_frequency=1, quiet=True, on_merge=lambda *a: seen.append(a))
    assert seen == [(r, pair, count) for r, (pair, count) in enumerate(zip(result.merges, result.counts, strict=True))]


def test_trainer_errors():
    with pytest.raises(TokenizerError, match="vocab size"):
        train_merges({b"ab": 1}, vocab_size=255)
    with pytest.raises(TokenizerError, match="vocab size or a minimum frequency"):
        train_merges({b"ab": 1}, vocab_size=None, min_frequency=None)
    with pytest.raises(TokenizerError, match="positive"):
        train_merges({b"ab": 0}, min_frequency=1)


def test_real_text_matches_naive():
    text = (Path(__file__).parents[1] / "corpora" / "tiny_tales.txt").read_bytes()[:20_000]
    counts = count_chunks([text], "gpt2", workers=1, quiet=True)
    expected = naive_train(counts, vocab_size=256 + 120)
    assert fast(counts, vocab_size=256 + 120) == expected
    assert fast(counts, 1, vocab_size=256 + 120) == expected


# ----------------------------------------------------------------------------- counting


@SETTINGS
@given(texts, st.sampled_from(["gpt2", "gpt4"]), st.integers(1, 12))
def test_streamed_counts_equal_whole_text(data, pattern, piece_bytes):
    # Tiny pieces force a cut at nearly every safe place; the counts must not notice.
    assume(data)
    saved = pretokenize._PIECE_BYTES
    pretokenize._PIECE_BYTES = piece_bytes
    try:
        streamed = count_chunks([data], pattern, workers=1, quiet=True)
    finally:
        pretokenize._PIECE_BYTES = saved
    assert streamed == naive_counts([data], pattern)


@SETTINGS
@given(texts, st.integers(1, 12))
def test_pieces_rejoin_to_the_input(data, piece_bytes):
    blocks = [data[i : i + piece_bytes] for i in range(0, len(data), piece_bytes)]
    assert b"".join(cut_pieces(blocks, piece_bytes)) == data


@SETTINGS
@given(texts, st.sampled_from(["gpt2", "gpt4", "none", r"\w+", r"[^\n]*\n", r"(a)|\d*"]))
def test_split_text_keeps_every_character(data, pattern):
    text = data.decode("utf-8", "surrogateescape")
    chunks = split_text(text, pattern)
    assert "".join(chunks) == text
    assert all(chunks)


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4", "none", r" ?\w+|\W"])
def test_workers_agree_with_one_process(monkeypatch, pattern):
    rnd = random.Random(0)
    words = ["the", "cat", "sat", "élan", "中文", "it's", "42", "!", "\n", "  ", "\udcff"]  # \udcff: the raw byte 0xff
    data = " ".join(rnd.choice(words) for _ in range(20_000)).encode("utf-8", "surrogateescape")
    monkeypatch.setattr(pretokenize, "_PIECE_BYTES", 4096)
    halves = [data[: len(data) // 2], data[len(data) // 2 :]]
    one = count_chunks(halves, pattern, workers=1, quiet=True)
    assert count_chunks(halves, pattern, workers=2, quiet=True) == one
    assert one == naive_counts(halves, resolve_pattern(pattern))


def test_files_and_bytes_count_alike(tmp_path):
    data = "Once upon a time, a cat\r\nsat.\n\nThe end\xa0!".encode() + b"\xff\xfe raw \xc3"
    path = tmp_path / "corpus.txt"
    path.write_bytes(data)
    from_bytes = count_chunks([data], "gpt2", workers=1, quiet=True)
    assert count_chunks([path], "gpt2", workers=1, quiet=True) == from_bytes
    assert count_chunks(str(path), "gpt2", workers=1, quiet=True) == from_bytes


def test_invalid_utf8_is_counted_as_its_exact_bytes():
    data = b"caf\xe9 \xff\xfe\xfd abc \xed\xa0\x80 \xc3"
    counts = count_chunks([data], "gpt2", workers=1, quiet=True)
    assert counts == naive_counts([data], "gpt2")
    rebuilt = Counter()
    for chunk, n in counts.items():
        for byte in chunk:
            rebuilt[byte] += n
    assert rebuilt == Counter(data)
    assert b" \xff\xfe\xfd" in counts  # escaped bytes are punctuation to the pattern, kept exact


def test_none_pattern_keeps_each_source_whole(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"ab ab\nab ab")
    counts = count_chunks([path, b"ab ab\nab ab", b"xy"], "none", quiet=True)
    assert counts == {b"ab ab\nab ab": 2, b"xy": 1}
    # Merges may cross spaces and newlines within a source, never between sources.
    merges = train_merges(counts, min_frequency=2, quiet=True).merges
    vocab = [bytes([i]) for i in range(256)]
    for a, b in merges:
        vocab.append(vocab[a] + vocab[b])
    assert b"ab ab\nab ab" in vocab


def test_none_pattern_trains_a_long_chunk_fast():
    # One 200 kB chunk, 300 merges: ~0.1 s here; rescanning the chunk per merge would take
    # some 60 million steps of Python, far beyond the (load-tolerant) bound.
    rnd = random.Random(1)
    chunk = " ".join(rnd.choice(["to", "be", "or", "not", "question"]) for _ in range(40_000)).encode()
    start = time.perf_counter()
    result = train_merges({chunk: 1}, vocab_size=256 + 300, quiet=True)
    assert time.perf_counter() - start < 5
    assert len(result.merges) == 300
    small = {chunk[:3000]: 1}
    assert fast(small, vocab_size=256 + 40) == naive_train(small, vocab_size=256 + 40)


def test_pattern_names():
    assert resolve_pattern("gpt2") == pretokenize.GPT2_PATTERN
    assert resolve_pattern("gpt4") == resolve_pattern("cl100k") == pretokenize.GPT4_PATTERN
    assert resolve_pattern("none") is None
    assert resolve_pattern(r"\d+") == r"\d+"
    with pytest.raises(TokenizerError, match="empty"):
        resolve_pattern("")


def test_count_errors(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        count_chunks([tmp_path / "missing.txt"], "gpt2", quiet=True)
    with pytest.raises(TokenizerError, match="directory .* holds no files"):
        count_chunks([tmp_path], "gpt2", quiet=True)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(TokenizerError, match="empty"):
        count_chunks([empty, b""], "gpt2", quiet=True)
    with pytest.raises(TokenizerError, match="bad split pattern"):
        count_chunks([b"abc"], "(unclosed", quiet=True)
    with pytest.raises(TokenizerError, match="workers"):
        count_chunks([b"abc"], "gpt2", workers=0, quiet=True)
    with pytest.raises(TokenizerError) as info:
        count_chunks([tmp_path / "missing.txt"], "gpt2", quiet=True)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers see the patch only when forked (Linux)")
@pytest.mark.parametrize("failure", ["raise", "die"])
def test_a_failing_worker_is_one_line_error(monkeypatch, failure):
    def broken(totals, piece, pattern):
        if failure == "raise":
            raise ValueError("boom")
        os._exit(3)  # as if killed: no result ever comes back

    monkeypatch.setattr(pretokenize, "_PIECE_BYTES", 64)
    monkeypatch.setattr(pretokenize, "_count_into", broken)
    with pytest.raises(TokenizerError, match="worker failed") as info:
        count_chunks([b"some words and more words " * 40], "gpt2", workers=2, quiet=True)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(not (DATA / "tinyshakespeare.txt").exists(), reason="shared data not present")
def test_shakespeare_streamed_equals_whole(monkeypatch):
    data = (DATA / "tinyshakespeare.txt").read_bytes()
    monkeypatch.setattr(pretokenize, "_PIECE_BYTES", 1 << 16)
    for pattern in ("gpt2", "gpt4"):
        assert count_chunks([data], pattern, workers=1, quiet=True) == naive_counts([data], pattern)


def test_a_short_buffer_is_never_cut_without_the_context_after_the_cut():
    """Found by the test above: with fewer bytes than the cut needs after it, a negative search
    end counted from the right, and "a\\n" was cut from the NBSP that makes the newline part of a
    whitespace run."""
    data = b"a\n\xc2\xa0"
    assert [find_cut(data[:n], 1) for n in range(1, len(data) + 1)] == [-1, -1, -1, -1]
    assert list(cut_pieces([data[i : i + 1] for i in range(len(data))], 1)) == [data]


@pytest.mark.parametrize("held", [None, 8])
@pytest.mark.parametrize("workers", [1, 2])
def test_gpt2_counts_through_words_equal_the_whole_texts_split(monkeypatch, workers, held):
    """GPT-2's chunks are counted through its words (each distinct word split once, words of the
    same count joined, ASCII ones by the stdlib's re): equal to splitting each whole text, on
    texts whose words repeat a lot, mix scripts and whitespace, and start or end oddly."""
    rng = random.Random(11)
    vocabulary = ["the", "cat's", "Zoë", "中文", "42", "end.", "--", "naïve", "'ll", "\u00a0x", "a1b2"]
    spaces = [" ", " ", " ", "  ", "\n", "\n\n", "\t", " \u3000", "\r\n"]
    docs = []
    for _ in range(12):
        words = [rng.choice(vocabulary) + rng.choice(spaces) for _ in range(rng.randint(1, 400))]
        docs.append((rng.choice(["", " ", "\n"]) + "".join(words)).encode())
    monkeypatch.setattr(pretokenize, "_PIECE_BYTES", 256)  # many pieces, each with a first word of its own
    splits = []
    if held is not None:  # words split into chunks and dropped whenever more than `held` are held
        monkeypatch.setattr(pretokenize, "_WORDS_HELD", held)
        real = pretokenize._as_chunks
        monkeypatch.setattr(pretokenize, "_as_chunks", lambda *a: splits.append(1) or real(*a))
    assert count_chunks(docs, "gpt2", workers=workers, quiet=True) == naive_counts(docs, "gpt2")
    assert held is None or workers > 1 or len(splits) > 1  # in this process: split on the way, not once
