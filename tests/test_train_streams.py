"""`tk train-model -` / `tk pipeline <(zcat c.gz)`: a run keeps a copy of its stream and reads that.

A stream (stdin, a FIFO, a process substitution, compressed or not) trains what its plain file
trains, byte for byte (only the corpus's recorded name differs), and is kept as it came in
RUN_DIR/corpus.stream (val.stream for --val); --resume reads the kept copy, or the same stream
given again, bit-exactly. Mistakes are one line, before the stream is read when they can be
(stdin twice, a terminal, a run directory in use by another run, mpirun); an empty or broken
stream leaves no file behind and the run directory as it was.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import signal_at_step
from safetensors.numpy import load_file
from test_inputs import tk
from test_train_inputs import EOT, REPO, TINY, cli, one_line_error

from tokenkit.bpe import Tokenizer
from tokenkit.pipeline import checkpoint, trainlog
from tokenkit.pipeline.train_state import load_train_state

STREAM = checkpoint.CORPUS_STREAM_FILE


@pytest.fixture(scope="module")
def texts() -> dict[str, bytes]:
    """A corpus (six stories of the default corpus), a validation text, and another corpus."""
    stories = (REPO / "corpora" / "tiny_tales.txt").read_text(encoding="utf-8").split("\n\n")
    return {
        "corpus": "\n\n".join(stories[:6]).encode(),
        "val": "\n\n".join(stories[40:43]).encode(),
        "other": "\n\n".join(stories[20:26]).encode(),
    }


@pytest.fixture(scope="module")
def tok(texts, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tok.safetensors"
    Tokenizer.train(texts["corpus"] + texts["val"], vocab_size=300, special_tokens=[EOT], quiet=True).save(path)
    return path


def piped(monkeypatch, data: bytes) -> io.BytesIO:
    """`data` on stdin, as `tk ... - < file` gives it; returns the bytes behind it (to see what was read)."""
    raw = io.BytesIO(data)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(raw))
    return raw


def fifo_with(path: Path, data: bytes) -> Path:
    """A named FIFO that a thread fills with `data` once a reader opens it."""
    os.mkfifo(path)
    threading.Thread(target=path.write_bytes, args=(data,), daemon=True).start()
    return path


def files_of(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".tk.lock"}


def temps(run: Path) -> list[str]:
    return [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def _meta(path: Path) -> dict:
    """A model or state file's metadata without the corpus's name (a path: here a stream's copy)."""
    meta = dict(checkpoint.read_header(path))
    for key in ("provenance", "data"):
        if key in meta:
            record = json.loads(meta[key])
            record.pop("corpus")
            meta[key] = record
    return meta


def same_run(a: Path, b: Path) -> None:
    """Run b wrote run a's files: token files and tokenizer byte for byte; model and state files
    tensor for tensor and in all their metadata but the corpus's name; the same losses."""
    for name in ("tokens.npy", "val_tokens.npy", "tokenizer.safetensors"):
        assert (a / name).exists() == (b / name).exists(), name
        if (a / name).exists():
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    for name in ("model.safetensors", "train_state.safetensors"):
        ta, tb = load_file(str(a / name)), load_file(str(b / name))
        assert ta.keys() == tb.keys(), name
        for key in ta:
            assert ta[key].dtype == tb[key].dtype and ta[key].tobytes() == tb[key].tobytes(), (name, key)
        assert _meta(a / name) == _meta(b / name), name
    steps = [
        [
            (r["step"], r.get("loss"), r.get("val_loss"))
            for r in trainlog.read_log(d / "log.jsonl")
            if r["type"] in ("step", "eval")
        ]
        for d in (a, b)
    ]
    assert steps[0] == steps[1] and steps[0]


# --- a stream trains what its file trains ----------------------------------------------------


def test_stdin_and_a_fifo_train_what_the_file_trains(texts, tmp_path, capsys, monkeypatch):
    plain = tmp_path / "tales.txt"
    plain.write_bytes(texts["corpus"])
    runs = {kind: tmp_path / kind for kind in ("file", "stdin", "fifo")}
    code, _, err = cli(
        capsys, "train-model", plain, "-o", runs["file"], *TINY
    )  # no -t: a tokenizer trained on the corpus
    assert code == 0, err
    piped(monkeypatch, texts["corpus"])
    code, _, err = cli(capsys, "train-model", "-", "-o", runs["stdin"], *TINY)
    assert code == 0, err
    fifo = fifo_with(tmp_path / "tales.fifo", texts["corpus"])
    code, _, err = cli(capsys, "train-model", fifo, "-o", runs["fifo"], *TINY)
    assert code == 0, err

    mask = os.umask(0)
    os.umask(mask)
    for kind, origin in (("stdin", "stdin"), ("fifo", f"pipe {fifo}")):
        run = runs[kind]
        same_run(runs["file"], run)
        kept = run / STREAM
        assert kept.read_bytes() == texts["corpus"] and stat.S_IMODE(kept.stat().st_mode) == 0o666 & ~mask
        assert temps(run) == []
        spec = load_train_state(run / checkpoint.STATE_FILE).data["corpus"]
        assert spec["inputs"] == [str(kept)] and spec["streams"] == {str(kept): origin}
        assert json.loads((run / "tokens.json").read_text(encoding="utf-8"))["tokens.npy"]["inputs"] == [str(kept)]
    assert "streams" not in load_train_state(runs["file"] / checkpoint.STATE_FILE).data["corpus"]
    code, out, _ = cli(capsys, "info", runs["stdin"] / checkpoint.STATE_FILE)
    assert code == 0 and f"stdin ({runs['stdin'] / STREAM})" in out


def test_a_gzip_process_substitution_and_val_on_stdin_train_their_plain_twins(texts, tok, tmp_path, capsys):
    plain, val = tmp_path / "tales.txt", tmp_path / "val.txt"
    plain.write_bytes(texts["corpus"])
    val.write_bytes(texts["val"])
    twin, run = tmp_path / "twin", tmp_path / "run"
    code, _, err = cli(capsys, "train-model", plain, "-t", tok, "-o", twin, "--val", val, "--eot", EOT, *TINY)
    assert code == 0, err
    flags = " ".join(TINY)
    proc = tk(f"tk train-model <(gzip -c {plain}) -t {tok} -o {run} --val - --eot '{EOT}' {flags} < {val}", tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    same_run(twin, run)
    kept = (run / STREAM).read_bytes()
    assert kept[:2] == b"\x1f\x8b" and gzip.decompress(kept) == texts["corpus"]  # kept as it came: compressed
    assert (run / checkpoint.VAL_STREAM_FILE).read_bytes() == texts["val"]
    spec = load_train_state(run / checkpoint.STATE_FILE).data["corpus"]
    assert spec["val"] == [str(run / checkpoint.VAL_STREAM_FILE)] and spec["streams"][spec["val"][0]] == "stdin"
    assert spec["streams"][spec["inputs"][0]].startswith("pipe /dev/fd/")


# --- --resume ----------------------------------------------------------------------------------


def test_resume_reads_the_kept_copy_or_the_same_stream_again_bit_exactly(texts, tok, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run directories given relative to here, resumed from elsewhere
    flags = ["-t", tok, *TINY, "--steps", "6"]
    piped(monkeypatch, texts["corpus"])
    code, _, err = cli(capsys, "train-model", "-", "-o", "whole", *flags)
    assert code == 0, err
    for name in ("again", "kept"):
        piped(monkeypatch, texts["corpus"])
        undo = signal_at_step(monkeypatch, 3)
        code, _, err = cli(capsys, "train-model", "-", "-o", name, *flags)
        undo()
        assert code == 130, err
        assert (tmp_path / name / STREAM).read_bytes() == texts["corpus"]  # kept once the run started

    # the same stream again, in place of the recorded corpus: checked, then resumed
    before = files_of(tmp_path / "again")
    raw = piped(monkeypatch, texts["other"])
    code, _, err = cli(capsys, "train-model", "--resume", "again", "-", "-q")
    one_line_error(code, err, "is not the one")
    assert (
        raw.tell() == len(texts["other"]) and files_of(tmp_path / "again") == before and temps(tmp_path / "again") == []
    )
    piped(monkeypatch, texts["corpus"])
    code, out, err = cli(capsys, "train-model", "--resume", "again", "-")
    assert code == 0 and "step 6/6" in out, err
    same_run(tmp_path / "whole", tmp_path / "again")

    # no corpus given: the kept copy, found in the run directory from another working directory
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    kept = tmp_path / "kept" / STREAM
    kept.rename(tmp_path / "moved")
    code, _, err = cli(capsys, "train-model", "--resume", tmp_path / "kept")
    one_line_error(code, err, f"{kept} is missing")
    (tmp_path / "moved").rename(kept)
    code, out, err = cli(capsys, "train-model", "--resume", tmp_path / "kept")
    assert code == 0 and "step 6/6" in out, err
    same_run(tmp_path / "whole", tmp_path / "kept")
    streams = load_train_state(kept.parent / checkpoint.STATE_FILE).data["corpus"]["streams"]
    assert streams == {str(kept): "stdin"}  # recorded where it is now


# --- mistakes ----------------------------------------------------------------------------------


def test_an_empty_or_broken_stream_is_one_line_and_leaves_nothing(texts, tok, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    piped(monkeypatch, b"")
    one_line_error(*cli(capsys, "train-model", "-", "-t", tok, "-o", run, *TINY)[::2], "corpus stdin is empty")
    assert not run.exists()
    fifo = fifo_with(tmp_path / "fifo", b"")
    one_line_error(*cli(capsys, "pipeline", fifo, "-o", run, *TINY)[::2], f"corpus pipe {fifo} is empty")
    assert not run.exists()

    # a run directory with a run in it: nothing of it changes
    piped(monkeypatch, texts["corpus"])
    assert cli(capsys, "train-model", "-", "-t", tok, "-o", run, *TINY)[0] == 0
    before = files_of(run)
    piped(monkeypatch, b"")
    one_line_error(*cli(capsys, "train-model", "-", "-t", tok, "-o", run, "--overwrite", *TINY)[::2], "is empty")
    raw = piped(monkeypatch, texts["other"])
    one_line_error(
        *cli(capsys, "train-model", "-", "-t", tok, "-o", run, *TINY)[::2], "already holds files of another run"
    )
    assert raw.tell() == 0  # refused before the stream was read

    class CutShort(io.RawIOBase):  # a stream that gives a block, then Ctrl-C arrives
        def __init__(self):
            self.reads = 0

        def readable(self):
            return True

        def read(self, n=-1):
            self.reads += 1
            if self.reads > 1:
                raise KeyboardInterrupt
            return texts["other"]

    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=CutShort(), isatty=lambda: False))
    code, _, err = cli(capsys, "train-model", "-", "-t", tok, "-o", run, "--overwrite", *TINY)
    assert code == 130 and err.strip() == "interrupted", err
    assert files_of(run) == before and temps(run) == []


def test_stdin_twice_a_terminal_and_a_locked_run_are_one_line_before_reading(texts, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    raw = piped(monkeypatch, texts["corpus"])
    one_line_error(*cli(capsys, "train-model", "-", "--val", "-", "-o", run, *TINY)[::2], "stdin (-) is given twice")
    one_line_error(*cli(capsys, "pipeline", "-", "-", "-o", run, *TINY)[::2], "stdin (-) is given twice")
    assert raw.tell() == 0 and not run.exists()

    terminal = types.SimpleNamespace(buffer=io.BytesIO(b"typed"), isatty=lambda: True)
    monkeypatch.setattr(sys, "stdin", terminal)
    for argv in (
        ["train-model", "-", "-o", run, *TINY],
        ["pipeline", "-", "-o", run, *TINY],
        ["bpe-train", "-", "-o", tmp_path / "tok.safetensors"],
    ):  # bpe-train says the same
        one_line_error(*cli(capsys, *argv)[::2], "stdin (-) is a terminal")
    assert terminal.buffer.tell() == 0 and not run.exists()

    from test_run_dir import ENV, HOLD  # a process holding a run directory's lock

    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for argv in (["train-model", "-", "-o", run, *TINY], ["pipeline", "-", "-o", run, *TINY]):
            raw = piped(monkeypatch, texts["corpus"])
            one_line_error(*cli(capsys, *argv)[::2], f"is in use by process {holder.pid}")
            assert raw.tell() == 0 and temps(run) == []
    finally:
        holder.kill()
        holder.wait()


def test_under_mpirun_a_stream_is_refused_in_one_line(texts, tok, tmp_path):
    from test_mpi import ENV, _mpirun  # mpirun's path, or a skip without mpi4py or mpirun

    run = tmp_path / "run"
    cmd = [
        _mpirun(),
        "-n",
        "2",
        sys.executable,
        "-m",
        "tokenkit.cli.main",
        "train-model",
        "-",
        "-t",
        str(tok),
        "-o",
        str(run),
        *TINY,
    ]
    proc = subprocess.run(cmd, input=texts["corpus"], cwd=tmp_path, env=ENV, capture_output=True, timeout=60)
    stderr = proc.stderr.decode()
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and len(errors) == 1, stderr
    assert "under mpirun, stdin (-) cannot be a run's corpus" in errors[0] and "Traceback" not in stderr
    assert not run.exists()


# --- the pipeline ------------------------------------------------------------------------------


def test_pipeline_on_stdin_is_up_to_date_for_the_same_text_and_refuses_another(texts, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    flags = [*TINY[:-1], "--vocab-size", "290", "-n", "4"]  # not quiet: the stages say what they did
    piped(monkeypatch, texts["corpus"])
    code, _, err = cli(capsys, "pipeline", "-", "-o", run, *flags)
    assert code == 0, err
    assert (
        f"corpus: read {len(texts['corpus']):,} bytes from stdin, to keep as {run / STREAM} when the run starts" in err
    )
    assert (run / STREAM).read_bytes() == texts["corpus"]
    kept = (run / STREAM).stat()

    piped(monkeypatch, texts["corpus"])
    code, _, err = cli(capsys, "pipeline", "-", "-o", run, *flags)
    assert (
        code == 0 and "tokenizer: up to date" in err and "encode: up to date" in err and "train: up to date" in err
    ), err
    assert (run / STREAM).stat().st_ino == kept.st_ino and temps(run) == []  # the same copy, not written again
    plain = tmp_path / "tales.txt"
    plain.write_bytes(texts["corpus"])
    code, _, err = cli(capsys, "pipeline", plain, "-o", run, *flags)
    assert code == 0 and "train: up to date" in err, err  # the same text, from its file

    before = files_of(run)
    piped(monkeypatch, texts["other"])
    code, _, err = cli(capsys, "pipeline", "-", "-o", run, *flags)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(lines) == 1 and "a tokenizer trained on another corpus" in lines[0], err
    assert files_of(run) == before and temps(run) == []
    piped(monkeypatch, texts["other"])
    code, _, err = cli(capsys, "pipeline", "-", "-o", run, *flags, "--overwrite")
    assert code == 0, err
    assert (run / STREAM).read_bytes() == texts["other"] and temps(run) == []
    assert np.load(run / "tokens.npy").size > 0
