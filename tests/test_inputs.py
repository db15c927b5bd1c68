"""Corpora as people keep them (bpe/corpus.py): each format against its plain twin.

- gzip, bzip2, xz (and zstd when installed) train the byte-identical tokenizer and give the same
  ids as the plain text; a JSONL file as its documents saved as files; a directory as its files
  in sorted order; stdin and a pipe as the file.
- Documents are boundaries: counts and ids equal those of each document on its own (slow,
  obvious references on random documents), with --eot's id between documents.
- The one cut rule keeps every split, and never cuts a special token.
- Mistakes (corrupt or truncated compressed files, bad JSONL lines, devices, ...) are one line
  naming the place, exit code 1; a file that still looks binary after decompression is warned about.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import random
import subprocess
import sys
import tarfile
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkit.bpe import Tokenizer, TokenizerError, pretokenize
from tokenkit.bpe import encode_corpus as encode_module
from tokenkit.bpe.corpus import Corpus
from tokenkit.bpe.pretokenize import count_chunks, find_cut, split_text
from tokenkit.bpe.streams import zstd_available
from tokenkit.cli.main import main

REPO = Path(__file__).resolve().parents[1]
EOT = "<|endoftext|>"
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


def make_text(seed: int, n_words: int) -> str:
    rng = random.Random(seed)
    words = ["once", "upon", "a", "time", "the", "fox", "jumped", "über", "café", "日本語", "🙂", "it's", "42", EOT]
    seps = [" ", " ", " ", ", ", ".\n", "\n\n", "  ", "\t"]
    return "".join(rng.choice(words) + rng.choice(seps) for _ in range(n_words))


def make_docs(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [make_text(seed * 1000 + k, rng.randint(1, 300)) for k in range(n)]


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(result) -> str:
    code, _, err = result
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def train(sources, **options) -> Tokenizer:
    options = {"vocab_size": 330, "special_tokens": [EOT], "workers": 1, "quiet": True, **options}
    return Tokenizer.train(sources, **options)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plain") / "corpus.txt"
    path.write_bytes(make_text(0, 6000).encode() + b"\xff raw bytes \xc3")
    return path


@pytest.fixture(scope="module")
def tok(plain) -> Tokenizer:
    return train(plain)


def naive_counts(docs: list[bytes], pattern: str) -> dict[bytes, int]:
    """Each document split whole, on its own."""
    total: Counter = Counter()
    for doc in docs:
        total.update(
            c.encode("utf-8", "surrogateescape") for c in split_text(doc.decode("utf-8", "surrogateescape"), pattern)
        )
    return dict(total)


def naive_ids(tok: Tokenizer, docs: list[bytes], eot: int | None) -> list[int]:
    """Each document encoded whole, eot between documents."""
    ids: list[int] = []
    for k, doc in enumerate(d for d in docs if d):
        if k and eot is not None:
            ids.append(eot)
        ids.extend(tok.encode(doc, disallowed_special=()))
    return ids


# ------------------------------------------------------------------------------ compression

COMPRESSORS = {
    "gzip": gzip.compress,
    "bzip2": bz2.compress,
    "xz": lzma.compress,
    "gzip, two members": lambda data: gzip.compress(data[:1000]) + gzip.compress(data[1000:]),
}


@pytest.mark.parametrize("codec", list(COMPRESSORS) + ["zstd"])
def test_compressed_file_trains_and_encodes_like_its_plain_text(codec, plain, tok, tmp_path, monkeypatch):
    if codec == "zstd":
        if not zstd_available():
            pytest.skip("zstandard is not installed (pip install 'tokenkit[zstd]')")
        import zstandard

        data = zstandard.ZstdCompressor().compress(plain.read_bytes())
    else:
        data = COMPRESSORS[codec](plain.read_bytes())
    packed = tmp_path / "corpus.data"  # no telling extension: the format is found by its first bytes
    packed.write_bytes(data)
    assert train(packed).fingerprint() == tok.fingerprint()
    expected = tok.encode(plain.read_bytes(), disallowed_special=())
    monkeypatch.setattr(encode_module, "_PIECE_BYTES", 4096)  # pieces read here, encoded in 2 workers
    assert tok.encode_file(packed, workers=2, quiet=True, disallowed_special=()).tolist() == expected
    assert Corpus(packed).fingerprint() == Corpus(plain).fingerprint()


def test_cli_trains_the_same_file_from_gzip(plain, tmp_path, capsys):
    gz = tmp_path / "corpus.txt.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    for src, out in ((plain, "a.safetensors"), (gz, "b.safetensors")):
        code, stdout, err = run(
            capsys, "bpe-train", src, "--vocab-size", 300, "--workers", 1, "-q", "-o", tmp_path / out
        )
        assert code == 0 and err == ""
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert f"({plain.stat().st_size:,} bytes ->" in stdout  # the text's bytes, not the compressed ones


# ------------------------------------------------------------------------------ documents


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> None:
    lines = []
    for k, doc in enumerate(docs):
        record = {"id": k, "meta": {"lang": "en"}}
        if "." in field:
            record["meta"][field.split(".", 1)[1]] = doc
        else:
            record[field] = doc
        lines.append(json.dumps(record, ensure_ascii=k % 2 == 0))
    path.write_text(
        "\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n", encoding="utf-8"
    )  # a blank line is skipped


def write_files(directory: Path, docs: list[str]) -> list[Path]:
    directory.mkdir()
    paths = []
    for k, doc in enumerate(docs):
        paths.append(directory / f"doc{k:03d}.txt")
        paths[-1].write_text(doc, encoding="utf-8")
    return paths


@pytest.mark.parametrize("pattern", ["gpt2", "none"])
def test_jsonl_trains_like_its_documents_as_files(pattern, tmp_path):
    docs = make_docs(1, 25)
    write_jsonl(tmp_path / "docs.jsonl", docs, field="meta.text")
    files = write_files(tmp_path / "docs", docs)
    from_jsonl = train(Corpus(tmp_path / "docs.jsonl", text_field="meta.text"), pattern=pattern)
    assert from_jsonl.fingerprint() == train(files, pattern=pattern).fingerprint()
    if pattern == "gpt2":  # ... and not like the documents run together, where chunks cross documents
        joined = tmp_path / "joined.txt"
        joined.write_text("".join(docs), encoding="utf-8")
        assert train(joined, pattern=pattern).fingerprint() != from_jsonl.fingerprint()


def test_jsonl_gz_encodes_each_record_with_eot_between(tok, tmp_path, capsys):
    docs = make_docs(2, 30) + [""]  # an empty document is skipped, no separator for it
    write_jsonl(tmp_path / "docs.jsonl", docs)
    gz = tmp_path / "docs.jsonl.gz"
    gz.write_bytes(gzip.compress((tmp_path / "docs.jsonl").read_bytes()))
    eot = tok.special_tokens[EOT]
    expected = naive_ids(tok, [d.encode() for d in docs], eot)
    code, out, err = run(
        capsys,
        "encode",
        "-t",
        tok_file(tok, tmp_path),
        "-f",
        gz,
        "--text-field",
        "text",
        "--eot",
        EOT,
        "--specials-as-text",
        "-q",
        "-o",
        tmp_path / "ids.npy",
    )
    assert code == 0, err
    assert np.load(tmp_path / "ids.npy").tolist() == expected
    assert f"wrote {len(expected):,} tokens" in out
    assert (np.array(expected) == eot).sum() == 29  # between 30 documents; the texts' own <|endoftext|> are text


def tok_file(tok: Tokenizer, tmp_path: Path) -> Path:
    path = tmp_path / "tok.safetensors"
    if not path.exists():
        tok.save(path)
    return path


def test_directory_is_its_files_in_sorted_order(tok, tmp_path, monkeypatch):
    root = tmp_path / "tree"
    (root / "b" / "deep").mkdir(parents=True)
    (root / ".hidden_dir").mkdir()
    texts = {
        name: make_text(k, 50 + 40 * k)
        for k, name in enumerate(["a.txt", "a-z.txt", "b/deep/x.txt", "b/y.md", "c.txt"])
    }
    for name, text in texts.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / ".hidden.txt").write_text("secret", encoding="utf-8")
    (root / ".hidden_dir" / "z.txt").write_text("secret", encoding="utf-8")
    (root / "b" / "deep" / "loop").symlink_to(root, target_is_directory=True)  # a symlink loop: read once
    (root / "b" / "again.txt").symlink_to(root / "c.txt")  # the same file twice: read once
    order = sorted(texts, key=lambda n: n.encode())  # byte order: "a-z.txt" < "a.txt" < "b/..."
    corpus = Corpus(root)
    assert corpus.names == [repr(str(root / n)) for n in order]
    docs = [texts[n].encode() for n in order]
    assert train(root).fingerprint() == train([root / n for n in order]).fingerprint()
    eot = tok.special_tokens[EOT]
    monkeypatch.setattr(encode_module, "_PIECE_BYTES", 200)  # byte ranges of the files, in 2 workers
    ids = tok.encode_file(root, workers=2, quiet=True, disallowed_special=(), eot=EOT).tolist()
    assert ids == naive_ids(tok, docs, eot)
    assert Corpus(root, glob="*.txt").names == [repr(str(root / n)) for n in order if n.endswith(".txt")]
    # c.txt filtered out, its link is a path of its own
    assert Corpus(root, glob="b/*").names == [repr(str(root / n)) for n in ["b/again.txt", "b/deep/x.txt", "b/y.md"]]


@SETTINGS
@given(
    docs=st.lists(
        st.lists(st.sampled_from(["a", "b", " ", "  ", "\n", "é", "中", "'s", ".", "\xa0", "1", EOT]), max_size=40).map(
            "".join
        ),
        max_size=8,
    ),
    pattern=st.sampled_from(["gpt2", "gpt4", "none"]),
    piece_bytes=st.integers(1, 16),
)
def test_documents_count_and_encode_each_on_their_own(docs, pattern, piece_bytes, tok, tmp_path_factory):
    """Random documents as JSONL, cut into tiny pieces: counts and ids are those of each document whole."""
    path = tmp_path_factory.mktemp("docs") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    raw = [d.encode() for d in docs]
    saved = pretokenize._PIECE_BYTES, encode_module._PIECE_BYTES
    pretokenize._PIECE_BYTES = encode_module._PIECE_BYTES = piece_bytes
    try:
        if any(raw):
            assert count_chunks(Corpus(path, text_field="text"), pattern, workers=1, quiet=True) == naive_counts(
                raw, pattern
            )
        ids = tok.encode_file(Corpus(path, text_field="text"), workers=1, quiet=True, allowed_special="all", eot=EOT)
    finally:
        pretokenize._PIECE_BYTES, encode_module._PIECE_BYTES = saved
    expected = []
    for k, doc in enumerate(d for d in docs if d):
        expected += ([tok.special_tokens[EOT]] if k else []) + tok.encode(doc, allowed_special="all")
    assert ids.tolist() == expected


# ------------------------------------------------------------------------------ the cut rule


@settings(max_examples=150, deadline=None)
@given(
    parts=st.lists(
        st.sampled_from(
            [
                "a",
                "Zq",
                "é",
                "中文",
                "1",
                " ",
                "  ",
                "\n",
                "\n\n",
                "\r\n",
                "\t",
                "'s",
                ".",
                "!?",
                "\xa0",
                "\u3000",
                "\x85",
                '"',
                ",",
                "/",
                "_",
                "-(",
                "x9",
            ]
        ),
        max_size=40,
    ),
)
def test_every_cut_the_rule_allows_keeps_the_split(parts):
    buf = "".join(parts).encode()
    for i in range(1, len(buf)):
        if find_cut(buf, i, i + 1, last=False) == i:
            before, after = buf[:i].decode(), buf[i:].decode()  # a cut never splits a character
            for pattern in ("gpt2", "gpt4"):
                assert split_text(before, pattern) + split_text(after, pattern) == split_text(before + after, pattern)


def test_text_without_spaces_or_newlines_is_cut_before_punctuation_after_a_word():
    """Rule 3, for minified JSON and the like: only where rules 1 and 2 find nothing."""
    buf = b'{"key":1,"other":[2,3]}' * 4
    cuts = [i for i in range(1, len(buf)) if find_cut(buf, i, i + 1, last=False) == i]
    assert cuts and all(chr(buf[i - 1]).isalnum() and buf[i] in b'",:]}' for i in cuts)
    assert find_cut(b"one two,three", 0) == 3  # rule 1 wins: the space, not the comma
    assert find_cut(b"it's'x'y", 0) == -1  # never before an apostrophe


def test_a_long_stretch_without_a_cut_is_one_line_naming_its_file(tmp_path, monkeypatch):
    """Held whole, such a stretch would be split into chunks whole: refused past MAX_UNCUT_BYTES."""
    from tokenkit.bpe import cut

    monkeypatch.setattr(cut, "MAX_UNCUT_BYTES", 1 << 16)
    path = tmp_path / "dna.txt"
    path.write_bytes(b"ACGT" * (1 << 16))  # 256 KiB of letters, no place to cut
    with pytest.raises(TokenizerError, match=r"dna\.txt: \d+ MiB of text with no place where tk may cut it"):
        list(Corpus([path]).pieces(1 << 14))
    path.write_bytes(b"ACGT" * (1 << 14) + b"\n" + b"ACGT" * (1 << 14))  # a newline between: two pieces
    assert b"".join(p.data for p in Corpus([path]).pieces(1 << 14)) == path.read_bytes()


def test_no_cut_inside_a_special_token():
    buf = b"word <|end of text|> word\nword more words here"
    specials = [b"<|end of text|>"]
    assert find_cut(buf, 6, last=False) == 10  # without specials, before " of" is a fine place
    assert find_cut(buf, 6, last=False, specials=specials) == 20  # right after the special
    assert find_cut(buf, 0, last=False, specials=specials) == 4  # right before it
    assert all(find_cut(buf, i, i + 1, specials=specials) == -1 for i in range(6, 20))


# ------------------------------------------------------------------------------ streams


def tk(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`tk` through bash, so that `<(...)` and `<` work as in a terminal."""
    cli = f"{sys.executable} -m tokenkit.cli.main"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        ["bash", "-c", command.replace("tk ", cli + " ", 1)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_stdin_and_a_pipe_give_what_the_file_gives(plain, tok, tmp_path):
    tok_path = tok_file(tok, tmp_path)
    train_args = "--vocab-size 300 --workers 1 -q"
    for name, source in (("file", str(plain)), ("stdin", f"- < {plain}"), ("pipe", f"<(cat {plain})")):
        proc = tk(f"tk bpe-train {source} {train_args} -o {name}.safetensors", tmp_path)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert (
        (tmp_path / "file.safetensors").read_bytes()
        == (tmp_path / "stdin.safetensors").read_bytes()
        == (tmp_path / "pipe.safetensors").read_bytes()
    )
    proc = tk(f"tk encode -t {tok_path} -f <(gzip -c {plain}) --specials-as-text -q -o ids.npy", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert np.load(tmp_path / "ids.npy").tolist() == tok.encode(plain.read_bytes(), disallowed_special=())
    proc = tk(f"tk encode -t {tok_path} -f - --specials-as-text --json < {plain}", tmp_path)
    assert json.loads(proc.stdout) == tok.encode(plain.read_bytes(), disallowed_special=())


def test_a_stream_is_read_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    corpus = Corpus(fifo)  # opening is deferred to reading: no writer is needed yet
    writer = subprocess.Popen(["bash", "-c", f"printf 'a fifo text' > {fifo}"])
    try:
        assert list(corpus.documents()) == [b"a fifo text"]
    finally:
        writer.wait(timeout=10)
    with pytest.raises(TokenizerError, match="read only once"):
        list(corpus.documents())


# ------------------------------------------------------------------------------ mistakes


def damaged_gzip(tmp_path: Path, plain: Path) -> dict[str, Path]:
    data = gzip.compress(plain.read_bytes())
    truncated, corrupt = tmp_path / "truncated.gz", tmp_path / "corrupt.gz"
    truncated.write_bytes(data[: len(data) // 2])
    middle = len(data) // 2
    corrupt.write_bytes(data[:middle] + bytes(b ^ 0x55 for b in data[middle : middle + 64]) + data[middle + 64 :])
    return {"truncated": truncated, "corrupt": corrupt}


def test_damaged_compressed_files_are_one_line_naming_the_file(plain, tok, tmp_path, capsys):
    files = damaged_gzip(tmp_path, plain)
    line = one_line_error(
        run(capsys, "bpe-train", files["truncated"], "--vocab-size", 300, "-q", "-o", tmp_path / "t.safetensors")
    )
    assert "truncated.gz" in line and "ends early" in line and "gzip -t" in line
    line = one_line_error(
        run(capsys, "encode", "-t", tok_file(tok, tmp_path), "-f", files["corrupt"], "-q", "-o", tmp_path / "ids.npy")
    )
    assert "corrupt.gz" in line and "corrupt gzip data" in line and "gzip -t" in line
    assert not (tmp_path / "t.safetensors").exists() and not (tmp_path / "ids.npy").exists()
    bad_xz = tmp_path / "bad.xz"
    bad_xz.write_bytes(lzma.compress(b"some text " * 100)[:-20])
    assert "bad.xz" in one_line_error(run(capsys, "bpe-train", bad_xz, "-q", "-o", tmp_path / "t.safetensors"))


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            [b'{"text": "fine"}', b'{"text": "ok"}', b'{"text": "broken'],
            r"docs.jsonl:3: not valid JSON \(Unterminated string starting at, column 10\)",
        ),
        ([b'{"text": "fine"}', b'{"text": "caf\xe9"}'], r"docs.jsonl:2: not valid UTF-8 \(byte 0xe9 at column 14\)"),
        ([b'{"body": "no text field"}'], r"docs.jsonl:1: no field 'text' \(its fields: 'body'\)"),
        ([b'{"text": 42}'], r"docs.jsonl:1: field 'text' is a JSON number, not a string"),
        ([b'["a", "list"]'], r"docs.jsonl:1: a JSON array, not an object"),
        ([b'{"text": "\\ud800"}'], r"docs.jsonl:1: field 'text' holds a lone surrogate"),
        ([b"[" * 100_000], r"docs.jsonl:1: JSON nested too deep"),
    ],
)
def test_bad_jsonl_lines_are_one_line_with_their_number(lines, message, tmp_path, capsys):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    line = one_line_error(
        run(capsys, "bpe-train", path, "--text-field", "text", "-q", "-o", tmp_path / "t.safetensors")
    )
    assert __import__("re").search(message, line), line


def test_other_mistakes_are_one_line(tok, tmp_path, capsys):
    tok_path = tok_file(tok, tmp_path)
    out = tmp_path / "t.safetensors"
    assert "'/dev/zero' is a device" in one_line_error(run(capsys, "bpe-train", "/dev/zero", "-o", out))
    assert "'/dev/zero' is a device" in one_line_error(
        run(capsys, "encode", "-t", tok_path, "-f", "/dev/zero", "-o", tmp_path / "i.npy")
    )
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".hidden").write_text("x", encoding="utf-8")
    assert "holds no files" in one_line_error(run(capsys, "bpe-train", tmp_path / "empty", "-o", out))
    (tmp_path / "empty" / "a.md").write_text("x", encoding="utf-8")
    assert "matching --glob '*.txt'" in one_line_error(
        run(capsys, "bpe-train", tmp_path / "empty", "--glob", "*.txt", "-o", out)
    )
    line = one_line_error(
        run(capsys, "encode", "-t", tok_path, "-f", tmp_path / "empty", "--eot", "<|nope|>", "-o", tmp_path / "i.npy")
    )
    assert "--eot '<|nope|>' is not a special token of this tokenizer (it has: <|endoftext|>)" in line
    assert "exclude each other" in one_line_error(
        run(capsys, "bpe-train", tok_path, "--binary", "--text-field", "t", "-o", out)
    )
    assert "for -f FILE" in one_line_error(run(capsys, "encode", "-t", tok_path, "hi", "--eot", EOT))
    assert "stdin (-) is given twice" in one_line_error(run(capsys, "bpe-train", "-", "-", "-o", out))


def test_mpi_refuses_what_only_one_process_can_read(plain, tmp_path):
    from tokenkit.bpe import distributed

    class OneRank:  # enough of a communicator to get to the refusal
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 2

    gz = tmp_path / "c.gz"
    gz.write_bytes(gzip.compress(b"text"))
    with pytest.raises(TokenizerError, match="under MPI give plain text files"):
        distributed.train(OneRank(), Corpus(gz), vocab_size=300)
    assert Corpus([plain, tmp_path]).plain_files() is None  # c.gz is in tmp_path
    assert Corpus(plain).plain_files() == [(str(plain), plain.stat().st_size)]


# ------------------------------------------------------------------------------ not text


def test_an_archive_after_decompression_is_warned_about(plain, tmp_path, capsys):
    tar_gz = tmp_path / "corpus.tar.gz"
    with tarfile.open(tar_gz, "w:gz") as tar:
        tar.add(plain, arcname="corpus.txt")
    code, _, err = run(
        capsys, "bpe-train", tar_gz, "--vocab-size", 260, "--workers", 1, "-q", "-o", tmp_path / "t.safetensors"
    )
    assert code == 0
    assert err.splitlines() == [
        f"warning: {str(tar_gz)!r} looks like a tar archive after gzip decompression, not text; reading its bytes as "
        "they are (--binary reads files raw on purpose, without this warning)"
    ]
    zipped = tmp_path / "corpus.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.write(plain, "corpus.txt")
    _, _, err = run(
        capsys, "bpe-train", zipped, "--vocab-size", 260, "--workers", 1, "-q", "-o", tmp_path / "z.safetensors"
    )
    assert "looks like a zip archive, not text" in err
    warned = []
    Corpus(gzip_twice(tmp_path, plain), warn=warned.append)  # a .gz of a .gz: one layer is undone
    assert warned and "gzip-compressed data after gzip decompression" in warned[0]


def gzip_twice(tmp_path: Path, plain: Path) -> Path:
    path = tmp_path / "twice.gz.gz"
    path.write_bytes(gzip.compress(gzip.compress(plain.read_bytes())))
    return path


def test_binary_reads_a_gz_raw_without_warning(plain, tmp_path, capsys):
    gz = tmp_path / "corpus.txt.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    code, _, err = run(
        capsys,
        "bpe-train",
        gz,
        "--binary",
        "--vocab-size",
        300,
        "--workers",
        1,
        "-q",
        "-o",
        tmp_path / "raw.safetensors",
    )
    assert code == 0 and err == ""
    raw = train([gz.read_bytes()], vocab_size=300, special_tokens=[])
    assert Tokenizer.load(tmp_path / "raw.safetensors").fingerprint() == raw.fingerprint()
    assert raw.fingerprint() != train(plain, vocab_size=300, special_tokens=[]).fingerprint()


def test_fingerprint_follows_the_documents(plain, tmp_path):
    docs = make_docs(3, 4)
    write_jsonl(tmp_path / "d.jsonl", docs)
    files = write_files(tmp_path / "d", docs)
    joined = tmp_path / "joined.txt"
    joined.write_text("".join(docs), encoding="utf-8")
    assert (
        Corpus(tmp_path / "d.jsonl", text_field="text").fingerprint()
        == Corpus(files).fingerprint()
        == Corpus(tmp_path / "d").fingerprint()
    )
    assert Corpus(joined).fingerprint() != Corpus(files).fingerprint()
    import hashlib

    assert Corpus(plain).fingerprint() == hashlib.sha256(plain.read_bytes()).hexdigest()  # as sha256sum says
