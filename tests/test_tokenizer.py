"""Tokenizer: encode against a naive reference, round trips, special tokens, files, encode_file.

The reference encoder is the textbook one: split with the pattern, start from the bytes, and apply
every merge in rank order over the whole chunk. The fast encoder (cache, rank lookups, heap for
long chunks) must give exactly its ids.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from tokenkit.bpe import Tokenizer, TokenizerError, encode_corpus
from tokenkit.bpe import io as bpe_io
from tokenkit.bpe.corpus import find_file_cut
from tokenkit.bpe.merge import merge_chunk, merge_chunk_heap
from tokenkit.bpe.pretokenize import split_text
from tokenkit.common import pool

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def make_corpus(seed: int = 0, n_words: int = 3000) -> str:
    """Mixed text: ASCII words, accents, CJK, emoji, digits, punctuation, odd whitespace."""
    rng = random.Random(seed)
    syllables = [
        "th",
        "e",
        "ca",
        "t",
        "sa",
        "on",
        "ma",
        "ï",
        "ve",
        "fé",
        "日本",
        "語",
        "😀",
        "n't",
        "12",
        "34",
        "x",
        "--",
        "'ll",
    ]
    words = ["".join(random.Random(k).choices(syllables, k=1 + k % 4)) for k in range(300)]
    seps = [" ", " ", " ", ", ", ".\n", "\n\n", "  ", "\t"]
    return "".join(rng.choice(words) + rng.choice(seps) for _ in range(n_words))


def naive_encode(tok: Tokenizer, text: str) -> list[int]:
    """Split, then apply each merge in rank order (lowest first) to the whole chunk."""
    byte_id = {tok.vocab[i][0]: i for i in range(256)}
    out = []
    for chunk in split_text(text, tok.pattern):
        seq = [byte_id[b] for b in chunk.encode("utf-8", "surrogateescape")]
        for rank, (a, b) in enumerate(tok.merges):
            merged, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
                    merged.append(256 + rank)
                    i += 2
                else:
                    merged.append(seq[i])
                    i += 1
            seq = merged
        out += seq
    return out


def naive_specials(text: str, specials: list[str]) -> list[tuple[str, bool]]:
    """Cut text at specials: leftmost match first, the longest one at the same position."""
    parts, plain, i = [], "", 0
    while i < len(text):
        hit = max((s for s in specials if text.startswith(s, i)), key=len, default=None)
        if hit is None:
            plain += text[i]
            i += 1
        else:
            parts += [(plain, False), (hit, True)]
            plain, i = "", i + len(hit)
    return parts + [(plain, False)]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(
        [make_corpus().encode()], vocab_size=420, special_tokens=["<|endoftext|>", "<| pad |>"], workers=1, quiet=True
    )


@pytest.fixture(scope="module")
def long_tok() -> Tokenizer:
    """No split pattern and a tiny alphabet: long merges and chunks long enough for the heap path."""
    rng = random.Random(1)
    corpus = "".join(rng.choice("aab c") for _ in range(5000))
    return Tokenizer.train([corpus.encode()], vocab_size=300, min_frequency=1, pattern="none", workers=1, quiet=True)


def test_classic_example():
    tok = Tokenizer.train([b"aaabdaaabac"], vocab_size=259, min_frequency=1, pattern="none", workers=1, quiet=True)
    # aa -> Z (4 times), then ab and Za tie at 2: the smaller pair (a, b) wins, then ZY.
    assert tok.merges == [(97, 97), (97, 98), (256, 257)]
    assert tok.encode("aaabdaaabac") == [258, 100, 258, 97, 99]
    assert tok.decode([258, 100, 258, 97, 99]) == "aaabdaaabac"
    assert tok.vocab[258] == b"aaab"


@FAST
@given(text=st.text(alphabet="the cat sat naïve 日本😀'\n\t,.0123", max_size=300))
def test_encode_equals_naive_reference(tok, text):
    assert tok.encode(text, disallowed_special=()) == naive_encode(tok, text)


@FAST
@given(text=st.text(alphabet="aab c", min_size=0, max_size=400))
def test_long_chunks_equal_naive_reference(long_tok, text):
    # pattern "none": the whole text is one chunk, merged with the heap once it has >= 64 bytes
    assert long_tok.encode(text) == naive_encode(long_tok, text)


@FAST
@given(ids=st.lists(st.sampled_from([97, 97, 98, 32, 99, 256, 257]), min_size=2, max_size=300))
def test_heap_merging_equals_rescanning(long_tok, ids):
    # the two merge loops of bpe/merge.py, called directly on the same id lists
    pair_id = long_tok.layout.pair_id
    assert merge_chunk_heap(list(ids), pair_id) == merge_chunk(list(ids), pair_id)


@settings(max_examples=15, deadline=None)
@given(corpus=st.text(alphabet="abcd \n", min_size=1, max_size=200), text=st.text(alphabet="abcde \n", max_size=200))
def test_random_tokenizers_equal_naive_reference(corpus, text):
    tok = Tokenizer.train([corpus.encode()], vocab_size=300, min_frequency=1, workers=1, quiet=True)
    assert tok.encode(text) == naive_encode(tok, text)


def test_cache_does_not_change_results(tok):
    text = make_corpus(seed=5, n_words=300)
    first = tok.encode(text, disallowed_special=())
    assert tok.encode(text, disallowed_special=()) == first == naive_encode(tok, text)
    assert Tokenizer.from_tensors(*tok.to_tensors()).encode(text, disallowed_special=()) == first


@FAST
@given(text=st.text())
def test_roundtrip_any_unicode(tok, text):
    assert tok.decode(tok.encode(text, disallowed_special=())) == text


@FAST
@given(data=st.binary())
def test_roundtrip_any_bytes(tok, data):
    ids = tok.encode(data, disallowed_special=())
    assert tok.decode_bytes(ids) == data
    assert all(0 <= i < 256 + len(tok.merges) for i in ids)


def test_decode_replaces_partial_utf8(tok):
    ids = tok.encode("é")
    assert tok.decode_bytes(ids) == "é".encode()
    assert tok.decode([0xC3]) == "\ufffd"  # half of "é"
    assert tok.decode(np.array(ids, dtype=np.uint16)) == "é"


def test_decode_rejects_bad_ids(tok):
    for bad in ([tok.vocab_size], [-1]):
        with pytest.raises(TokenizerError, match="out of range"):
            tok.decode(bad)


def test_lone_surrogate_is_an_error(tok):
    with pytest.raises(TokenizerError, match="surrogate"):
        tok.encode("a\ud800b")


# --------------------------------------------------------------------------- special tokens


def test_special_ids_follow_the_merges(tok):
    n = 256 + len(tok.merges)
    assert tok.special_tokens == {"<|endoftext|>": n, "<| pad |>": n + 1}
    assert tok.vocab_size == n + 2 == 420
    assert len(tok.vocab) == n


def test_specials_never_come_from_merges():
    corpus = ("hello<|endoftext|>" * 200).encode()
    tok = Tokenizer.train([corpus], vocab_size=300, special_tokens=["<|endoftext|>"], workers=1, quiet=True)
    eot = tok.special_tokens["<|endoftext|>"]
    plain = tok.encode("hello<|endoftext|>", disallowed_special=())
    assert eot not in plain and tok.decode(plain) == "hello<|endoftext|>"
    assert tok.encode("hello<|endoftext|>", allowed_special="all")[-1] == eot


def test_disallowed_special_raises_with_advice(tok):
    with pytest.raises(TokenizerError) as err:
        tok.encode("a <|endoftext|> b")
    msg = str(err.value)
    assert "<|endoftext|>" in msg and "allow" in msg and "\n" not in msg
    # only the allowed one is read as special; the other one still counts as injected
    with pytest.raises(TokenizerError, match="pad"):
        tok.encode("<|endoftext|><| pad |>", allowed_special={"<|endoftext|>"})


def test_disallowed_special_as_plain_text(tok):
    text = "a <|endoftext|> b <| pad |>"
    assert tok.encode(text, disallowed_special=()) == naive_encode(tok, text)
    mixed = tok.encode(text, allowed_special={"<| pad |>"}, disallowed_special=())
    assert mixed[-1] == tok.special_tokens["<| pad |>"]
    assert tok.special_tokens["<|endoftext|>"] not in mixed


def test_unknown_special_name_is_an_error(tok):
    with pytest.raises(TokenizerError, match="not a special token"):
        tok.encode("x", allowed_special={"<|nope|>"})


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(st.sampled_from(["<|a|>", "<|b|>", "<|a|><|b|>", "<|", "a|>", "x", " y", "é"]), max_size=12))
def test_allowed_specials_leftmost_longest(pieces):
    specials = ["<|a|>", "<|b|>", "<|a|><|b|>"]
    tok = Tokenizer([], special_tokens=specials, pattern="gpt2")
    text = "".join(pieces)
    expected = []
    for part, special in naive_specials(text, specials):
        expected += [tok.special_tokens[part]] if special else naive_encode(tok, part)
    assert tok.encode(text, allowed_special="all") == expected
    assert tok.decode(expected) == text


def test_overlapping_specials_longest_wins():
    tok = Tokenizer([], special_tokens=["<|a|>", "<|a|><|b|>", "<|b|>"])
    assert tok.encode("<|a|><|b|>", allowed_special="all") == [tok.special_tokens["<|a|><|b|>"]]
    assert tok.encode("<|a|>x<|b|>", allowed_special="all") == [256, ord("x"), 258]


# --------------------------------------------------------------------------- training entry


def test_train_report_bytes_per_token(tok):
    report = tok.train_report
    corpus = make_corpus().encode()
    assert report.merges_learned == len(tok.merges) == 420 - 2 - 256
    assert report.stop_reason == "vocab_size"
    assert report.corpus_bytes == len(corpus)
    assert report.corpus_tokens == len(tok.encode(corpus, disallowed_special=()))
    assert len(report.counts) == report.merges_learned


def test_train_from_file_equals_train_from_bytes(tmp_path):
    corpus = make_corpus(seed=2).encode()
    path = tmp_path / "c.txt"
    path.write_bytes(corpus)
    a = Tokenizer.train([path], vocab_size=350, workers=2, quiet=True)
    b = Tokenizer.train([corpus], vocab_size=350, workers=1, quiet=True)
    assert a.fingerprint() == b.fingerprint()
    # one source alone, not in a list: a path (str or Path) or a text
    for alone in (str(path), path, corpus):
        assert Tokenizer.train(alone, vocab_size=350, workers=1, quiet=True).fingerprint() == a.fingerprint()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"vocab_size": 256, "special_tokens": ["<s>"]}, "too small"),
        ({"min_frequency": 0}, "min-frequency"),
    ],
)
def test_train_bad_options(kwargs, match):
    with pytest.raises(TokenizerError, match=match):
        Tokenizer.train([b"abc abc"], workers=1, quiet=True, **kwargs)


def test_train_bad_corpus(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    for source in (tmp_path / "missing.txt", tmp_path, tmp_path / "empty.txt", b""):
        with pytest.raises(TokenizerError) as err:
            Tokenizer.train([source], vocab_size=300, workers=1, quiet=True)
        assert "\n" not in str(err.value)


def test_train_verbose_hook_sees_every_merge():
    seen = []
    tok = Tokenizer.train(
        [b"aaabdaaabac"],
        vocab_size=259,
        min_frequency=1,
        pattern="none",
        workers=1,
        quiet=True,
        on_merge=lambda r, p, c: seen.append((r, p, c)),
    )
    assert seen == [(0, (97, 97), 4), (1, (97, 98), 2), (2, (256, 257), 2)]
    assert [p for _, p, _ in seen] == tok.merges


# --------------------------------------------------------------------------- files


def test_save_load_identity(tok, tmp_path):
    path = tmp_path / "tok.safetensors"
    tok.save(path)
    back = Tokenizer.load(path)
    assert back.merges == tok.merges and back.vocab == tok.vocab
    assert back.special_tokens == tok.special_tokens and back.pattern == tok.pattern
    assert back.fingerprint() == tok.fingerprint()
    text = make_corpus(seed=3, n_words=200) + "<| pad |>"
    assert back.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")
    assert [p for p in tmp_path.iterdir()] == [path]  # no temp file left behind


def test_file_is_standard_safetensors(tok, tmp_path):
    path = tmp_path / "tok.safetensors"
    tok.save(path)
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
        merges = f.get_tensor("merges")
        offsets = f.get_tensor("vocab_offsets")
        vbytes = f.get_tensor("vocab_bytes")
    assert meta["format"] == "tokenkit.bpe" and meta["format_version"] == "1"
    assert json.loads(meta["special_tokens"]) == tok.special_tokens
    assert json.loads(meta["training"])["vocab_size"] == 420
    assert merges.dtype == np.int32 and merges.shape == (len(tok.merges), 2)
    assert offsets.dtype == np.int64 and vbytes.dtype == np.uint8
    assert [vbytes[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(tok.vocab))] == tok.vocab


def test_same_corpus_same_bytes(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(make_corpus(seed=4).encode())
    args = dict(vocab_size=330, special_tokens=["<|endoftext|>"], workers=1, quiet=True)
    Tokenizer.train([corpus], **args).save(tmp_path / "a.safetensors")
    Tokenizer.train([corpus], **args).save(tmp_path / "b.safetensors")
    # another process: dict/set ordering (hash seeds) must not leak into the file
    code = f"import sys; from bpe import Tokenizer; Tokenizer.train([sys.argv[1]], **{args!r}).save(sys.argv[2])"
    subprocess.run(
        [sys.executable, "-c", code, str(corpus), str(tmp_path / "c.safetensors")],
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    a, b, c = [(tmp_path / n).read_bytes() for n in ("a.safetensors", "b.safetensors", "c.safetensors")]
    assert a == b == c


def _tampered(tok: Tokenizer, change) -> bytes:
    tensors, metadata = tok.to_tensors()
    tensors = {k: v.copy() for k, v in tensors.items()}
    change(tensors, metadata)
    return bpe_io.serialize(tensors, metadata)


def _foreign_safetensors(tmp_path) -> bytes:
    save_file({"weight": np.zeros((2, 2), np.float32)}, str(tmp_path / "f.safetensors"))
    return (tmp_path / "f.safetensors").read_bytes()


CORRUPTIONS = {
    "empty": lambda tok, tmp: b"",
    "truncated": lambda tok, tmp: bpe_io.serialize(*tok.to_tensors())[:-100],
    "half": lambda tok, tmp: bpe_io.serialize(*tok.to_tensors())[:200],
    "random bytes": lambda tok, tmp: bytes(random.Random(0).randrange(256) for _ in range(500)),
    "huge header": lambda tok, tmp: struct.pack("<Q", 1 << 40) + b"{}",
    "json": lambda tok, tmp: b'{"merges": [[1, 2]]}',
    "foreign safetensors": lambda tok, tmp: _foreign_safetensors(tmp),
    "future version": lambda tok, tmp: _tampered(tok, lambda t, m: m.update(format_version="99")),
    "merge id out of range": lambda tok, tmp: _tampered(tok, lambda t, m: t["merges"].__setitem__((0, 0), 999)),
    "merges wrong dtype": lambda tok, tmp: _tampered(tok, lambda t, m: t.update(merges=t["merges"].astype(np.int64))),
    "vocab bytes disagree": lambda tok, tmp: _tampered(tok, lambda t, m: t["vocab_bytes"].__setitem__(-1, 0)),
    "bytes not a permutation": lambda tok, tmp: _tampered(tok, lambda t, m: t["vocab_bytes"].__setitem__(1, 0)),
    "offsets wrong": lambda tok, tmp: _tampered(tok, lambda t, m: t.update(vocab_offsets=t["vocab_offsets"][:-1])),
    "specials wrong ids": lambda tok, tmp: _tampered(tok, lambda t, m: m.update(special_tokens='{"<s>": 5}')),
    "specials not json": lambda tok, tmp: _tampered(tok, lambda t, m: m.update(special_tokens="{")),
    "missing tensor": lambda tok, tmp: _tampered(tok, lambda t, m: t.pop("merges")),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_files_one_line_error(tok, tmp_path, name):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(CORRUPTIONS[name](tok, tmp_path))
    with pytest.raises(TokenizerError) as err:
        Tokenizer.load(path)
    assert "\n" not in str(err.value) and str(err.value)


def test_a_merged_tokens_bytes_are_checked_against_its_pair_and_named(tok):
    """The reader's vectorised check against the plain one (each merged token's bytes == its two
    parts' bytes together), on many single-byte tamperings anywhere among the merged tokens."""
    tensors, metadata = tok.to_tensors()
    offsets = tensors["vocab_offsets"]
    rng = random.Random(7)
    for _ in range(60):
        tampered = {k: v.copy() for k, v in tensors.items()}
        at = rng.randrange(int(offsets[256]), int(offsets[-1]))
        tampered["vocab_bytes"][at] ^= rng.randrange(1, 256)
        vb, off = tampered["vocab_bytes"].tobytes(), offsets.tolist()
        tokens = [vb[off[i] : off[i + 1]] for i in range(len(off) - 1)]
        merges = tampered["merges"].tolist()
        first = next(r for r, (a, b) in enumerate(merges) if tokens[256 + r] != tokens[a] + tokens[b])
        with pytest.raises(TokenizerError, match=f"vocab_bytes of token {256 + first} disagree with merge {first};"):
            Tokenizer.from_tensors(tampered, metadata)
    back = Tokenizer.from_tensors(tensors, metadata)  # untouched: the same tokenizer, its layout as built
    assert back.to_tensors()[0]["vocab_bytes"].tobytes() == tensors["vocab_bytes"].tobytes()
    assert back.layout == tok.layout


def test_load_missing_or_directory(tmp_path):
    with pytest.raises(TokenizerError, match="no such file"):
        Tokenizer.load(tmp_path / "nope.safetensors")
    with pytest.raises(TokenizerError, match="directory"):
        Tokenizer.load(tmp_path)


def test_save_into_missing_directory(tok, tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        tok.save(tmp_path / "no" / "tok.safetensors")


def test_gpt2_export_import_roundtrip(tok, tmp_path):
    vocab_file, merges_file = tok.export_gpt2(tmp_path / "readable")
    back = Tokenizer.from_gpt2(vocab_file, merges_file, pattern=tok.pattern)
    assert back.merges == tok.merges and back.vocab == tok.vocab and back.special_tokens == tok.special_tokens
    text = make_corpus(seed=6, n_words=100)
    assert back.encode(text) == tok.encode(text)


# --------------------------------------------------------------------------- encode_file


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(encode_corpus, "_PIECE_BYTES", 1500)  # many pieces from a small file


def test_encode_file_equals_encode(tok, tmp_path, small_pieces):
    data = make_corpus(seed=7, n_words=4000).encode() + b"\xff\xfe broken \x80 bytes <|endoftext|> end"
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    expected = tok.encode(data, allowed_special="all")
    ids = tok.encode_file(path, tmp_path / "ids.npy", workers=2, quiet=True, allowed_special="all")
    assert ids.dtype == np.uint16 and ids.tolist() == expected
    assert isinstance(ids, np.memmap)  # streamed to the file, not held in memory
    assert np.load(tmp_path / "ids.npy").tolist() == expected
    assert (
        tok.encode_file(path, tmp_path / "one.npy", workers=1, quiet=True, allowed_special="all").tolist() == expected
    )
    assert tok.encode_file(path, workers=1, quiet=True, allowed_special="all").tolist() == expected
    with pytest.raises(TokenizerError, match="special token"):
        tok.encode_file(path, workers=2, quiet=True)


@pytest.mark.parametrize("workers", [0, -1, 10**9, 2.0, True, "2"])
def test_encode_file_and_training_refuse_a_bad_worker_count_before_any_work(tok, tmp_path, workers):
    """workers is bounded (1 to common.processes.MAX_WORKERS): 10**9 would have listed 2 * 10**9 tasks
    (the corpus in memory) before starting any; the output file is never created."""
    path = tmp_path / "in.txt"
    path.write_bytes(b"hello world " * 100)
    with pytest.raises(TokenizerError, match="workers must be an integer from 1 to 1024"):
        tok.encode_file(path, tmp_path / "ids.npy", workers=workers, quiet=True)
    assert not (tmp_path / "ids.npy").exists()
    with pytest.raises(TokenizerError, match="workers must be an integer from 1 to 1024"):
        Tokenizer.train([path], vocab_size=260, workers=workers, quiet=True)


def test_encode_file_in_spawned_workers(tok, tmp_path, small_pieces, monkeypatch):
    """Where workers cannot inherit the tokenizer (spawn: macOS, Windows), each rebuilds it with
    its class's from_tensors, which bpe.encode_corpus is handed rather than imports (common/pool.py
    starts the workers)."""
    spawn = multiprocessing.get_context("spawn")
    monkeypatch.setattr(pool, "_context", lambda: spawn)
    path = tmp_path / "in.txt"
    path.write_bytes(make_corpus(seed=9, n_words=1500).encode())
    assert tok.encode_file(path, workers=2, quiet=True).tolist() == tok.encode(path.read_bytes())


def test_encode_file_custom_pattern_is_exact(tmp_path, small_pieces):
    tok = Tokenizer.train([make_corpus().encode()], vocab_size=300, pattern=r"\w+|\W+", workers=1, quiet=True)
    path = tmp_path / "in.txt"
    path.write_bytes(make_corpus(seed=8, n_words=2000).encode())
    assert tok.encode_file(path, workers=2, quiet=True).tolist() == tok.encode(path.read_bytes())


def test_encode_file_uint32_for_big_vocab(tmp_path):
    merges = [(a, b) for a in range(256) for b in range(256)]  # 65,536 merges: vocab 65,792
    tok = Tokenizer(merges)
    path = tmp_path / "in.txt"
    path.write_bytes(b"hello world")
    ids = tok.encode_file(path, quiet=True)
    assert ids.dtype == np.uint32 and ids.tolist() == tok.encode("hello world")


@settings(max_examples=80, deadline=None)
@given(text=st.text(alphabet="ab1 .'\n\t\u00a0é😀", max_size=60))
def test_cut_rule_keeps_the_split(text):
    """find_cut's first rule: before a space that follows printable ASCII, both built-in patterns split."""
    for pattern in ("gpt2", "gpt4"):
        whole = split_text(text, pattern)
        for i in range(1, len(text)):
            if text[i] == " " and "!" <= text[i - 1] <= "~":
                assert split_text(text[:i], pattern) + split_text(text[i:], pattern) == whole


def test_find_cut_skips_specials(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"aaa'<| x|> bb cc")  # an apostrophe before the special: no cut there either
    specials = [b"<| x|>"]
    cut = find_file_cut(path, 1, 16, specials, window=4)
    assert cut == path.read_bytes().index(b" bb")  # not the space inside the special
    assert find_file_cut(path, 1, 16, [], window=4) == path.read_bytes().index(b" x")
    path.write_bytes(b"no'spaces'here")  # no space, newline, or punctuation but apostrophes
    assert find_file_cut(path, 1, 14, [], window=4) is None


def test_ids_streamed_to_npy_equal_np_save(tmp_path):
    """Pieces written one by one, with the length filled in at the end, read back as np.save's."""
    from tokenkit.bpe import io as bpe_io

    rng = np.random.default_rng(3)
    for dtype in (np.uint16, np.uint32):
        pieces = [rng.integers(0, 60000, size=n).astype(dtype) for n in (5, 0, 1, 1000, 37)]
        consumed = []

        def lazily(pieces: list, consumed: list):
            for piece in pieces:
                consumed.append(len(piece))
                yield piece

        path = tmp_path / f"ids-{np.dtype(dtype).name}.npy"
        assert bpe_io.save_ids_stream(path, dtype, lazily(pieces, consumed)) == 1043
        assert consumed == [5, 0, 1, 1000, 37]
        back = np.load(path)
        assert back.dtype == dtype and np.array_equal(back, np.concatenate(pieces))
        assert bpe_io.load_ids(path).tolist() == back.tolist()
    bpe_io.save_ids_stream(tmp_path / "empty.npy", np.uint16, iter([]))
    assert np.load(tmp_path / "empty.npy").shape == (0,)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "empty.npy",
        "ids-uint16.npy",
        "ids-uint32.npy",
    ]  # no temp files


def test_docstring_examples():
    import doctest

    import tokenkit.bpe.bytelevel
    import tokenkit.bpe.cut
    import tokenkit.bpe.hf_import
    import tokenkit.bpe.interop
    import tokenkit.bpe.io
    import tokenkit.bpe.merge
    import tokenkit.bpe.patterns
    import tokenkit.bpe.pretokenize
    import tokenkit.bpe.regex_dialect
    import tokenkit.bpe.tokenizer
    import tokenkit.bpe.train_corpus
    import tokenkit.bpe.trainer

    for module in (
        tokenkit.bpe.bytelevel,
        tokenkit.bpe.cut,
        tokenkit.bpe.hf_import,
        tokenkit.bpe.interop,
        tokenkit.bpe.io,
        tokenkit.bpe.merge,
        tokenkit.bpe.patterns,
        tokenkit.bpe.pretokenize,
        tokenkit.bpe.regex_dialect,
        tokenkit.bpe.tokenizer,
        tokenkit.bpe.train_corpus,
        tokenkit.bpe.trainer,
    ):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
