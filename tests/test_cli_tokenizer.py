"""`tk bpe-train`, `tk encode`, `tk decode`, `tk bpe-import`, `tk bpe-export` through `cli.main.main`.

Outputs are checked against the Python API on the same files; every mistake must end with exit
code 1 and exactly one line on stderr.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main

GPT2 = Path(__file__).parents[1] / ".." / "shared" / "data" / "gpt2"
COMMANDS = ["bpe-train", "encode", "decode", "bpe-import", "bpe-export"]


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(result):
    code, _, err = result
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = ["once", "upon", "a", "time", "the", "fox", "jumped", "über", "café", "🙂", "<|endoftext|>"]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(4000)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok_path(corpus, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tok.safetensors"
    assert (
        main(
            [
                "bpe-train",
                str(corpus),
                "--vocab-size",
                "300",
                "--special",
                "<|endoftext|>",
                "--workers",
                "1",
                "-q",
                "-o",
                str(path),
            ]
        )
        == 0
    )
    return path


def test_bpe_train_summary(corpus, tmp_path, capsys):
    out_path = tmp_path / "t.safetensors"
    code, out, _ = run(
        capsys,
        "bpe-train",
        corpus,
        "--vocab-size",
        290,
        "--special",
        "<|endoftext|>",
        "--workers",
        1,
        "-q",
        "-o",
        out_path,
    )
    assert code == 0
    tok = Tokenizer.load(out_path)
    assert tok.vocab_size == 290
    assert f"256 bytes + {len(tok.merges)} merges + 1 special = vocab size 290" in out
    assert "stopped because the vocabulary reached --vocab-size" in out
    data = corpus.read_bytes()
    bpt = len(data) / len(tok.encode(data, disallowed_special=()))
    assert f"bytes per token on the corpus: {bpt:.2f}" in out


def test_bpe_train_min_frequency_and_verbose(corpus, tmp_path, capsys):
    out_path = tmp_path / "t.safetensors"
    code, out, _ = run(
        capsys, "bpe-train", corpus, "--min-frequency", 500, "--verbose", "--workers", 1, "-q", "-o", out_path
    )
    assert code == 0
    tok = Tokenizer.load(out_path)
    merge_lines = [line for line in out.splitlines() if line.startswith("merge ")]
    assert len(merge_lines) == len(tok.merges) > 0
    assert "fewer than --min-frequency" in out
    # each line shows the pair as text: check the first one against the tokenizer
    a, b = tok.merges[0]
    first = (
        f"merge 0: {tok.vocab[a].decode()!r} + {tok.vocab[b].decode()!r} -> {(tok.vocab[a] + tok.vocab[b]).decode()!r}"
    )
    assert merge_lines[0].startswith(first)
    count = int(re.search(r"count (\d+)", merge_lines[0]).group(1))
    assert count >= 500


@pytest.mark.parametrize(
    "args",
    [
        ["MISSING", "--vocab-size", "300"],
        ["DIR", "--vocab-size", "300"],
        ["EMPTY", "--vocab-size", "300"],
        ["CORPUS", "--vocab-size", "100"],
        ["CORPUS", "--vocab-size", "256", "--special", "<s>"],
        ["CORPUS", "--vocab-size", "notanumber"],
        ["CORPUS", "--pattern", "(unclosed"],
        ["CORPUS", "--min-frequency", "0"],
        ["CORPUS", "-o", "NODIR/tok.safetensors"],
    ],
)
def test_bpe_train_errors(corpus, tmp_path, capsys, args):
    (tmp_path / "empty.txt").write_bytes(b"")
    subst = {
        "MISSING": tmp_path / "missing.txt",
        "DIR": tmp_path,
        "EMPTY": tmp_path / "empty.txt",
        "CORPUS": corpus,
        "NODIR/tok.safetensors": tmp_path / "no" / "tok.safetensors",
    }
    args = [str(subst.get(a, a)) for a in args]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "t.safetensors")]
    assert_one_line_error(run(capsys, "bpe-train", *args, "--workers", "1", "-q"))


def test_encode_text_json_show(tok_path, capsys):
    tok = Tokenizer.load(tok_path)
    text = "once upon a time, über café 🙂"
    ids = tok.encode(text)
    code, out, _ = run(capsys, "encode", "-t", tok_path, text)
    assert code == 0 and out.split() == [str(i) for i in ids]
    code, out, _ = run(capsys, "encode", "-t", tok_path, "--json", text)
    assert code == 0 and json.loads(out) == ids
    code, out, _ = run(capsys, "encode", "-t", tok_path, "--show", text)
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(ids) + 1
    assert [int(line.split()[0]) for line in lines[:-1]] == ids
    assert lines[0].split(maxsplit=1)[1] == repr(tok.vocab[ids[0]].decode("utf-8", "backslashreplace"))


def test_encode_specials(tok_path, capsys):
    tok = Tokenizer.load(tok_path)
    eot = tok.special_tokens["<|endoftext|>"]
    line = assert_one_line_error(run(capsys, "encode", "-t", tok_path, "the end<|endoftext|>"))
    assert "--allow-special" in line and "--specials-as-text" in line
    code, out, _ = run(capsys, "encode", "-t", tok_path, "--allow-special", "the end<|endoftext|>")
    assert code == 0 and int(out.split()[-1]) == eot
    code, out, _ = run(capsys, "encode", "-t", tok_path, "--specials-as-text", "the end<|endoftext|>")
    assert code == 0 and str(eot) not in out.split()


def test_encode_file_to_npy_and_decode_back(tok_path, corpus, tmp_path, capsys):
    tok = Tokenizer.load(tok_path)
    ids_path = tmp_path / "ids.npy"
    code, out, _ = run(capsys, "encode", "-t", tok_path, "-f", corpus, "--allow-special", "-q", "-o", ids_path)
    assert code == 0 and "tokens (uint16)" in out
    ids = np.load(ids_path)
    assert ids.dtype == np.uint16
    assert ids.tolist() == tok.encode(corpus.read_bytes(), allowed_special="all")
    code, out, _ = run(capsys, "decode", "-t", tok_path, "-f", ids_path)
    assert code == 0 and out == corpus.read_text(encoding="utf-8") + "\n"


def test_encode_text_to_npy(tok_path, tmp_path, capsys):
    ids_path = tmp_path / "ids.npy"
    code, _, _ = run(capsys, "encode", "-t", tok_path, "-o", ids_path, "the fox")
    assert code == 0 and np.load(ids_path).tolist() == Tokenizer.load(tok_path).encode("the fox")


@pytest.mark.parametrize(
    "args",
    [
        [],  # neither TEXT nor -f
        ["text", "-f", "CORPUS"],  # both
        ["-f", "MISSING"],
        ["--allow-special", "--specials-as-text", "x"],
        ["-o", "NODIR/ids.npy", "x"],
    ],
)
def test_encode_errors(tok_path, corpus, tmp_path, capsys, args):
    subst = {"CORPUS": corpus, "MISSING": tmp_path / "missing.txt", "NODIR/ids.npy": tmp_path / "no" / "ids.npy"}
    assert_one_line_error(run(capsys, "encode", "-t", tok_path, *[str(subst.get(a, a)) for a in args]))


def test_bad_tokenizer_files(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    assert_one_line_error(run(capsys, "encode", "-t", bad, "x"))
    assert_one_line_error(run(capsys, "encode", "-t", tmp_path / "missing.safetensors", "x"))
    assert_one_line_error(run(capsys, "decode", "-t", tmp_path, "1"))
    assert_one_line_error(run(capsys, "encode", "x"))  # no -t


def test_decode_forms(tok_path, capsys):
    tok = Tokenizer.load(tok_path)
    ids = tok.encode("once upon a time")
    for args in ([str(i) for i in ids], [json.dumps(ids)], [",".join(map(str, ids))]):
        code, out, _ = run(capsys, "decode", "-t", tok_path, *args)
        assert code == 0 and out == "once upon a time\n"


@pytest.mark.parametrize("args", [["12", "abc"], ["99999"], ["-3"], [], ["-f", "NOTNPY"], ["1", "-f", "NOTNPY"]])
def test_decode_errors(tok_path, tmp_path, capsys, args):
    notnpy = tmp_path / "x.npy"
    notnpy.write_text("hello", encoding="utf-8")
    args = [str(notnpy) if a == "NOTNPY" else a for a in args]
    assert_one_line_error(run(capsys, "decode", "-t", tok_path, *args))


@pytest.mark.skipif(not (GPT2 / "encoder.json").exists(), reason="../shared/data/gpt2 is not present")
def test_bpe_import_both_pairs(tmp_path, capsys):
    for vocab, merges in (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")):
        out_path = tmp_path / f"{vocab}.safetensors"
        code, out, _ = run(capsys, "bpe-import", GPT2 / vocab, GPT2 / merges, "-o", out_path)
        assert code == 0 and "<|endoftext|>=50256" in out and "vocab size 50257" in out
        code, out, _ = run(capsys, "encode", "-t", out_path, "hello world")
        assert out.split() == ["31373", "995"]
    assert_one_line_error(run(capsys, "bpe-import", GPT2 / "vocab.bpe", GPT2 / "encoder.json", "-o", tmp_path / "x"))
    assert_one_line_error(
        run(capsys, "bpe-import", GPT2 / "encoder.json", tmp_path / "missing.bpe", "-o", tmp_path / "x")
    )
    assert_one_line_error(run(capsys, "bpe-import", GPT2 / "encoder.json", GPT2 / "vocab.bpe"))  # no -o


def test_bpe_export(tok_path, tmp_path, capsys):
    code, out, _ = run(capsys, "bpe-export", tok_path, "-o", tmp_path / "readable")
    assert code == 0 and "merges.txt" in out
    back = Tokenizer.from_gpt2(tmp_path / "readable" / "vocab.json", tmp_path / "readable" / "merges.txt")
    tok = Tokenizer.load(tok_path)
    assert back.merges == tok.merges and back.special_tokens == tok.special_tokens
    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert_one_line_error(run(capsys, "bpe-export", tok_path, "-o", tmp_path / "file"))


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_an_example(command, capsys):
    code, out, _ = run(capsys, command, "--help")
    assert code == 0 and "Example" in out and f"tk {command}" in out
