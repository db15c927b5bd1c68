"""Tokenizers out and in: Hugging Face tokenizer.json and tiktoken rank files (issue 12).

Without the libraries, the written files are checked against their documented formats and read
back; with them (`pip install -e '.[interop]'`), HF `tokenizers`, transformers' AutoTokenizer and
tiktoken must give tk's exact ids and decodes on many random texts. Nothing is downloaded:
tokenizers are trained here or read from ../shared/data (skipped when absent).
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkit.bpe import Tokenizer, TokenizerError, interop
from tokenkit.bpe.io import bytes_to_unicode
from tokenkit.bpe.pretokenize import GPT2_PATTERN, GPT4_PATTERN
from tokenkit.cli.main import main

ROOT = Path(__file__).parents[1]
GPT2 = ROOT / ".." / "shared" / "data" / "gpt2"
SPECIALS = ["<|endoftext|>", "<|pad|>"]
CUSTOM = r"[a-zA-Z]+|[0-9]+"  # leaves spaces and punctuation between matches: those are chunks too
PATTERNS = ["gpt2", "gpt4", "none", CUSTOM]
HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

PIECES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),  # any unicode (no lone surrogates)
    st.text(" \t\n\r\x0b\x0c\u00a0\u3000", min_size=1, max_size=6),  # whitespace runs
    st.from_regex(r"[0-9]{1,9}", fullmatch=True),
    st.sampled_from(SPECIALS),
    st.sampled_from(
        ["Once upon a time", " there", " was", "it's", "don't", "I'll", "café", "日本語", " the fox", "!!", "\n\n"]
    ),
)
TEXTS = st.lists(PIECES, max_size=12).map("".join)


def corpus() -> bytes:
    text = (ROOT / "corpora" / "tiny_tales.txt").read_bytes()[:60_000]
    return text + "naïve café 日本語 12345 67890 it's  \n\n\t x ÿÿ €€ 😀😀".encode() * 20


@pytest.fixture(scope="module", params=PATTERNS, ids=["gpt2", "gpt4", "none", "custom"])
def tok(request) -> Tokenizer:
    return Tokenizer.train(
        [corpus()], vocab_size=400, pattern=request.param, special_tokens=SPECIALS, quiet=True, workers=1
    )


@pytest.fixture(scope="module")
def gpt2() -> Tokenizer:
    if not (GPT2 / "encoder.json").exists():
        pytest.skip("../shared/data/gpt2 is not present")
    return Tokenizer.from_gpt2(GPT2 / "encoder.json", GPT2 / "vocab.bpe")


@pytest.fixture(autouse=True)
def no_tiktoken_cache(monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken caches files by path; read ours fresh


def ids_of(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, allowed_special="all")  # HF and tiktoken (allowed_special="all") read every special


def permuted() -> Tokenizer:
    """A tokenizer whose ids 0-255 are the bytes reversed, with merges on top (an imported byte order)."""
    order = list(range(255, -1, -1))
    a, b, c, space = (order.index(ord(x)) for x in "abc ")
    return Tokenizer([(a, b), (256, c), (space, 257)], byte_order=order, special_tokens=["<|endoftext|>"])


# ---------------------------------------------------------------------------------------------
# formats, without the libraries


def test_tokenizer_json_follows_hf_format(tok, tmp_path):
    paths = tok.export_hf(tmp_path / "hf")
    assert [p.name for p in paths] == ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    data = json.loads(paths[0].read_text(encoding="utf-8"))
    table = bytes_to_unicode()
    names = ["".join(table[b] for b in t) for t in tok.vocab]
    model = data["model"]
    assert model["type"] == "BPE" and model["vocab"] == {n: i for i, n in enumerate(names)}
    assert model["merges"] == [f"{names[a]} {names[b]}" for a, b in tok.merges]
    assert (model["ignore_merges"], model["byte_fallback"], model["dropout"]) == (False, False, None)
    assert [(t["content"], t["id"], t["special"], t["normalized"]) for t in data["added_tokens"]] == [
        (s, i, True, False) for s, i in tok.special_tokens.items()
    ]
    assert data["decoder"]["type"] == "ByteLevel" and data["normalizer"] is None and data["post_processor"] is None
    pre = data["pre_tokenizer"]
    if tok.pattern == "gpt2":
        assert pre == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    elif tok.pattern == "none":
        assert pre["type"] == "ByteLevel" and pre["use_regex"] is False
    else:
        split, byte_level = pre["pretokenizers"]
        regex_ = GPT4_PATTERN if tok.pattern == "gpt4" else CUSTOM
        assert split == {"type": "Split", "pattern": {"Regex": regex_}, "behavior": "Isolated", "invert": False}
        assert byte_level["use_regex"] is False and byte_level["add_prefix_space"] is False
    config = json.loads(paths[1].read_text(encoding="utf-8"))
    assert config["clean_up_tokenization_spaces"] is False and config["eos_token"] == "<|endoftext|>"
    assert json.loads(paths[2].read_text(encoding="utf-8"))["additional_special_tokens"] == SPECIALS
    back = Tokenizer.from_hf(tmp_path / "hf")
    assert (back.merges, back.vocab, back.special_tokens, back.pattern) == (
        tok.merges,
        tok.vocab,
        tok.special_tokens,
        tok.pattern,
    )


def test_tiktoken_files_follow_tiktoken_format(tok, tmp_path):
    ranks_file, meta_file = tok.export_tiktoken(tmp_path / "tt")
    assert (ranks_file.name, meta_file.name) == ("tokenizer.tiktoken", "tokenizer_tiktoken.json")
    lines = ranks_file.read_bytes().splitlines()
    assert [(base64.b64decode(t, validate=True), int(r)) for t, r in (line.split(b" ") for line in lines)] == list(
        zip(tok.vocab, range(len(tok.vocab)))
    )
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    assert meta["special_tokens"] == tok.special_tokens and meta["pattern"] == tok.pattern
    assert meta["pat_str"] == {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN, "none": r"(?s:.+)"}.get(
        tok.pattern, interop.tiktoken_pat_str(CUSTOM)
    )
    back = Tokenizer.from_tiktoken(ranks_file)
    assert (back.merges, back.vocab, back.special_tokens, back.pattern) == (
        tok.merges,
        tok.vocab,
        tok.special_tokens,
        tok.pattern,
    )


@pytest.mark.parametrize("fmt", ["hf", "tiktoken"])
def test_imported_byte_order_survives(fmt, tmp_path):
    tok = permuted()
    tok.export(tmp_path, fmt)
    back = Tokenizer.from_hf(tmp_path) if fmt == "hf" else Tokenizer.from_tiktoken(tmp_path / "tokenizer.tiktoken")
    assert back.vocab == tok.vocab and back.merges == tok.merges
    assert back.encode(" ab ba") == tok.encode(" ab ba") != list(b" ab ba")


def test_gpt2_round_trips_through_both_formats(gpt2, tmp_path):
    gpt2.export_hf(tmp_path / "hf")
    ranks_file, _ = gpt2.export_tiktoken(tmp_path / "tt")
    assert ranks_file.read_bytes() == (GPT2 / "gpt2.tiktoken").read_bytes()  # byte for byte OpenAI's file
    from_tiktoken = Tokenizer.from_tiktoken(GPT2 / "gpt2.tiktoken", pattern="gpt2", special_tokens=["<|endoftext|>"])
    for back in (
        Tokenizer.from_hf(tmp_path / "hf"),
        Tokenizer.from_tiktoken(tmp_path / "tt" / "tokenizer.tiktoken"),
        from_tiktoken,
    ):
        assert back.to_tensors()[0].keys() == gpt2.to_tensors()[0].keys()
        assert (
            back.vocab == gpt2.vocab and back.merges == gpt2.merges and back.special_tokens == {"<|endoftext|>": 50256}
        )
        assert back.encode("hello world") == [31373, 995]


def test_refused_vocabularies(tmp_path):
    dup = Tokenizer([(97, 98), (256, 99), (98, 99), (97, 258)])  # 'abc' twice: ids 257 and 259
    for fmt in ("hf", "tiktoken"):
        with pytest.raises(TokenizerError, match="same bytes"):
            dup.export(tmp_path / fmt, fmt)
        assert not (tmp_path / fmt).exists()  # refused before anything is written
    # 'abc' is token 258 but its bytes merge into [256, 99]: tiktoken would look 258 up whole
    unreachable = Tokenizer([(97, 98), (98, 99), (97, 257)])
    with pytest.raises(TokenizerError, match=r"own bytes merge into \(\[256, 99\]\)"):
        unreachable.export_tiktoken(tmp_path / "u")
    unreachable.export_hf(tmp_path / "u")  # HF merges as we do: fine
    with pytest.raises(TokenizerError, match="spelled like token 97"):
        Tokenizer([], special_tokens=["a"]).export_hf(tmp_path / "s")
    with pytest.raises(TokenizerError, match="decode as other bytes"):
        Tokenizer([], special_tokens=["é<x>"]).export_hf(tmp_path / "s")
    for pattern in (r"\w*", r"\b", r"[a-z]+|(?=Q)"):  # empty matches: HF and tiktoken cut there, tk does not
        for fmt in ("hf", "tiktoken"):
            with pytest.raises(TokenizerError, match="matches the empty string"):
                Tokenizer([], pattern=pattern).export(tmp_path / "e", fmt)
    with pytest.raises(TokenizerError, match="unknown export format"):
        permuted().export(tmp_path / "x", "sentencepiece")


def hf_dict(**changes) -> dict:
    data = interop.to_hf(permuted().merges, [255 - i for i in range(256)], {"<|endoftext|>": 259}, GPT2_PATTERN)
    for path, value in changes.items():
        *keys, last = path.split("__")
        target = data
        for k in keys:
            target = target[k]
        target[last] = value
    return data


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"normalizer": {"type": "NFC"}}, "normalizer"),
        ({"pre_tokenizer__add_prefix_space": True}, "add_prefix_space"),
        ({"pre_tokenizer": {"type": "Whitespace"}}, "pre-tokenizer"),
        ({"model__type": "WordPiece"}, "not BPE"),
        ({"model__dropout": 0.1}, "dropout"),
        ({"model__merges": ["ab c", "a b", "Ġ abc"]}, "expected 256"),
        ({"post_processor": {"type": "TemplateProcessing"}}, "post-processor"),
        ({"added_tokens": [{"id": 300, "content": "<x>", "special": True}]}, "consecutive"),
        ({"added_tokens": [{"id": 259, "content": "<x>", "special": False}]}, "not special"),
        ({"model__vocab": {"a": 1}}, "byte token"),
        (
            {
                "pre_tokenizer": {
                    "type": "Sequence",
                    "pretokenizers": [
                        {"type": "Split", "pattern": {"Regex": r"\b"}, "behavior": "Isolated"},
                        {"type": "ByteLevel", "use_regex": False},
                    ],
                }
            },
            "empty string",
        ),
    ],
)
def test_unsupported_tokenizer_json_is_one_line(changes, words, tmp_path, capsys):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(hf_dict(**changes)), encoding="utf-8")
    with pytest.raises(TokenizerError, match=words):
        Tokenizer.from_hf(path)
    assert main(["bpe-import", str(path), "-o", str(tmp_path / "t.safetensors")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and not (tmp_path / "t.safetensors").exists()


@pytest.mark.parametrize(
    "content, words",
    [
        (b"YQ== 0\nnot base64!! 1\n", "expected 'base64-bytes rank'"),
        (
            b"".join(base64.b64encode(bytes([b])) + b" %d\n" % (b if b < 255 else 300) for b in range(256)),
            "without gaps",
        ),
        (
            b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(256)) + b"YWI= 256\nYWI= 257\n",
            "two ranks",
        ),
        (
            b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(256)) + b"YWJj 256\n",
            "not the merge of two",
        ),
    ],
)
def test_bad_tiktoken_files_are_one_line(content, words, tmp_path, capsys):
    path = tmp_path / "x.tiktoken"
    path.write_bytes(content)
    with pytest.raises(TokenizerError, match=words):
        Tokenizer.from_tiktoken(path, "gpt2")
    assert main(["bpe-import", str(path), "--pattern", "gpt2", "-o", str(tmp_path / "t.safetensors")]) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_cli_export_and_import_every_format(tmp_path, capsys):
    tok_path = tmp_path / "tok.safetensors"
    permuted().save(tok_path)
    expected = {
        "gpt2": f"wrote {tmp_path}/gpt2/vocab.json (260 tokens) and {tmp_path}/gpt2/merges.txt (3 merges)",
        "hf": f"wrote {tmp_path}/hf/tokenizer.json (260 tokens, 3 merges), tokenizer_config.json and special_tokens_map.json",
        "tiktoken": f"wrote {tmp_path}/tiktoken/tokenizer.tiktoken (259 ranks) and {tmp_path}/tiktoken/tokenizer_tiktoken.json (1 special token)",
    }
    for fmt, line in expected.items():
        assert main(["bpe-export", str(tok_path), "--format", fmt, "-o", str(tmp_path / fmt)]) == 0
        assert capsys.readouterr().out == line + "\n"
    for source in (
        ["gpt2"],
        ["gpt2/vocab.json", "gpt2/merges.txt"],
        ["hf"],
        ["hf/tokenizer.json"],
        ["tiktoken/tokenizer.tiktoken"],
    ):
        out = tmp_path / "back.safetensors"
        assert main(["bpe-import", *[str(tmp_path / s) for s in source], "-o", str(out)]) == 0
        assert (
            capsys.readouterr().out
            == f"wrote {out}: 256 bytes + 3 merges, specials: <|endoftext|>=259; vocab size 260\n"
        )
        assert Tokenizer.load(out).vocab == permuted().vocab
    (tmp_path / "afile").write_text("mine", encoding="utf-8")
    for args in (
        ["bpe-export", str(tok_path), "--format", "hf", "-o", str(tmp_path / "afile")],  # a file is never replaced
        ["bpe-import", str(tmp_path / "tiktoken" / "tokenizer.tiktoken"), "--pattern", "gpt4", "-o", str(out)],
        ["bpe-import", str(tmp_path / "hf"), "--pattern", "gpt4", "-o", str(out)],
        ["bpe-import", str(tmp_path), "-o", str(out)],  # a directory with no tokenizer in it
    ):
        assert main(args) == 1 and capsys.readouterr().err.count("\n") == 1
    assert (tmp_path / "afile").read_text(encoding="utf-8") == "mine"
    (tmp_path / "tiktoken" / "tokenizer_tiktoken.json").unlink()  # a bare rank file needs its pattern
    assert main(["bpe-import", str(tmp_path / "tiktoken" / "tokenizer.tiktoken"), "-o", str(out)]) == 1
    assert "--pattern" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# the real libraries (skipped when not installed)


@pytest.fixture(scope="module")
def hf_dir(tok, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("hf")
    tok.export_hf(directory)
    return directory


@HYP
@given(text=TEXTS, seed=st.integers(0, 2**32 - 1))
def test_hf_tokenizers_gives_tk_ids(tok, hf_dir, text, seed):
    tokenizers = pytest.importorskip("tokenizers")
    hf = _hf_cache.setdefault(hf_dir, tokenizers.Tokenizer.from_file(str(hf_dir / "tokenizer.json")))
    ids = ids_of(tok, text)
    assert hf.encode(text, add_special_tokens=False).ids == ids
    assert hf.decode(ids, skip_special_tokens=False) == text
    some = [random.Random(seed).randrange(tok.vocab_size) for _ in range(8)]  # any ids, half characters included
    assert hf.decode(some, skip_special_tokens=False) == tok.decode(some)


_hf_cache: dict = {}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS)
def test_transformers_autotokenizer_gives_tk_ids(tok, hf_dir, text):
    transformers = pytest.importorskip("transformers")
    auto = _hf_cache.get(("auto", hf_dir))
    if auto is None:
        auto = _hf_cache[("auto", hf_dir)] = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    ids = ids_of(tok, text)
    assert auto(text)["input_ids"] == ids
    assert auto.decode(ids) == text
    assert auto.eos_token_id == tok.special_tokens["<|endoftext|>"]


@HYP
@given(text=TEXTS)
def test_tiktoken_gives_tk_ids(tok, tmp_path_factory, text):
    tiktoken = pytest.importorskip("tiktoken")
    enc = _hf_cache.get(("tiktoken", id(tok)))
    if enc is None:
        from tiktoken.load import load_tiktoken_bpe

        ranks_file, meta_file = tok.export_tiktoken(tmp_path_factory.mktemp("tt"))
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        ranks = load_tiktoken_bpe(str(ranks_file))
        enc = tiktoken.Encoding(
            "tk", pat_str=meta["pat_str"], mergeable_ranks=ranks, special_tokens=meta["special_tokens"]
        )
        _hf_cache[("tiktoken", id(tok))] = enc
    ids = ids_of(tok, text)
    assert enc.encode(text, allowed_special="all") == ids
    assert enc.decode(ids) == text


def test_gpt2_export_equals_gpt2_in_both_libraries(gpt2, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    gpt2.export_hf(tmp_path / "hf")
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    ranks_file, meta_file = gpt2.export_tiktoken(tmp_path / "tt")
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    assert load_tiktoken_bpe(str(ranks_file)) == load_tiktoken_bpe(str(GPT2 / "gpt2.tiktoken"))  # OpenAI's own file
    enc = tiktoken.Encoding(
        "gpt2-tk",
        pat_str=meta["pat_str"],
        mergeable_ranks=load_tiktoken_bpe(str(ranks_file)),
        special_tokens=meta["special_tokens"],
    )
    text = (ROOT / "corpora" / "tiny_tales.txt").read_text(encoding="utf-8")[
        :100_000
    ] + " naïve 日本語 12345<|endoftext|>  \n"
    ids = ids_of(gpt2, text)
    assert hf.encode(text).ids == ids == enc.encode(text, allowed_special="all")


def test_import_a_tokenizer_trained_by_hf_tokenizers(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    hf.train_from_iterator([corpus().decode("utf-8")], trainer)
    hf.add_special_tokens(["<|endoftext|>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_hf(tmp_path / "tokenizer.json")
    assert tok.vocab_size == hf.get_vocab_size() and tok.special_tokens == {"<|endoftext|>": hf.get_vocab_size() - 1}

    @settings(max_examples=60, deadline=None)
    @given(text=TEXTS)
    def same_ids(text):
        assert hf.encode(text).ids == ids_of(tok, text)

    same_ids()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=100, deadline=None)
@given(where=st.lists(st.integers(0, 10**6), min_size=1, max_size=4), value=JSON_VALUES)
def test_damaged_tokenizer_json_loads_or_fails_in_one_line(where, value):
    """Any part of a tokenizer.json replaced by any JSON value: a tokenizer, or one-line TokenizerError."""
    data = hf_dict()
    node = data
    for k in where:  # walk to a random node, then replace one of its children
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = keys[k % len(keys)]
        if isinstance(node[key], (dict, list)) and k % 3:
            node = node[key]
            continue
        node[key] = value
        break
    try:
        interop.from_hf(data)
    except TokenizerError as err:
        assert "\n" not in str(err)


def test_import_gpt2_tokenizer_json_as_hf_builds_it(gpt2, tmp_path):
    """GPT-2 as HF publishes it: specials also in the model vocab, a ByteLevel post-processor, merges as pairs."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, processors

    hf = tokenizers.Tokenizer(models.BPE.from_file(str(GPT2 / "vocab.json"), str(GPT2 / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(["<|endoftext|>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_hf(tmp_path)
    assert tok.vocab == gpt2.vocab and tok.merges == gpt2.merges and tok.special_tokens == gpt2.special_tokens
    text = (ROOT / "corpora" / "tiny_tales.txt").read_text(encoding="utf-8")[
        :20_000
    ] + " naïve 12345<|endoftext|>\n\n  x"
    assert hf.encode(text).ids == ids_of(tok, text)
