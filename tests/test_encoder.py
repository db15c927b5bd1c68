"""bpe/encoder.py, the encoder's fast path, against the plain one-chunk-at-a-time merge.

`merge_batch` (all new chunks merged together, one round per lowest pair) must give exactly
the ids of its plain twin, `bpe.merge.merge_chunk`; the piece cache (GPT-2's pattern: the pieces between single
spaces looked up first) and the word cache (whole words) must give exactly the chunks' ids one
after the other; a cold cache, a warm one and a cleared one must agree.
"""

from __future__ import annotations

import functools
import random
from itertools import compress

import numpy as np
import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkit.bpe import Tokenizer, TokenizerError
from tokenkit.bpe.encoder import NO_MERGE, PairTable, merge_batch
from tokenkit.bpe.merge import merge_chunk
from tokenkit.bpe.pretokenize import GPT2_PATTERN, split_text
from tokenkit.bpe.words import GPT2_ASCII, WHITESPACE, split_words

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# Letters, digits, punctuation, apostrophes, every kind of whitespace (and U+001C, which the
# stdlib's \s holds but GPT-2's pattern does not), accents, CJK, emoji, an escaped byte.
ALPHABET = "aabbcd  e'sltx0129.,!?-\n\n\t\r\x0b\x0c\x1c\x1f\x85\xa0\u2003\u3000éß日本😀\udc80"


def plain_ids(tok: Tokenizer, text: str) -> list[int]:
    """Split, then merge each chunk on its own with the plain rescanning loop (no cache)."""
    return [i for chunk in split_text(text, tok._pattern) for i in tok._chunk_ids(chunk)]


def random_tokenizer(seed: int, pattern: str = "gpt2", vocab: int = 400) -> Tokenizer:
    rng = random.Random(seed)
    corpus = "".join(rng.choice(ALPHABET[:-1]) for _ in range(3000))
    return Tokenizer.train([corpus.encode()], vocab_size=vocab, min_frequency=1, pattern=pattern, workers=1, quiet=True)


@pytest.fixture(scope="module", params=[0, 1, 2])
def tok(request) -> Tokenizer:
    return random_tokenizer(request.param)


@SETTINGS
@given(chunks=st.lists(st.text(alphabet="aab c'\n", min_size=1, max_size=70), min_size=1, max_size=40))
def test_merge_batch_equals_plain_merge(tok, chunks):
    raw = [c.encode() for c in chunks]
    ids, lengths = merge_batch(
        np.frombuffer(b"".join(raw), np.uint8), np.array([len(r) for r in raw]), PairTable(tok.merges)
    )
    expected = [merge_chunk(list(r), tok.layout.pair_id) for r in raw]  # the plain loop, one chunk at a time
    assert lengths.tolist() == [len(e) for e in expected]
    assert ids.tolist() == [i for e in expected for i in e]


@SETTINGS
@given(text=st.text(alphabet=ALPHABET, max_size=400))
def test_encode_equals_plain_merge(tok, text):
    fresh = Tokenizer(tok.merges)  # cold cache
    assert fresh.encode(text) == plain_ids(tok, text)
    assert tok.encode(text) == plain_ids(tok, text)  # warm cache, shared across examples


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), text=st.text(alphabet=ALPHABET, max_size=300))
def test_other_patterns_equal_plain_merge(seed, text):
    for pattern in ("gpt4", "none", r"\w+|\W"):
        tok = random_tokenizer(seed, pattern, vocab=300)
        assert tok.encode(text) == plain_ids(tok, text)


@SETTINGS
@given(text=st.text(alphabet=ALPHABET, max_size=400))
def test_words_split_into_their_own_chunks(text):
    # what the word cache relies on: GPT-2's chunks of a text are its words' chunks in order
    assert [c for w in split_words(text) for c in split_text(w, GPT2_PATTERN)] == split_text(text, GPT2_PATTERN)
    assert "".join(split_words(text)) == text


def test_whitespace_is_the_patterns_whitespace():
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert set(regex.findall(r"\s", every)) == set(WHITESPACE)


def test_many_texts_one_tokenizer_cold_warm_cleared():
    tok = random_tokenizer(7)
    rng = random.Random(3)
    texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 2000))) for _ in range(200)]
    expected = [plain_ids(tok, t) for t in texts]
    assert [tok.encode(t) for t in texts] == expected
    assert [tok.encode(t) for t in texts] == expected  # now from the cache
    tok._text.chunk_cache.clear()
    tok._text._word_cache.clear()
    tok._text._piece_cache.clear()
    assert [tok.encode(t) for t in reversed(texts)] == expected[::-1]


def test_long_words_and_chunks_are_not_kept():
    tok = random_tokenizer(1)
    text = "x" * 1000 + " " + "ab" * 300 + " b"
    assert tok.encode(text) == plain_ids(tok, text)
    assert tok.encode(text) == plain_ids(tok, text)
    assert max(map(len, tok._text._word_cache._ids), default=0) <= 256
    assert max(map(len, tok._text._piece_cache._ids), default=0) <= 256
    assert max(map(len, tok._text.chunk_cache._ids), default=0) <= 256


def test_lone_surrogate_leaves_the_cache_clean():
    tok = random_tokenizer(2)
    with pytest.raises(TokenizerError, match="lone surrogate"):
        tok.encode("abc \ud800 de")
    assert tok.encode("abc de") == plain_ids(tok, "abc de")
    assert all(len(v) for v in tok._text.chunk_cache._ids.values())


def test_uint32_ids():
    tok = Tokenizer([(97, 97)], special_tokens=[f"<s{i}>" for i in range(70_000)])
    assert tok.ids_dtype == np.uint32
    assert tok.encode("aaa <s69999>", allowed_special="all") == [256, 97, 32, 256 + 70_000]


def test_small_batches_give_the_same_ids(monkeypatch):
    from tokenkit.bpe import encoder

    tok = random_tokenizer(5)
    text = "".join(random.Random(9).choice(ALPHABET) for _ in range(3000))
    monkeypatch.setattr(encoder, "_BATCH_BYTES", 7)  # many merge_batch calls per lookup
    assert tok.encode(text) == plain_ids(tok, text)


ASCII = "".join(map(chr, range(128)))


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from("aZ09 '\n\t\r\x0b\x0c\x1c\x1f.,!-_sdtmlvre"), max_size=200)
    | st.text(alphabet=ASCII, max_size=200)
)
def test_ascii_split_is_gpt2_split(text):
    assert GPT2_ASCII.findall(text) == split_text(text, GPT2_PATTERN)


def test_ascii_split_every_short_ascii_text():
    for a in ASCII:
        for b in ASCII:
            for c in "a'sZ 0\n.\x1c":
                text = a + b + c
                assert GPT2_ASCII.findall(text) == split_text(text, GPT2_PATTERN), repr(text)


def test_ascii_and_other_new_words_in_one_batch():
    # new words split by two splitters in one call come back in their places
    tok = random_tokenizer(4)
    text = " ".join(["abc", "d\u00e9f", "ab's", "\u65e5\u672c", "b12", "caf\u00e9!", "x\ty", "\u00a0ab", "ll"] * 3)
    assert Tokenizer(tok.merges).encode(text) == plain_ids(tok, text)


@functools.cache
def _piece_tokenizer() -> Tokenizer:
    return random_tokenizer(4)


PROSE = "aab cd'sl t0.,!?-   \n\n\n\t\r\xa0\u2003é日😀"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(alphabet=PROSE, max_size=300)
    | st.lists(st.sampled_from(["ab", "a", " ", "  ", "\n", " \n", "\n ", "\t", "c.", "'s", "é"]), max_size=60).map(
        "".join
    )
)
def test_pieces_equal_plain_merge(monkeypatch, text):
    # the piece level (bpe.encoder.PieceCache) alone: never handing the text to the word level
    from tokenkit.bpe import encoder

    monkeypatch.setattr(encoder, "_MOSTLY_CLOSED", 0)
    tok = _piece_tokenizer()  # its cache warms over the examples
    assert Tokenizer(tok.merges).encode(text) == plain_ids(tok, text)  # cold
    assert tok.encode(text) == plain_ids(tok, text)
    assert tok._text._piece_cache.text_ids(text) == np.array(plain_ids(tok, text), dtype=tok.ids_dtype).tobytes()
    assert all(" " in key or encoder._closed(key) for key in tok._text._piece_cache._ids)  # no open piece kept


def test_module_examples():
    import doctest

    from tokenkit.bpe import encoder

    assert doctest.testmod(encoder).failed == 0


@pytest.mark.parametrize("n", [0, 1, 7, 3000])
def test_pair_table_is_a_dict_of_the_merges(n):
    # the table against a plain dict: every merge found, and pairs that are not merges not found
    rng = np.random.default_rng(n)
    merges, seen = [], set()
    while len(merges) < n:
        r = len(merges)
        pair = (int(rng.integers(0, 256 + r)), int(rng.integers(0, 256 + r)))
        if pair not in seen:
            seen.add(pair)
            merges.append(pair)
    table = PairTable(merges)
    plain = {pair: 256 + r for r, pair in enumerate(merges)}
    left = np.concatenate([np.array([a for a, _ in merges], dtype=np.int64), rng.integers(0, 256 + n, 20_000)])
    right = np.concatenate([np.array([b for _, b in merges], dtype=np.int64), rng.integers(0, 256 + n, 20_000)])
    expected = [plain.get((a, b), NO_MERGE) for a, b in zip(left.tolist(), right.tolist(), strict=True)]
    assert table.lookup(left, right).tolist() == expected
    small = (left < 256) & (right < 256)
    assert table.lookup_bytes(left[small], right[small]).tolist() == list(compress(expected, small))
