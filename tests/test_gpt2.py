"""GPT-2 conformance: the imported vocabulary must give GPT-2's own ids.

Reference ids come from tiktoken's test suite (openai/tiktoken tests/test_encoding.py). When
tiktoken is installed, many more references are made at test time, from GPT-2's mergeable ranks
in ../shared/data/gpt2/gpt2.tiktoken (no download). Skipped when the shared data is absent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkit.bpe import Tokenizer, TokenizerError

DATA = Path(__file__).parents[1] / ".." / "shared" / "data"
GPT2 = DATA / "gpt2"
GPT2_SPLIT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""  # as tiktoken writes it

pytestmark = pytest.mark.skipif(not (GPT2 / "encoder.json").exists(), reason="../shared/data/gpt2 is not present")
HYP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def gpt2() -> Tokenizer:
    return Tokenizer.from_gpt2(GPT2 / "encoder.json", GPT2 / "vocab.bpe")


@pytest.fixture(scope="module")
def tiktoken_gpt2():
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(GPT2 / "gpt2.tiktoken"))
    return tiktoken.Encoding(
        "gpt2-local", pat_str=GPT2_SPLIT, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )


def test_both_file_pairs_give_the_same_tokenizer(gpt2):
    other = Tokenizer.from_gpt2(GPT2 / "vocab.json", GPT2 / "merges.txt")
    assert other.fingerprint() == gpt2.fingerprint()
    assert gpt2.vocab_size == 50257 and len(gpt2.merges) == 50000
    assert gpt2.special_tokens == {"<|endoftext|>": 50256}


def test_tiktoken_reference_ids(gpt2):
    assert gpt2.encode("hello world") == [31373, 995]
    assert gpt2.decode([31373, 995]) == "hello world"
    assert gpt2.encode("hello <|endoftext|>", allowed_special="all") == [31373, 220, 50256]
    assert gpt2.encode("") == []


@pytest.mark.parametrize(
    "text, ids",
    [
        ("0", [15]),
        ("00", [405]),
        ("000", [830]),
        ("0000", [2388]),
        ("00000", [20483]),
        ("000000", [10535]),
        ("0000000", [24598]),
        ("00000000", [8269]),
        ("000000000", [10535, 830]),
        ("0000000000", [8269, 405]),
        ("00000000000", [8269, 830]),
        ("000000000000", [8269, 2388]),
        ("0000000000000", [8269, 20483]),
        ("00000000000000", [8269, 10535]),
        ("000000000000000", [8269, 24598]),
        ("0000000000000000", [25645]),
        ("00000000000000000", [8269, 10535, 830]),
    ],
)
def test_tiktoken_repeated_zeros(gpt2, text, ids):
    assert gpt2.encode(text) == ids


def test_endoftext_is_not_special_unless_allowed(gpt2):
    with pytest.raises(TokenizerError, match="<\\|endoftext\\|>"):
        gpt2.encode("a<|endoftext|>")
    assert 50256 not in gpt2.encode("a<|endoftext|>", disallowed_special=())


@pytest.mark.parametrize(
    "value", ["hello", "hello ", "hello  ", " hello", " hello ", " hello  ", "hello world", "请考试我的软件！12345"]
)
def test_basic_roundtrip(gpt2, value):
    assert gpt2.decode(gpt2.encode(value)) == value


@pytest.mark.parametrize("c", ["^", "0", "a", "'s", " ", "\n"])
def test_catastrophically_repetitive(gpt2, c):
    for value in (c * 10_000, " " + c * 10_000, " " + c * 10_000 + "\n"):
        assert gpt2.decode(gpt2.encode(value)) == value


def test_save_load_keeps_ids(gpt2, tmp_path):
    gpt2.save(tmp_path / "gpt2.safetensors")
    back = Tokenizer.load(tmp_path / "gpt2.safetensors")
    assert back.encode("hello world, it's 2024!") == gpt2.encode("hello world, it's 2024!")
    assert back.fingerprint() == gpt2.fingerprint()


def test_export_reimport(gpt2, tmp_path):
    vocab_file, merges_file = gpt2.export_gpt2(tmp_path)
    # byte-identical to the published vocab.json/merges.txt apart from JSON spacing and the header
    back = Tokenizer.from_gpt2(vocab_file, merges_file)
    assert back.fingerprint() == gpt2.fingerprint()
    assert (
        merges_file.read_text(encoding="utf-8").splitlines()[1:]
        == (GPT2 / "merges.txt").read_text(encoding="utf-8").splitlines()[1:]
    )


def test_wikitext_bytes_per_token(gpt2):
    path = DATA / "wikitext2" / "valid.txt"
    if not path.exists():
        pytest.skip("wikitext2/valid.txt is not present")
    data = path.read_bytes()
    # SOURCES.md: GPT-2 compresses this file to 4.34 bytes per token
    assert round(len(data) / len(gpt2.encode(data)), 2) == 4.34


def test_import_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="JSON"):
        Tokenizer.from_gpt2(bad, GPT2 / "vocab.bpe")
    with pytest.raises(TokenizerError, match="no such file"):
        Tokenizer.from_gpt2(tmp_path / "missing.json", GPT2 / "vocab.bpe")
    # merges of one vocabulary with the other's order: the ids do not line up
    swapped = tmp_path / "swapped.bpe"
    lines = (GPT2 / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    swapped.write_text("\n".join([lines[0], lines[2], lines[1]] + lines[3:]) + "\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match="do not belong together"):
        Tokenizer.from_gpt2(GPT2 / "encoder.json", swapped)


# ------------------------------------------------------------------ against tiktoken, when installed


@HYP
@given(text=st.text())
def test_equals_tiktoken_on_random_text(gpt2, tiktoken_gpt2, text):
    assert gpt2.encode(text, disallowed_special=()) == tiktoken_gpt2.encode_ordinary(text)


@HYP
@given(
    text=st.text(
        alphabet=st.sampled_from(list(" \n\t'sdmtllvere0123456789abcXYZéü日本😀.,!?-\u00a0\u2003")), max_size=200
    )
)
def test_equals_tiktoken_on_tricky_text(gpt2, tiktoken_gpt2, text):
    assert gpt2.encode(text) == tiktoken_gpt2.encode_ordinary(text)


@pytest.mark.parametrize("name", ["wikitext2/valid.txt", "gutenberg/valid.txt", "tinyshakespeare.txt"])
def test_equals_tiktoken_on_real_corpus(gpt2, tiktoken_gpt2, name):
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{name} is not present")
    text = path.read_bytes()[:300_000].decode("utf-8", errors="ignore")
    assert gpt2.encode(text) == tiktoken_gpt2.encode_ordinary(text)


# ------------------------------------------------------------------ against the plain merge (no peer needed)


IRREGULAR = ["  ", "   ", " \n", "\n ", "\n\n\n", "\r\n", "\t", " \t ", "\xa0 ", " \u2003", "\n    ", "'s ", " 's"]


@pytest.mark.parametrize("name", ["gutenberg/valid.txt", "wikitext2/valid.txt", "tinyshakespeare.txt"])
@pytest.mark.parametrize("fallback", [True, False])
def test_real_text_with_odd_spacing_equals_plain_merge(gpt2, name, fallback, monkeypatch):
    # windows of real text with irregular whitespace put in: the piece level (bpe.encoder.PieceCache,
    # also with its word-level fallback off) and a fresh tokenizer's cold caches give the ids of
    # the plain split-then-merge-each-chunk loop
    from tokenkit.bpe import encoder
    from tokenkit.bpe.pretokenize import split_text

    path = DATA / name
    if not path.exists():
        pytest.skip(f"{name} is not present")
    if not fallback:
        monkeypatch.setattr(encoder, "_MOSTLY_CLOSED", 0)
    text = path.read_bytes()[:400_000].decode("utf-8", errors="ignore")
    rng = np.random.default_rng(len(name) + fallback)
    tok = Tokenizer.from_tensors(*gpt2.to_tensors())  # cold caches
    for _ in range(6):
        start = int(rng.integers(0, len(text) - 6000))
        window = list(text[start : start + 6000])
        for at in sorted(rng.integers(0, len(window), 60).tolist(), reverse=True):
            window.insert(at, IRREGULAR[int(rng.integers(len(IRREGULAR)))])
        sample = "".join(window)
        plain = [i for chunk in split_text(sample, gpt2._pattern) for i in gpt2._chunk_ids(chunk)]
        assert tok.encode(sample) == plain
