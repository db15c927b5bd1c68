"""`tk eval -t`: tokenizers side by side. Each figure against a plain recount from the ids on random
texts, the token counts against HF tokenizers' and tiktoken's encodes of the same files (GPT-2's
tokenizer from ../shared/data, skipped when absent; tk's own exports without it), the bundled
language sample, and the command's one-line errors."""

from __future__ import annotations

import base64
import doctest
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import random_model

from tokenkit.bpe import Corpus, Tokenizer, TokenizerError, formats, tokenizer_eval
from tokenkit.bpe.tokenizer_eval import compare
from tokenkit.cli.main import main

ROOT = Path(__file__).parents[1]
LANGUAGES = ROOT / "corpora" / "languages.jsonl"
GPT2 = ROOT / ".." / "shared" / "data" / "gpt2"
needs_gpt2 = pytest.mark.skipif(not (GPT2 / "encoder.json").exists(), reason="../shared/data/gpt2 is not present")

# pieces of text in several scripts, with the whitespace str.split() splits at (and some it does not)
PIECES = ["the", " fox", "ran", "é", "Straße", "ночь", "μήλα", "كرة", "गेंद", "球", "ボール", "공", "12", "!",
          "..", "<|end|>", " ", "  ", "\n", "\t", "\u3000", "\u00a0", "\u200b", "\U0001f600",
          "def f(x):\n    return x"]  # fmt: skip


def random_texts(seed: int, n: int = 40) -> list[bytes]:
    rng = random.Random(seed)
    texts = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 60))).encode() for _ in range(n)]
    texts.append(bytes([0xC3, 0x20, 0xFF, 0x61]))  # not UTF-8: encoded as its bytes
    return texts


@pytest.fixture(scope="module")
def tokenizers() -> list[Tokenizer]:
    train = [t for s in range(3) for t in random_texts(100 + s)]
    return [
        Tokenizer.train(train, vocab_size=400, special_tokens=["<|end|>"], quiet=True),
        Tokenizer.train(train, vocab_size=300, pattern="none", quiet=True),
        Tokenizer([(97, 97)]),
    ]


def words_of(text: str) -> int:
    """Runs of characters that are not whitespace, counted one character at a time."""
    count, inside = 0, False
    for c in text:
        if c.isspace():
            inside = False
        elif not inside:
            count, inside = count + 1, True
    return count


def recount(tok: Tokenizer, docs: list[bytes], policy: dict) -> dict:
    """The figures from each document's ids, plainly."""
    specials = set(tok.special_tokens.values())
    ids = [i for d in docs for i in tok.encode(d, **policy)]
    ordinary = [i for i in ids if i not in specials]
    vocabulary = sum(1 for i in range(tok.vocab_size) if i not in specials and tok.decode_bytes([i]))
    seen = set(ordinary)
    longest = min(seen, key=lambda i: (-len(tok.decode_bytes([i])), i)) if seen else None
    n_bytes = sum(len(d) for d in docs)
    words = sum(words_of(d.decode("utf-8", errors="surrogateescape")) for d in docs)
    single = sum(1 for i in ordinary if len(tok.decode_bytes([i])) == 1)
    return {
        "tokens": len(ids),
        "bytes": n_bytes,
        "words": words,
        "documents": len(docs),
        "bytes_per_token": n_bytes / len(ids),
        "tokens_per_word": len(ids) / words if words else None,
        "vocabulary": vocabulary,
        "distinct_tokens": len(seen),
        "vocab_used": len(seen) / vocabulary,
        "single_byte_tokens": single,
        "single_byte_share": single / n_bytes,
        "longest_token_id": longest,
        "longest_token_bytes": None if longest is None else len(tok.decode_bytes([longest])),
    }


POLICIES = [
    {"allowed_special": (), "disallowed_special": ()},  # special-looking text as plain text
    {"allowed_special": "all", "disallowed_special": "all"},  # as the special token
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", POLICIES, ids=["as-text", "allowed"])
def test_each_figure_is_a_plain_recount_from_the_ids(tokenizers, seed, policy):
    docs = random_texts(seed)
    rng = random.Random(seed)
    groups = [rng.choice(["a", "b", "c"]) for _ in docs]
    result = compare(tokenizers, zip(groups, docs, strict=True), policy)
    for tok, figures in zip(tokenizers, result.total, strict=True):
        got = figures.to_dict()
        assert {k: got[k] for k in recount(tok, docs, policy)} == recount(tok, docs, policy)
        assert got["longest_token"] == tok.token_pieces([figures.longest_id])[0]
        assert figures.seconds > 0 and figures.mb_per_s == figures.bytes / figures.seconds / 1e6
    assert list(result.groups) == list(dict.fromkeys(groups))  # in the order they first appear
    for group, per_tok in result.groups.items():
        mine = [d for g, d in zip(groups, docs, strict=True) if g == group]
        for tok, figures in zip(tokenizers, per_tok, strict=True):
            got = figures.to_dict()
            assert {k: got[k] for k in recount(tok, mine, policy)} == recount(tok, mine, policy)
    assert sum(f[0].seconds for f in result.groups.values()) == pytest.approx(result.total[0].seconds)


def test_what_the_figures_do_not_count():
    tok = Tokenizer([(97, 97)], special_tokens=["<|x|>"])
    only_specials = compare([tok], [(None, b"<|x|><|x|>")], {"allowed_special": "all"}).total[0]
    assert only_specials.tokens == 2 and only_specials.single_byte == 0 and only_specials.distinct == 0
    assert only_specials.longest is None and only_specials.to_dict()["longest_token"] is None
    assert only_specials.words == 1 and only_specials.vocabulary == 257  # 256 bytes + "aa", the special aside
    blank = compare([tok], [(None, b""), (None, b"  \n")]).total[0]  # an empty document is skipped
    assert blank.documents == 1 and blank.words == 0 and blank.tokens_per_word is None
    with pytest.raises(TokenizerError, match="empty"):
        compare([tok], [(None, b"")])
    with pytest.raises(TokenizerError, match="at least one"):
        compare([], [(None, b"a")])
    with pytest.raises(TokenizerError, match="<|x|>"):  # refused unless the policy says how to read it
        compare([tok], [(None, b"a<|x|>")])


def test_doctests():
    assert doctest.testmod(tokenizer_eval).failed == 0
    assert doctest.testmod(formats).failed == 0


# ---------------------------------------------------------------------------------------- the command


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["eval", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def tok_files(tmp_path_factory, tokenizers) -> list[Path]:
    folder = tmp_path_factory.mktemp("toks")
    paths = [folder / "special.safetensors", folder / "nosplit.safetensors"]
    for tok, path in zip(tokenizers, paths, strict=False):
        tok.save(path)
    return paths


def test_json_is_what_compare_counts(tok_files, tokenizers, tmp_path, capsys):
    docs = random_texts(7, 12)
    lines = [json.dumps({"lang": ["x", "y"][i % 2], "text": d.decode("utf-8", "replace")}) for i, d in enumerate(docs)]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, _ = run(capsys, "-t", tok_files[0], "-t", tok_files[1], "--by-language", "--specials-as-text",
                       tmp_path / "c.jsonl", "--json")  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    texts = [json.loads(line)["text"].encode() for line in lines]
    policy = {"allowed_special": (), "disallowed_special": ()}
    want = compare(tokenizers[:2], [(["x", "y"][i % 2], t) for i, t in enumerate(texts)], policy)
    names = ["special.safetensors", "nosplit.safetensors"]
    assert [t["name"] for t in doc["tokenizers"]] == names and doc["group_by"] == "lang"
    assert [t["vocab_size"] for t in doc["tokenizers"]] == [400, 300]
    speed = {"seconds", "mb_per_s"}  # measured again: only these differ
    for name, figures in zip(names, want.total, strict=True):
        assert {k: v for k, v in doc["results"][name].items() if k not in speed} == {
            k: v for k, v in figures.to_dict().items() if k not in speed
        }
    assert list(doc["groups"]) == ["x", "y"]
    for group, per_tok in want.groups.items():
        assert doc["groups"][group]["bytes"] == per_tok[0].bytes
        for name, figures in zip(names, per_tok, strict=True):
            assert doc["groups"][group]["results"][name]["tokens"] == figures.tokens
    assert doc["bytes"] == sum(map(len, texts)) and doc["documents"] == len(texts)


def test_table_has_a_column_per_tokenizer(tok_files, tokenizers, tmp_path, capsys):
    text = "Once upon a time, the fox ran. 球 ボール 공\n" * 20
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    code, out, _ = run(capsys, "-t", tok_files[0], "-t", tok_files[1], tmp_path / "t.txt")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"1 document, {len(text.encode()):,} bytes, {len(text.split()):,} words"
    assert lines[1].split() == ["special.safetensors", "nosplit.safetensors"]
    rows = {line[:17].strip(): line[17:].split("  ") for line in lines[2:]}
    rows = {k: [c.strip() for c in v if c.strip()] for k, v in rows.items()}
    figures = compare(tokenizers[:2], [(None, text.encode())]).total
    assert rows["tokens"] == [f"{f.tokens:,}" for f in figures]
    assert rows["bytes per token"] == [f"{f.bytes_per_token:.3f}" for f in figures]
    assert rows["vocabulary used"] == [f"{f.vocab_used:.1%} of {f.vocabulary:,}" for f in figures]
    assert rows["single-byte share"] == [f"{f.single_byte_share:.1%}" for f in figures]
    assert list(rows) == ["tokens", "bytes per token", "tokens per word", "vocabulary used", "single-byte share",
                          "longest token", "encode speed"]  # fmt: skip


def test_columns_line_up_in_a_terminal():
    """Wide characters take two columns, combining marks none: the second column starts at the same
    place on the screen in every row."""
    from tokenkit.bpe.tokenizer_eval import Figures
    from tokenkit.cli.eval_commands import _table, _width

    assert [_width(t) for t in ["abc", "球", "ボール", "क्", "कि", "e\u0301", "\u200b"]] == [3, 2, 6, 1, 2, 1, 0]
    wide = Figures(vocabulary=9, documents=1, bytes=9, words=1, tokens=3, distinct=1, longest="球ボ".encode())
    mark = Figures(vocabulary=9, documents=1, bytes=9, words=1, tokens=3, distinct=1, longest="किकि".encode())
    for first in (wide, mark):
        lines = _table(["first", "second"], [first, Figures(vocabulary=9, tokens=1, bytes=1)]).splitlines()
        starts = set()
        for line in lines:
            cells = [c.strip() for c in line.split("  ") if c.strip()]
            starts.add(_width(line[: line.rindex(cells[-1])]))
        assert len(starts) == 1, lines


def test_same_file_names_are_told_apart_by_their_folders(tokenizers, tmp_path, capsys):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        tokenizers[2].save(tmp_path / sub / "tok.safetensors")
    (tmp_path / "t.txt").write_text("aaa", encoding="utf-8")
    code, out, _ = run(capsys, "-t", tmp_path / "a/tok.safetensors", "-t", tmp_path / "b/tok.safetensors",
                       tmp_path / "t.txt", "--json")  # fmt: skip
    assert code == 0
    assert [t["name"] for t in json.loads(out)["tokenizers"]] == ["a/tok.safetensors", "b/tok.safetensors"]


def test_every_format_bpe_import_reads(tokenizers, tmp_path, capsys):
    """tk's file, a model file (its tokenizer), and its exports as GPT-2's pair, tokenizer.json (file
    and directory) and a .tiktoken (with its json, and bare with --pattern): the same counts."""
    tok = tokenizers[0]
    tok.save(tmp_path / "tok.safetensors")
    random_model(tmp_path / "model.safetensors", tok)
    for fmt in ("gpt2", "hf", "tiktoken"):
        tok.export(tmp_path / fmt, fmt)
    bare = tmp_path / "bare" / "r.tiktoken"
    bare.parent.mkdir()
    bare.write_bytes((tmp_path / "tiktoken" / "tokenizer.tiktoken").read_bytes())
    (tmp_path / "t.txt").write_bytes(b"".join(random_texts(3)).replace(b"<|end|>", b"<end>"))
    pair = f"{tmp_path / 'gpt2/vocab.json'},{tmp_path / 'gpt2/merges.txt'}"
    values = [tmp_path / "tok.safetensors", tmp_path / "model.safetensors", pair, tmp_path / "hf",
              tmp_path / "hf/tokenizer.json", tmp_path / "tiktoken/tokenizer.tiktoken", bare]  # fmt: skip
    args = [a for v in values for a in ("-t", v)]
    code, out, err = run(capsys, *args, "--pattern", tok.pattern, tmp_path / "t.txt", "--json")
    assert code == 0, err
    results = json.loads(out)["results"]
    want = compare([tok], [(None, (tmp_path / "t.txt").read_bytes())]).total[0].tokens
    assert len(results) == 7 and {r["tokens"] for r in results.values()} == {want}


def test_languages_sample():
    records = [json.loads(line) for line in LANGUAGES.read_text(encoding="utf-8").splitlines()]
    langs = ["en", "de", "fr", "es", "ru", "el", "ar", "hi", "zh", "ja", "ko", "python"]
    assert list(dict.fromkeys(r["lang"] for r in records)) == langs
    assert all(r["text"].strip() for r in records) and LANGUAGES.stat().st_size < 64_000
    made = subprocess.run(
        [sys.executable, str(ROOT / "corpora" / "make_languages.py"), "-o", "-"], capture_output=True, check=True
    )
    assert made.stdout == LANGUAGES.read_bytes()  # the file is what its generator writes
    compile(next(r["text"] for r in records if r["lang"] == "python"), "code", "exec")


# ------------------------------------------------------------------------------ agreement with the peers


def _by_group(path: Path) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        groups.setdefault(record["lang"], []).append(record["text"])
    return groups


def test_counts_equal_hf_tokenizers_on_tk_s_export(tokenizers, tmp_path, capsys):
    hf_lib = pytest.importorskip("tokenizers")
    tok = tokenizers[0]
    tok.save(tmp_path / "tok.safetensors")
    tok.export(tmp_path / "hf", "hf")
    hf = hf_lib.Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    code, out, _ = run(capsys, "-t", tmp_path / "tok.safetensors", "--by-language", LANGUAGES, "--json")
    assert code == 0
    doc = json.loads(out)
    for lang, texts in _by_group(LANGUAGES).items():
        assert doc["groups"][lang]["results"]["tok.safetensors"]["tokens"] == sum(len(hf.encode(t).ids) for t in texts)


@needs_gpt2
def test_counts_equal_hf_tokenizers_and_tiktoken_for_gpt2(tmp_path, capsys):
    hf_lib = pytest.importorskip("tokenizers")
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe
    from tokenizers import decoders, models, pre_tokenizers

    hf = hf_lib.Tokenizer(models.BPE.from_file(str(GPT2 / "vocab.json"), str(GPT2 / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.save(str(tmp_path / "tokenizer.json"))
    split = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    enc = tiktoken.Encoding("gpt2-local", pat_str=split, mergeable_ranks=load_tiktoken_bpe(str(GPT2 / "gpt2.tiktoken")),
                            special_tokens={})  # fmt: skip
    values = [
        GPT2,
        f"{GPT2 / 'encoder.json'},{GPT2 / 'vocab.bpe'}",
        tmp_path / "tokenizer.json",
        GPT2 / "gpt2.tiktoken",
    ]
    args = [a for v in values for a in ("-t", v)]
    tales = ROOT / "corpora" / "tiny_tales_test.txt"
    for corpus, extra in ((LANGUAGES, ["--by-language"]), (tales, [])):
        code, out, err = run(capsys, *args, "--pattern", "gpt2", *extra, corpus, "--json")
        assert code == 0, err
        doc = json.loads(out)
        groups = _by_group(corpus) if extra else {"all": [corpus.read_text(encoding="utf-8")]}
        for lang, texts in groups.items():
            results = doc["groups"][lang]["results"] if extra else doc["results"]
            hf_count = sum(len(hf.encode(t).ids) for t in texts)
            assert hf_count == sum(len(enc.encode_ordinary(t)) for t in texts)
            assert [r["tokens"] for r in results.values()] == [hf_count] * 4, lang
        assert doc["tokenizers"][0]["name"] == "gpt2" and doc["tokenizers"][0]["vocab_size"] == 50257


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "args, message",
    [
        (["{text}"], "give -m MODEL"),
        (["-m", "{tok}", "-t", "{tok}", "-t", "{tok}", "{text}"], "with -m"),
        (["-m", "{tok}", "--by-language", "{text}"], "are for comparing tokenizers"),
        (["-t", "{tok}", "--stride", "4", "{text}"], "--stride"),
        (["-t", "{tmp}/missing.safetensors", "{text}"], "not found"),
        (["-t", "{text}", "{text}"], "{text}"),  # a text file is no tokenizer
        (["-t", "{tmp}/bad.json", "{text}"], "bad.json"),
        (["-t", "{tmp}/bare.tiktoken", "{text}"], "--pattern"),
        (["-t", "{tok}", "--pattern", "gpt2", "{text}"], "--pattern is for"),
        (["-t", "a,b,c", "{text}"], "VOCAB,MERGES"),
        (["-t", "{tok}", "-t", "{tok}", "{text}"], "given twice"),
        (["-t", "{tok}", "{tmp}/empty.txt"], "empty"),
        (["-t", "{tok}", "{tmp}/missing.txt"], "not found"),
        (["-t", "{tok}", "--by-language", "{text}"], "not valid JSON"),
        (["-t", "{tok}", "--by-language", "{tmp}/nolang.jsonl"], "no field 'lang'"),
        (["-t", "{tok}", "--group-by", "topic", "{tmp}/nolang.jsonl"], "give --group-by"),
        (["-t", "{tok}", "--by-language", "--text-field", "body", "{tmp}/nolang.jsonl"], "give --text-field"),
        (["-t", "{tok}", "--by-language", "{tmp}/numlang.jsonl"], "is a JSON number"),
        (["-t", "{tok}", "{tmp}/special.txt"], "--allow-special"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args, message):
    Tokenizer([], special_tokens=["<|end|>"]).save(tmp_path / "tok.safetensors")
    (tmp_path / "text.txt").write_text("plain text, not JSON", encoding="utf-8")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "special.txt").write_text("a<|end|>", encoding="utf-8")
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    ranks = "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256))
    (tmp_path / "bare.tiktoken").write_text(ranks, encoding="utf-8")  # a valid rank file, but no pattern
    (tmp_path / "nolang.jsonl").write_text('{"text": "hi"}\n', encoding="utf-8")
    (tmp_path / "numlang.jsonl").write_text('{"text": "hi", "lang": 3}\n', encoding="utf-8")
    names = {"tmp": tmp_path, "tok": tmp_path / "tok.safetensors", "text": tmp_path / "text.txt"}
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run(capsys, *(a.format(**names) for a in args))
    assert code == 1 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and message.format(**names) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, nothing removed


def test_grouped_documents_skip_empty_texts_and_read_a_stream_once(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"g": "a", "t": "one"}\n{"g": "b", "t": ""}\n\n{"g": "a", "t": "two"}\n', encoding="utf-8")
    corpus = Corpus([path], text_field="t", group_field="g")
    assert list(corpus.grouped_documents()) == [("a", b"one"), ("a", b"two")]
    assert list(corpus.documents()) == [b"one", b"two"]
    with pytest.raises(TokenizerError, match="--group-by"):
        Corpus([path], group_field="g")  # without --text-field: not JSON lines
    with pytest.raises(TokenizerError, match="grouped_documents"):
        list(Corpus([path], text_field="t").grouped_documents())
