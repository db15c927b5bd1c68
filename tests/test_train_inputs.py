"""`tk train-model` / `tk pipeline` read corpora as people keep them (issue 13, the training side).

Directories, gzip and JSONL train what their plain twins train; `--eot` puts its id between
documents; `--val` validates on its own token file and is checked on resume; old (v1) run
directories still resume and stay up to date; bad inputs are one line and write nothing.
Stdin and pipes: tests/test_train_streams.py.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import signal_at_step

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint, data, train_state, trainlog
from tokenkit.pipeline.checkpoint import load_model
from tokenkit.pipeline.train_state import load_train_state

REPO = Path(__file__).resolve().parents[1]
EOT = "<|endoftext|>"
TINY = [
    "--n-layers",
    "1",
    "--n-heads",
    "2",
    "--d-model",
    "16",
    "--context-length",
    "8",
    "--batch-size",
    "4",
    "--steps",
    "4",
    "--warmup-steps",
    "1",
    "--eval-interval",
    "2",
    "--eval-batches",
    "2",
    "--workers",
    "1",
    "-q",
]


@pytest.fixture(scope="module")
def docs() -> list[str]:
    """Three documents: stories of the default corpus."""
    stories = (REPO / "corpora" / "tiny_tales.txt").read_text(encoding="utf-8").split("\n\n")
    return ["\n\n".join(stories[i : i + 6]) + "\n" for i in (0, 6, 12)]


@pytest.fixture(scope="module")
def files(docs, tmp_path_factory) -> dict[str, Path]:
    """The same text kept four ways, and a tokenizer with the separator token."""
    root = tmp_path_factory.mktemp("inputs")
    plain = root / "tales.txt"
    plain.write_text(docs[0], encoding="utf-8")
    packed = root / "tales.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    folder = root / "stories"
    folder.mkdir()
    for i, doc in enumerate(docs):
        (folder / f"{i}.txt").write_text(doc, encoding="utf-8")
    (folder / ".hidden").write_text("never read", encoding="utf-8")
    jsonl = root / "stories.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"meta": {"id": i}, "text": d}) + "\n" for i, d in enumerate(docs)), encoding="utf-8"
    )
    val = root / "val.txt"
    val.write_text(
        "\n\n".join((REPO / "corpora" / "tiny_tales.txt").read_text(encoding="utf-8").split("\n\n")[40:44]),
        encoding="utf-8",
    )
    tok = root / "tok.safetensors"
    Tokenizer.train(folder, vocab_size=300, special_tokens=[EOT], quiet=True).save(tok)
    return {"plain": plain, "gz": packed, "dir": folder, "jsonl": jsonl, "val": val, "tok": tok, "root": root}


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, fragment: str) -> None:
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]


def weights(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {k: v for k, v in load_file(str(path)).items() if not k.startswith("tokenizer.")}


def same_training(a: Path, b: Path) -> None:
    assert (a / "tokens.npy").read_bytes() == (b / "tokens.npy").read_bytes()
    for name in ("model.safetensors", "train_state.safetensors"):
        wa, wb = weights(a / name), weights(b / name)
        assert wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa), name
    steps = [
        [
            (r["step"], r.get("loss"), r.get("val_loss"))
            for r in trainlog.read_log(d / "log.jsonl")
            if r["type"] in ("step", "eval")
        ]
        for d in (a, b)
    ]
    assert steps[0] == steps[1]


# --- each way of keeping a corpus trains what its plain twin trains ----------------------------


def test_gzip_trains_the_plain_files_bit_for_bit(files, tmp_path, capsys):
    runs = {}
    for kind in ("plain", "gz"):
        runs[kind] = tmp_path / kind
        code, _, err = cli(capsys, "train-model", files[kind], "-t", files["tok"], "-o", runs[kind], *TINY)
        assert code == 0, err
    same_training(runs["plain"], runs["gz"])
    recorded = [load_train_state(runs[k] / checkpoint.STATE_FILE).data for k in ("plain", "gz")]
    assert (
        recorded[0]["corpus_fingerprint"]
        == recorded[1]["corpus_fingerprint"]
        == hashlib.sha256(files["plain"].read_bytes()).hexdigest()
    )
    assert recorded[1]["corpus"]["inputs"] == [str(files["gz"])]


def test_directory_and_jsonl_train_the_same_with_eot_between_documents(files, docs, tmp_path, capsys):
    d, j = tmp_path / "dir", tmp_path / "jsonl"
    code, _, err = cli(capsys, "train-model", files["dir"], "-o", d, "--eot", EOT, *TINY)  # trains its own tokenizer
    assert code == 0, err
    tok = Tokenizer.load(d / "tokenizer.safetensors")
    assert EOT in tok.special_tokens
    ids = np.load(d / "tokens.npy").tolist()
    eot = tok.special_tokens[EOT]
    assert ids.count(eot) == len(docs) - 1
    pieces, start = [], 0
    for i in [k for k, t in enumerate(ids) if t == eot] + [len(ids)]:
        pieces.append(tok.decode(ids[start:i]))
        start = i + 1
    assert pieces == docs  # each document encoded on its own, the separator between them

    code, _, err = cli(
        capsys,
        "train-model",
        files["jsonl"],
        "--text-field",
        "text",
        "-t",
        d / "tokenizer.safetensors",
        "-o",
        j,
        "--eot",
        EOT,
        *TINY,
    )
    assert code == 0, err
    same_training(d, j)
    spec = load_train_state(j / checkpoint.STATE_FILE).data["corpus"]
    assert spec["text_field"] == "text" and spec["eot"] == EOT

    code, out, _ = cli(capsys, "info", j / checkpoint.STATE_FILE)
    assert code == 0 and f"--text-field text, --eot '{EOT}'" in out


def test_several_inputs_are_read_in_order(files, tmp_path, capsys):
    run = tmp_path / "many"
    names = sorted(files["dir"].glob("*.txt"))
    code, _, err = cli(capsys, "train-model", names[2], names[0], "-t", files["tok"], "-o", run, "--eot", EOT, *TINY)
    assert code == 0, err
    tok = Tokenizer.load(files["tok"])
    expected = (
        tok.encode(names[2].read_text(encoding="utf-8"))
        + [tok.special_tokens[EOT]]
        + tok.encode(names[0].read_text(encoding="utf-8"))
    )
    assert np.load(run / "tokens.npy").tolist() == expected


# --- --val --------------------------------------------------------------------------------------


def test_val_corpus_is_used_recorded_and_checked_on_resume(files, tmp_path, capsys):
    run = tmp_path / "val"
    code, _, err = cli(capsys, "train-model", files["dir"], "-t", files["tok"], "-o", run, "--val", files["val"], *TINY)
    assert code == 0, err
    tok = Tokenizer.load(files["tok"])
    val_ids = np.load(run / "val_tokens.npy")
    assert val_ids.tolist() == tok.encode(files["val"].read_text(encoding="utf-8"))
    state = load_train_state(run / checkpoint.STATE_FILE)
    assert state.data["n_train"] == state.data["n_tokens"] == len(np.load(run / "tokens.npy"))  # nothing held out
    assert (
        state.data["n_val"] == len(val_ids)
        and state.data["val_fingerprint"] == hashlib.sha256(files["val"].read_bytes()).hexdigest()
    )
    cache = json.loads((run / "tokens.json").read_text(encoding="utf-8"))
    assert cache["val_tokens.npy"]["inputs"] == [str(files["val"])] and cache["val_tokens.npy"]["n_tokens"] == len(
        val_ids
    )

    # the model's validation loss is the loss on windows of the --val corpus
    model, _, meta = load_model(run)
    cfg = state.train_config
    batches = data.eval_batches(val_ids, cfg["eval_batches"], cfg["batch_size"], cfg["context_length"], cfg["seed"])
    assert meta["val_loss"] == pytest.approx(float(np.mean([model.loss(x, y) for x, y in batches])), rel=1e-5)

    code, out, _ = cli(capsys, "train-model", "--resume", run)
    assert code == 0 and "nothing left to train" in out
    moved = tmp_path / "moved_val.txt"
    moved.write_bytes(files["val"].read_bytes())
    code, out, _ = cli(capsys, "train-model", "--resume", run, "--val", moved)
    assert code == 0  # the same text elsewhere is the same validation corpus
    moved.write_text("another validation text " * 40, encoding="utf-8")
    code, _, err = cli(capsys, "train-model", "--resume", run, "--val", moved)
    one_line_error(code, err, "is not the one")
    code, _, err = cli(capsys, "train-model", "--resume", run, "--eot", EOT)
    one_line_error(code, err, "--eot '<|endoftext|>' contradicts the checkpoint")
    for flag in ("--allow-special", "--specials-as-text"):  # encoded refusing such text: it held none
        code, out, err = cli(capsys, "train-model", "--resume", run, flag)
        assert code == 0 and "nothing left to train" in out, err
    code, _, err = cli(
        capsys, "train-model", files["dir"], "-o", tmp_path / "x", "--val", files["val"], "--val-fraction", "0.2"
    )
    one_line_error(code, err, "--val and --val-fraction exclude each other")


def test_pipeline_up_to_date_checks_consider_val(files, tmp_path, capsys):
    run = tmp_path / "pipe"
    val = tmp_path / "val.txt"
    val.write_bytes(files["val"].read_bytes())
    sample = ["--vocab-size", "290", "-n", "4"]
    code, out, err = cli(capsys, "pipeline", files["dir"], "-o", run, *TINY, *sample, "--val", val)
    assert code == 0, err
    assert (run / "val_tokens.npy").exists()
    code, out, err = cli(capsys, "pipeline", files["dir"], "-o", run, *TINY[:-1], *sample, "--val", val)  # not quiet
    assert code == 0 and "encode: up to date" in err and "train: up to date" in err, err
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    code, _, err = cli(capsys, "pipeline", files["dir"], "-o", run, *TINY, *sample)  # no --val: held out instead
    one_line_error(code, err, "not up to date")
    val.write_text("a changed validation text " * 40, encoding="utf-8")
    code, _, err = cli(capsys, "pipeline", files["dir"], "-o", run, *TINY, *sample, "--val", val)
    one_line_error(code, err, "not up to date")
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # nothing touched


# --- old run directories ----------------------------------------------------------------------


def _to_v1(run: Path, corpus: Path) -> None:
    """Rewrite a run's records as tokenkit wrote them before corpus specs (one path + sha256)."""
    state = load_train_state(run / checkpoint.STATE_FILE)
    d = state.data
    state.data = {
        "corpus": str(corpus),
        "corpus_sha256": d["corpus_fingerprint"],
        "tokenizer_fingerprint": d["tokenizer_fingerprint"],
        "n_tokens": d["n_tokens"],
        "n_train": d["n_train"],
        "n_val": d["n_val"],
    }
    train_state.save_train_state(run / checkpoint.STATE_FILE, state)
    entry = json.loads((run / "tokens.json").read_text(encoding="utf-8"))["tokens.npy"]
    (run / "tokens.json").write_text(
        json.dumps(
            {
                "corpus": str(corpus),
                "corpus_sha256": entry["corpus_fingerprint"],
                "tokenizer_fingerprint": entry["tokenizer_fingerprint"],
                "n_tokens": entry["n_tokens"],
                "dtype": entry["dtype"],
            }
        ),
        encoding="utf-8",
    )
    stamp_path = run / checkpoint.PIPELINE_FILE
    if stamp_path.exists():
        stamp = json.loads(stamp_path.read_text(encoding="utf-8"))
        stamp_path.write_text(
            json.dumps(
                {
                    "corpus": str(corpus),
                    "corpus_sha256": stamp["corpus_fingerprint"],
                    "vocab_size": stamp["vocab_size"],
                    "tokenizer_fingerprint": stamp["tokenizer_fingerprint"],
                }
            ),
            encoding="utf-8",
        )


def test_v1_run_directory_resumes_bit_for_bit(files, tmp_path, monkeypatch, capsys):

    flags = [*TINY[:-1], "--steps", "6"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main([str(a) for a in ("train-model", files["plain"], "-t", files["tok"], "-o", whole, *flags)]) == 0
    restore = signal_at_step(monkeypatch, 3)
    code, _, err = cli(capsys, "train-model", files["plain"], "-t", files["tok"], "-o", split, *flags)
    assert code == 130, err
    restore()
    _to_v1(split, files["plain"])
    tokens_before = (split / "tokens.npy").stat().st_mtime_ns
    code, out, err = cli(capsys, "train-model", "--resume", split)
    assert code == 0 and "step 6/6" in out, err
    assert (split / "tokens.npy").stat().st_mtime_ns == tokens_before  # the v1 cache was reused
    same_training(whole, split)
    assert (whole / "train_state.safetensors").read_bytes() == (split / "train_state.safetensors").read_bytes()


def test_v1_pipeline_directory_is_up_to_date(files, tmp_path, capsys):
    run = tmp_path / "pipe"
    flags = [*TINY[:-1], "--vocab-size", "290", "-n", "4"]  # not quiet: the stages say what they did
    assert main([str(a) for a in ("pipeline", files["plain"], "-o", run, *flags)]) == 0
    _to_v1(run, files["plain"])
    capsys.readouterr()
    code, _, err = cli(capsys, "pipeline", files["plain"], "-o", run, *flags)
    assert code == 0, err
    assert "tokenizer: up to date" in err and "encode: up to date" in err and "train: up to date" in err


# --- bad input --------------------------------------------------------------------------------


def test_bad_inputs_are_one_line_and_write_nothing(files, tmp_path, capsys):
    run = tmp_path / "run"
    empty = tmp_path / "empty"
    empty.mkdir()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n', encoding="utf-8")
    no_eot = tmp_path / "plain_tok.safetensors"
    Tokenizer.train(files["plain"], vocab_size=280, quiet=True).save(no_eot)
    cases = [
        (["train-model", files["plain"], tmp_path / "missing.txt"], "not found"),
        (["train-model", "-", "--val", "-"], "stdin (-) is given twice"),
        (["pipeline", fifo, "--val", fifo], "is given twice; it can be read only once"),
        (["train-model", empty], "holds no files"),
        (["train-model", files["dir"], "--glob", "*.md"], "holds no files matching --glob"),
        (["train-model", bad, "--text-field", "text"], "bad.jsonl:2: not valid JSON"),
        # a JSONL corpus's --val is read as JSON lines too: a plain text one is refused before any training
        (
            ["train-model", files["jsonl"], "--text-field", "text", "--val", files["plain"]],
            "(--text-field text reads it as JSON lines too)",
        ),
        (["pipeline", files["jsonl"], "--text-field", "text", "--val", files["plain"]], "--val: "),
        (["train-model", files["plain"], "-t", no_eot, "--eot", EOT], "not a special token of this tokenizer"),
        (["train-model", files["plain"], "--val", tmp_path / "nope.txt"], "--val: corpus file not found"),
        (
            ["pipeline", files["plain"], "--binary", "--text-field", "text"],
            "--binary and --text-field exclude each other",
        ),
    ]
    for argv, fragment in cases:
        code, _, err = cli(capsys, *argv, "-o", run, *TINY)
        one_line_error(code, err, fragment)
        assert not run.exists(), argv


# --- special-token text in the corpus -----------------------------------------------------------


@pytest.fixture
def spec_corpus(docs, tmp_path) -> tuple[Path, Path, str]:
    """A corpus with the text of the eot token between two stories, and its --val twin."""
    text = docs[0] + EOT + docs[1]
    corpus, val = tmp_path / "joined.txt", tmp_path / "joined_val.txt"
    corpus.write_text(text, encoding="utf-8")
    val.write_text(docs[2] + EOT + docs[0], encoding="utf-8")
    return corpus, val, text


def _drop_specials(run: Path) -> None:
    """Rewrite a run's records as tokenkit wrote them before the special-token policy was recorded."""
    state = load_train_state(run / checkpoint.STATE_FILE)
    del state.data["specials"], state.data["corpus"]["specials"]
    train_state.save_train_state(run / checkpoint.STATE_FILE, state)
    entries = json.loads((run / "tokens.json").read_text(encoding="utf-8"))
    for entry in entries.values():
        del entry["specials"]
    (run / "tokens.json").write_text(json.dumps(entries), encoding="utf-8")


def test_special_text_in_the_corpus_takes_the_flags_and_keys_the_cache(files, spec_corpus, tmp_path, capsys):
    corpus, val, text = spec_corpus
    tok = Tokenizer.load(files["tok"])
    eot_id = tok.special_tokens[EOT]
    run = tmp_path / "run"
    # without a flag: one line naming the flags, for the corpus and for --val; nothing written
    for argv in ([corpus], [files["plain"], "--val", val]):
        code, _, err = cli(capsys, "train-model", *argv, "-t", files["tok"], "-o", run, *TINY)
        one_line_error(code, err, "pass --allow-special; to encode it as plain text, pass --specials-as-text")
        assert not run.exists() or not any(run.iterdir()), argv
    code, _, err = cli(capsys, "train-model", corpus, "-o", run, *TINY, "--allow-special", "--specials-as-text")
    one_line_error(code, err, "exclude each other")

    # --allow-special: the special's id where the text had it
    code, _, err = cli(capsys, "train-model", corpus, "-t", files["tok"], "-o", run, *TINY, "--allow-special")
    assert code == 0, err
    ids = np.load(run / "tokens.npy")
    assert ids.tolist() == tok.encode(text, allowed_special="all") and int((ids == eot_id).sum()) == 1
    assert json.loads((run / "tokens.json").read_text(encoding="utf-8"))["tokens.npy"]["specials"] == "allow"
    # --resume keeps it (the cache is reused) and refuses another flag in one line
    before = (run / "tokens.npy").stat().st_mtime_ns
    code, _, err = cli(capsys, "train-model", "--resume", run, "-q")
    assert code == 0 and (run / "tokens.npy").stat().st_mtime_ns == before, err
    code, _, err = cli(capsys, "train-model", "--resume", run, "--specials-as-text")
    one_line_error(code, err, "--specials-as-text contradicts the checkpoint")
    code, out, _ = cli(capsys, "info", run / "train_state.safetensors")
    assert code == 0 and "(--allow-special)" in out, out

    # --specials-as-text: another policy, so the same corpus is encoded again, as its bytes
    code, _, err = cli(
        capsys, "train-model", corpus, "-t", files["tok"], "-o", run, *TINY[:-1], "--specials-as-text", "--overwrite"
    )
    assert code == 0 and "encode: encoded" in err, err
    ids = np.load(run / "tokens.npy")
    assert ids.tolist() == tok.encode(text, disallowed_special=()) and eot_id not in ids
    assert tok.decode(ids.tolist()) == text


def test_pipeline_takes_the_flags_and_old_runs_stay_up_to_date(files, spec_corpus, tmp_path, capsys):
    corpus, _, _ = spec_corpus
    run = tmp_path / "pipe"
    flags = [*TINY, "--vocab-size", "290", "-n", "2", "--eot", EOT]
    code, _, err = cli(capsys, "pipeline", corpus, "-o", run, *flags)
    one_line_error(code, err, "pass --allow-special; to encode it as plain text, pass --specials-as-text")
    assert not run.exists() or not any(run.iterdir())
    code, _, err = cli(capsys, "pipeline", corpus, "-o", run, *flags, "--allow-special")
    assert code == 0, err
    assert EOT in Tokenizer.load(run / "tokenizer.safetensors").special_tokens
    code, _, err = cli(capsys, "pipeline", corpus, "-o", run, *flags, "--specials-as-text")
    one_line_error(code, err, "--allow-special/--specials-as-text")  # a stale stage, as another --eot is

    # a run recorded before the policy was: read as the default (refuse), and up to date
    old = tmp_path / "old"
    flags = [*TINY[:-1], "--vocab-size", "290", "-n", "2"]
    assert main([str(a) for a in ("pipeline", files["plain"], "-o", old, *flags)]) == 0
    _drop_specials(old)
    capsys.readouterr()
    code, _, err = cli(capsys, "pipeline", files["plain"], "-o", old, *flags)
    assert code == 0 and "encode: up to date" in err and "train: up to date" in err, err
    code, out, err = cli(capsys, "train-model", "--resume", old)
    assert code == 0 and "nothing left to train" in out, err
