"""Commands that hang, eat memory or print tracebacks (issue 20): each class attacked from several sides.

1. Every file tk reads back goes through one bounded reader (`common.readfile`): a FIFO (with a
   writer that never writes), /dev/zero, /dev/urandom, /dev/null, a directory or a link to one,
   in the place of any file any command reads, is one line naming the path and what it is; a
   sparse file past its kind's size bound is refused before a byte is read; links to regular
   files are followed.
2. Files read back are damaged data: damaged lines of log.jsonl are dropped with one note,
   impossible values in train_state.safetensors and NaN weights in a model are one line, and
   damaged token and cache files are made again.
3. Numeric flags and settings refuse NaN, infinities and values out of range before any work,
   naming the flag; no NumPy warning reaches the terminal.
4. A full disk names the file and the free space; a dangling link in the place of an output is
   named as one and left alone.

The commands run in a child process (`tk_many`), each under a 20 s alarm and the child under a
memory cap: before these fixes they hung, ate memory or printed tracebacks, and here any of that
fails the test instead of stalling the suite. docs/files.md names these tests.
"""

from __future__ import annotations

import doctest
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from capped import one_line, run_capped
from conftest import HILL_WORDS  # the twelve words of test_run_dir's corpus

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main
from tokenkit.common import atomic, readfile, safetensors_file
from tokenkit.pipeline import checkpoint, train_state, trainlog
from tokenkit.pipeline.config import MAX_WORKERS

CALL_SECONDS = 20
TINY = ["--n-layers", "1", "--n-heads", "2", "--d-model", "32", "--context-length", "16", "--batch-size", "4"]
TINY += ["--eval-batches", "2", "--warmup-steps", "1", "--workers", "1"]


def tk_many(calls: list[list], seconds: int = CALL_SECONDS) -> list[tuple]:
    """(exit code | "hung" | "raised", stdout, stderr) of `tk ARGV` for each argv, in one capped child process."""
    return [r[:3] for r in run_capped(calls, seconds)]


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    """A corpus, a tokenizer and its exports, an ids file, a resumable run, a pipeline run and a
    transformers directory, all tiny; tests copy what they damage."""
    root = tmp_path_factory.mktemp("base")
    rng = np.random.default_rng(3)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(HILL_WORDS, size=10)) for _ in range(400)) + "\n", encoding="utf-8")
    tok = root / "tok.safetensors"
    Tokenizer.train([corpus.read_bytes()], vocab_size=300, special_tokens=["<|endoftext|>"]).save(tok)
    run, pipe = root / "run", root / "pipe"
    quiet = ["-q"]
    assert main(["train-model", str(corpus), "-t", str(tok), "-o", str(run), *TINY, "--steps", "4", *quiet]) == 0
    # resumable: the recorded run asks for more steps than it has trained
    state = train_state.load_train_state(run / checkpoint.STATE_FILE)
    state.train_config["steps"] = 8
    train_state.save_train_state(run / checkpoint.STATE_FILE, state)
    assert main(["pipeline", str(corpus), "-o", str(pipe), "--vocab-size", "300", *TINY, "--steps", "2", *quiet]) == 0
    for argv in (
        ["export-hf", run, "-o", root / "hf"],
        ["bpe-export", tok, "-o", root / "gpt2"],
        ["bpe-export", tok, "--format", "tiktoken", "-o", root / "tiktoken"],
        ["encode", "-t", tok, "-f", corpus, "-o", root / "ids.npy", "--workers", "1", "-q"],
    ):
        assert main([str(a) for a in argv]) == 0
    return {
        "root": root,
        "corpus": corpus,
        "tok": tok,
        "run": run,
        "model": run / checkpoint.MODEL_FILE,
        "pipe": pipe,
        "hf": root / "hf",
        "gpt2": root / "gpt2",
        "tiktoken": root / "tiktoken",
        "ids": root / "ids.npy",
    }


# --- 1. one bounded reader for every file --------------------------------------------------------


KINDS = {  # what takes a file's place -> what the one line must call it
    "fifo": "FIFO",
    "zero": "character device",
    "urandom": "character device",
    "null": "character device",
    "directory": "directory",
    "link-to-directory": "directory",
}


def make(kind: str, path: Path, writers: list) -> None:
    """Put `kind` at `path`: a FIFO held open by a writer that never writes, a device, a directory."""
    if kind == "fifo":
        os.mkfifo(path)
        # opens the FIFO for writing (returning once a reader opens it) and then writes nothing
        writers.append(subprocess.Popen(["sh", "-c", 'exec 3>"$0" && exec sleep 300', str(path)]))
    elif kind in ("zero", "urandom", "null"):
        path.symlink_to(f"/dev/{kind}")
    elif kind == "directory":
        path.mkdir()
    elif kind == "link-to-directory":
        target = path.with_name(path.name + ".target")
        target.mkdir()
        path.symlink_to(target)
    else:  # "link": a link to a regular file, made by the caller
        raise ValueError(kind)


def reader_spots(b: dict[str, Path]) -> list[tuple]:
    """(label, file name, whether a directory is a valid input there, the directory to copy into
    place first or None, how to prepare it, argv given the file and its directory): the place of
    every file a command reads."""
    hf_index = {"weight_map": {"wte.weight": "model-00001-of-00001.safetensors"}}

    def sharded(where: Path) -> None:  # an index in place of model.safetensors, naming a shard
        (where / "model.safetensors").unlink()
        (where / "model.safetensors.index.json").write_text(json.dumps(hf_index), encoding="utf-8")

    def indexed(where: Path) -> None:
        (where / "model.safetensors").unlink()

    run_flags = [*TINY, "--steps", "1", "-q"]

    def import_hf(x: Path, w: Path) -> list:
        return ["import-hf", w, "-o", w.parent / f"{w.name}.safetensors"]

    return [
        ("info", "x.safetensors", True, None, None, lambda x, w: ["info", x]),
        ("encode-t", "tok.safetensors", True, None, None, lambda x, w: ["encode", "-t", x, "hello"]),
        ("decode-t", "tok.safetensors", True, None, None, lambda x, w: ["decode", "-t", x, "1"]),
        ("decode-f", "ids.npy", False, None, None, lambda x, w: ["decode", "-t", b["tok"], "-f", x]),
        ("bpe-import-json", "tokenizer.json", True, None, None, lambda x, w: ["bpe-import", x, "-o", w / "o"]),
        (
            "bpe-import-tiktoken",
            "r.tiktoken",
            False,
            None,
            None,
            lambda x, w: ["bpe-import", x, "--pattern", "gpt2", "-o", w / "o"],
        ),
        (
            "bpe-import-vocab",
            "vocab.json",
            False,
            None,
            None,
            lambda x, w: ["bpe-import", x, b["gpt2"] / "merges.txt", "-o", w / "o"],
        ),
        (
            "bpe-import-merges",
            "merges.txt",
            False,
            None,
            None,
            lambda x, w: ["bpe-import", b["gpt2"] / "vocab.json", x, "-o", w / "o"],
        ),
        ("bpe-export", "tok.safetensors", True, None, None, lambda x, w: ["bpe-export", x, "-o", w / "o"]),
        ("predict-next", "m.safetensors", True, None, None, lambda x, w: ["predict-next", "-m", x, "the fox"]),
        ("generate", "m.safetensors", True, None, None, lambda x, w: ["generate", "-m", x, "the fox", "-n", "1"]),
        ("explain", "m.safetensors", True, None, None, lambda x, w: ["explain", "-m", x, "the fox"]),
        (
            "init-from",
            "m.safetensors",
            True,
            None,
            None,
            lambda x, w: ["train-model", b["corpus"], "--init-from", x, "-o", w / "r", "--steps", "1", "-q"],
        ),
        (
            "config",
            "settings.json",
            False,
            None,
            None,
            lambda x, w: ["train-model", b["corpus"], "-t", b["tok"], "-o", w / "r", "--config", x, *run_flags],
        ),
        (
            "hf-config",
            "config.json",
            False,
            b["hf"],
            None,
            import_hf,
        ),
        (
            "hf-tokenizer",
            "tokenizer.json",
            False,
            b["hf"],
            None,
            import_hf,
        ),
        (
            "hf-weights",
            "model.safetensors",
            False,
            b["hf"],
            None,
            import_hf,
        ),
        (
            "hf-index",
            "model.safetensors.index.json",
            False,
            b["hf"],
            indexed,
            import_hf,
        ),
        (
            "hf-shard",
            "model-00001-of-00001.safetensors",
            False,
            b["hf"],
            sharded,
            import_hf,
        ),
        ("resume-state", "train_state.safetensors", False, b["run"], None, lambda x, w: ["train-model", "--resume", w]),
        ("resume-log", "log.jsonl", False, b["run"], None, lambda x, w: ["train-model", "--resume", w, "-q"]),
    ]


def place(tmp_path: Path, spot: tuple, kind: str, writers: list, original: Path | None = None) -> list:
    """Make the directory of `spot` with `kind` (or a link to `original`) in its file's place: its argv."""
    label, name, _, copy, prepare, argv = spot
    where = tmp_path / f"{kind}-{label}"
    if copy is not None:
        shutil.copytree(copy, where, symlinks=True)
    else:
        where.mkdir()
    if prepare is not None:
        prepare(where)
    target = where / name
    if target.exists():
        target.unlink()
    if original is not None:
        target.symlink_to(original)
    else:
        make(kind, target, writers)
    return argv(target, where)


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_reader_refuses_what_is_not_a_regular_file_in_one_line(base, tmp_path, kind):
    spots = [s for s in reader_spots(base) if not (s[2] and "directory" in kind)]  # there a directory is an input
    writers: list[subprocess.Popen] = []
    try:
        calls = [place(tmp_path, spot, kind, writers) for spot in spots]
        results = tk_many(calls)
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
    failures = []
    for spot, call, result in zip(spots, calls, results, strict=True):
        try:
            line = one_line(result, KINDS[kind])
            assert f"{kind}-{spot[0]}" in line, line  # the path is named
        except AssertionError as err:
            failures.append(f"{spot[0]}: tk {' '.join(map(str, call))[:120]}\n  {err}")
    assert not failures, "\n".join(failures)


def test_links_to_regular_files_are_followed(base, tmp_path):
    originals = {
        "info": base["tok"],
        "encode-t": base["tok"],
        "decode-f": base["ids"],
        "bpe-import-json": base["root"] / "hf" / "tokenizer.json",
        "bpe-import-tiktoken": base["tiktoken"] / "tokenizer.tiktoken",
        "predict-next": base["model"],
        "config": None,
        "hf-config": base["hf"] / "config.json",
        "hf-weights": base["hf"] / "model.safetensors",
        "resume-log": base["run"] / "log.jsonl",
    }
    settings = tmp_path / "settings.json"
    settings.write_text('{"lr": 0.003}', encoding="utf-8")
    originals["config"] = settings
    spots = [s for s in reader_spots(base) if s[0] in originals]
    calls = [place(tmp_path, spot, "link", [], originals[spot[0]]) for spot in spots]
    for spot, result in zip(spots, tk_many(calls), strict=True):
        assert result[0] == 0, f"{spot[0]}: {result[2][-2000:]}"


def _sparse_tokenizer(path: Path, tok: Path, size: int) -> None:
    """A tokenizer file whose header is valid and whose vocab_bytes tensor fills `size` bytes of zeros (sparse)."""
    _, meta = safetensors_file.read_header(tok)
    n = size  # vocab_bytes alone
    shapes = {  # zero-stride arrays: the header's sizes without the memory
        "merges": np.broadcast_to(np.int32(0), (0, 2)),
        "vocab_bytes": np.broadcast_to(np.uint8(0), (n,)),
        "vocab_offsets": np.broadcast_to(np.int64(0), (257,)),
    }
    head = safetensors_file.header_bytes(shapes, meta)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + n + 257 * 8)


@pytest.mark.parametrize(
    "name, limit, argv",
    [
        ("tok.safetensors", readfile.TOKENIZER_LIMIT, lambda x, b: ["encode", "-t", x, "hello"]),
        ("tokenizer.json", readfile.TOKENIZER_LIMIT, lambda x, b: ["bpe-import", x, "-o", x.parent / "o"]),
        (
            "r.tiktoken",
            readfile.TOKENIZER_LIMIT,
            lambda x, b: ["bpe-import", x, "--pattern", "gpt2", "-o", x.parent / "o"],
        ),
        (
            "vocab.json",
            readfile.TOKENIZER_LIMIT,
            lambda x, b: ["bpe-import", x, b["gpt2"] / "merges.txt", "-o", x.parent / "o"],
        ),
        (
            "settings.toml",
            readfile.SETTINGS_LIMIT,
            lambda x, b: ["train-model", b["corpus"], "-t", b["tok"], "-o", x.parent / "r", "--config", x],
        ),
    ],
)
def test_a_sparse_file_past_its_kinds_bound_is_refused_before_reading(base, tmp_path, name, limit, argv):
    path = tmp_path / name
    if name == "tok.safetensors":  # its header must pass first: read alone, it bounds itself
        _sparse_tokenizer(path, base["tok"], limit + 1)
    else:
        with open(path, "wb") as f:
            f.truncate(limit + 1)  # sparse: no disk used, and reading it whole would allocate the lot
    size = path.stat().st_size
    assert size > limit
    one_line(tk_many([argv(path, base)])[0], str(path), f"{size:,} bytes, more than")


def test_import_hf_refuses_a_huge_sparse_config(base, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(base["hf"], hf)
    with open(hf / "config.json", "wb") as f:
        f.truncate(20 << 30)
    with open(hf / "tokenizer.json", "r+b") as f:  # and a tokenizer.json past its bound, found second
        f.truncate(readfile.TOKENIZER_LIMIT + 1)
    one_line(tk_many([["import-hf", hf, "-o", tmp_path / "o"]])[0], "config.json", "bytes, more than")


def test_the_reader_checks_the_file_it_opened(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(readfile.FileError, match="FIFO"):  # returns at once: no writer, no block
        readfile.read_bytes(fifo, 100, "a test file")
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(readfile.FileError, match="dangling symbolic link"):
        readfile.read_bytes(link, 100, "a test file")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(readfile.FileError, match="loops"):
        readfile.read_bytes(loop, 100, "a test file")
    small = tmp_path / "small"
    small.write_bytes(b"12345")
    assert readfile.read_bytes(small, 5, "a test file") == b"12345"
    with pytest.raises(readfile.FileError, match="5 bytes, more than a test file can be"):
        readfile.read_bytes(small, 4, "a test file")
    import tokenkit.cli.params
    import tokenkit.pipeline.config

    for module in (readfile, tokenkit.pipeline.config, tokenkit.cli.params, checkpoint):
        assert doctest.testmod(module).failed == 0


# --- 2. damaged files read back ----------------------------------------------------------------


LOG_DAMAGE = {  # what replaces line 3 of log.jsonl -> the reason the note gives
    "invalid UTF-8": (b"\xff\xfe{}\n", "not UTF-8 text"),
    "cut JSON": (b'{"step": 2, "loss":\n', "not JSON"),
    "a list": (b"[1, 2, 3]\n", "not a JSON object"),
    "a string step": (b'{"step": "2", "type": "step"}\n', "its step is not a whole number"),
    "a NaN step": (b'{"step": NaN, "type": "step"}\n', "its step is not a whole number"),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000 + b"\n", "not JSON"),
    "a huge line": (b"x" * (trainlog.MAX_LOG_LINE + 10) + b"\n", "longer than"),
}


def test_resume_over_a_damaged_log_drops_the_damaged_line_with_one_note(base, tmp_path):
    calls, runs = [], []
    for i, (line, _) in enumerate([*LOG_DAMAGE.values(), (b'{"step": 3, "ty', "")]):
        run = tmp_path / f"run{i}"
        shutil.copytree(base["run"], run)
        log = run / checkpoint.LOG_FILE
        lines = log.read_bytes().splitlines(keepends=True)
        if line.endswith(b"\n"):
            lines[2] = line
        else:  # a last line cut short by a kill: dropped without a word
            lines.append(line)
        log.write_bytes(b"".join(lines))
        calls.append(["train-model", "--resume", run])
        runs.append(run)
    results = tk_many(calls)
    for (name, (_, why)), run, result in zip([*LOG_DAMAGE.items(), ("torn", (b"", ""))], runs, results, strict=True):
        code, _, err = result
        assert code == 0, f"{name}: {err[-2000:]}"
        notes = [line for line in err.splitlines() if line.startswith(("warning", "error", "Traceback"))]
        if name == "torn":
            assert notes == [], err
        else:
            assert len(notes) == 1 and str(run / checkpoint.LOG_FILE) in notes[0], f"{name}: {err}"
            assert "line 3" in notes[0] and why in notes[0], notes[0]
        records = trainlog.read_log(run / checkpoint.LOG_FILE)
        assert len(records) == len((run / checkpoint.LOG_FILE).read_bytes().splitlines())  # nothing damaged kept
        assert max(r["step"] for r in records) == 8  # and the resumed run logged its steps


def _damage_state(run: Path, change) -> None:
    path = run / checkpoint.STATE_FILE
    tensors, meta = safetensors_file.read(path)
    change(tensors, meta)
    with open(path, "wb") as f:
        safetensors_file.write(f, tensors, meta)


def _setting(meta: dict, **values) -> None:
    meta["train_config"] = json.dumps({**json.loads(meta["train_config"]), **values})


STATE_DAMAGE = {  # name -> (how, a fragment of the one line)
    "rng as float NaN": (lambda t, m: t.update({"rng.train": np.full(6, np.nan)}), "data generator"),
    "rng 2-D": (lambda t, m: t.update({"rng.train": t["rng.train"].reshape(2, 3)}), "data generator"),
    "rng int64": (lambda t, m: t.update({"rng.train": np.full(6, -1, np.int64)}), "data generator"),
    "rng flag > 1": (lambda t, m: t.update({"rng.train": np.arange(6, dtype=np.uint64) + 5}), "data generator"),
    "moment float16": (
        lambda t, m: t.update({"optimizer.m.wte.weight": t["optimizer.m.wte.weight"].astype(np.float16)}),
        "float16",
    ),
    "moment NaN": (lambda t, m: t["optimizer.m.wte.weight"].fill(np.nan), "NaN"),
    "negative second moment": (lambda t, m: t["optimizer.v.wte.weight"].fill(-1.0), "negative"),
    "weights infinite": (lambda t, m: t["params.wte.weight"].fill(np.inf), "NaN or infinite"),
    "best loss NaN": (lambda t, m: m.update(best_val_loss="NaN"), "best_val_loss"),
    "best loss a string": (lambda t, m: m.update(best_val_loss='"low"'), "best_val_loss"),
    "best step 1.5": (lambda t, m: m.update(best_step="1.5"), "best_step"),
    "step -3": (lambda t, m: m.update(step="-3"), "step -3"),
    "lr infinite": (lambda t, m: _setting(m, lr=float("inf")), "--lr must be a finite number"),
    "steps 1e30": (lambda t, m: _setting(m, steps=10**30), "--steps must be at most"),
    "eval batches 1e11": (lambda t, m: _setting(m, eval_batches=10**11), "--eval-batches must be at most"),
}


def test_a_damaged_training_state_is_one_line_naming_it(base, tmp_path):
    calls = []
    for i, (change, _) in enumerate(STATE_DAMAGE.values()):
        run = tmp_path / f"run{i}"
        shutil.copytree(base["run"], run)
        _damage_state(run, change)
        calls.append(["train-model", "--resume", run, "-q"])
    for (name, (_, fragment)), call, result in zip(STATE_DAMAGE.items(), calls, tk_many(calls), strict=True):
        line = one_line(result, fragment)
        assert str(call[2]) in line, f"{name}: {line}"


def test_damaged_token_and_cache_files_are_made_again_and_nodes_refused(base, tmp_path):
    def bad_header(p: Path) -> None:
        data = bytearray(p.read_bytes())
        data[10:20] = b"xxxxxxxxxx"  # numpy's header parser raised a tokenize error here
        p.write_bytes(bytes(data))

    damage = {
        "tokens.npy header": ("tokens.npy", bad_header),
        "tokens.npy a FIFO": ("tokens.npy", "fifo"),
        "tokens.npy /dev/zero": ("tokens.npy", "zero"),
        "tokens.json not JSON": ("tokens.json", lambda p: p.write_bytes(b'{"tokens.npy": [[[')),
        "tokens.json a FIFO": ("tokens.json", "fifo"),
    }
    calls, writers = [], []
    for i, (name, how) in enumerate(damage.values()):
        run = tmp_path / f"pipe{i}"
        shutil.copytree(base["pipe"], run)
        if callable(how):
            how(run / name)
        else:
            (run / name).unlink()
            make(how, run / name, writers)
        calls.append(["pipeline", base["corpus"], "-o", run, "--vocab-size", "300", *TINY, "--steps", "2", "-q"])
    try:
        results = tk_many(calls)
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
    for (label, (name, how)), call, result in zip(damage.items(), calls, results, strict=True):
        place = Path(call[3]) / name
        if not callable(how):  # a node where a cache file was: one line, and tk replaces no node (docs/files.md)
            assert result[0] == 1 and "not a regular file" in result[2] and result[2].count("\n") == 1, label
            assert place.is_symlink() if how == "zero" else stat.S_ISFIFO(place.lstat().st_mode), label
            continue
        assert result[0] == 0, f"{label}: {result[2][-2000:]}"
        assert place.is_file() and not place.is_symlink(), label
        assert np.array_equal(np.load(Path(call[3]) / "tokens.npy"), np.load(base["pipe"] / "tokens.npy")), label


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_model_with_nan_or_infinite_weights_is_one_line(base, tmp_path, value):
    tensors, meta = safetensors_file.read(base["model"])
    tensors["h.0.mlp.c_fc.weight"][3, 5] = value
    model = tmp_path / "m.safetensors"
    with open(model, "wb") as f:
        safetensors_file.write(f, tensors, meta)
    calls = [  # every command that reads the weights (`tk info` reads the header alone: test_reliability_sizes.py)
        ["predict-next", "-m", model, "the fox"],
        ["generate", "-m", model, "the fox", "-n", "2"],
        ["explain", "-m", model, "the fox"],
        ["export-hf", model, "-o", tmp_path / "hf"],
        ["train-model", base["corpus"], "--init-from", model, "-o", tmp_path / "r", "--steps", "1", "-q"],
    ]
    for result in tk_many(calls):
        one_line(result, str(model), "h.0.mlp.c_fc.weight", "NaN or infinite")


# --- 3. numeric flags ------------------------------------------------------------------------


def test_every_numeric_flag_refuses_nan_infinity_and_out_of_range_values_naming_it(base, tmp_path):
    corpus, tok, model = base["corpus"], base["tok"], base["model"]
    train = ["train-model", corpus, "-t", tok, "-o", tmp_path / "r", *TINY, "--steps", "2", "-q"]
    pipe = ["pipeline", corpus, "-o", tmp_path / "p", *TINY, "--steps", "2", "-q"]
    bad = {  # flag -> values no run can use (a huge one: what would allocate or run for ever)
        "--n-layers": ["0", "1025"],
        "--n-heads": ["0", "70000"],
        "--d-model": ["-1", "100000"],
        "--context-length": ["0", "70000"],
        "--batch-size": ["0", str(10**8)],
        "--steps": ["0", str(10**13)],
        "--lr": ["nan", "inf", "-inf", "0", "-1", "2", "1e308"],
        "--min-lr": ["nan", "inf", "-1"],
        "--warmup-steps": ["-1", str(10**13)],
        "--weight-decay": ["nan", "inf", "-0.5", "1e9"],
        "--beta1": ["nan", "inf", "1", "-0.1"],
        "--beta2": ["nan", "1.5"],
        "--grad-clip": ["nan", "inf", "-1"],
        "--eval-interval": ["0", str(10**24)],
        "--eval-batches": ["0", str(10**11)],
        "--val-fraction": ["nan", "inf", "0", "1"],
        "--seed": ["-1", str(10**30)],
        "--workers": ["-1", str(10**8)],
    }
    calls, flags = [], []
    for flag, values in bad.items():
        for value in values:
            for command in (train, pipe) if value == values[0] else (train,):
                # the last flag given wins; TINY's own values come first
                calls.append([*command, flag, value])
                flags.append(flag)
    generate = ["generate", "-m", model, "the fox"]
    others = [
        (["--max-new-tokens", str(10**8)], generate, "--max-new-tokens"),
        (["-n", "-1"], generate, "--max-new-tokens"),
        (["--temperature", "nan"], generate, "--temperature"),
        (["--temperature", "inf"], generate, "--temperature"),
        (["--temperature", "-1"], generate, "--temperature"),
        (["--top-p", "nan"], generate, "--top-p"),
        (["--top-p", "0"], generate, "--top-p"),
        (["--top-p", "1.5"], generate, "--top-p"),
        (["--top-k", "0"], generate, "--top-k"),
        (["--seed", "-1"], generate, "--seed"),
        (["--top-k", "0"], ["predict-next", "-m", model, "the fox"], "--top-k"),
        (["--top-k", "0"], ["explain", "-m", model, "the fox"], "--top-k"),
        (["--layer", "-1"], ["explain", "-m", model, "the fox"], "layer -1 does not exist"),
        (["--head", str(10**30)], ["explain", "-m", model, "the fox"], f"head {10**30} does not exist"),
        (["--vocab-size", str(10**20)], pipe, "--vocab-size"),
        (["-n", str(10**20)], pipe, "--max-new-tokens"),
        (["--workers", "0"], ["encode", "-t", tok, "-f", corpus], "--workers"),
        (["--workers", "-3"], ["encode", "-t", tok, "-f", corpus], "--workers"),
        (["--workers", str(10**20)], ["encode", "-t", tok, "-f", corpus], "--workers"),
        (["--workers", str(MAX_WORKERS + 1)], ["bpe-train", corpus, "-o", tmp_path / "t", "-q"], "--workers"),
        (["--min-frequency", "0"], ["bpe-train", corpus, "-o", tmp_path / "t", "-q"], "--min-frequency"),
    ]
    for extra, command, flag in others:
        calls.append([*command, *extra])
        flags.append(flag)
    failures = []
    for call, flag, result in zip(calls, flags, tk_many(calls), strict=True):
        try:
            one_line(result, flag)
        except AssertionError as err:
            failures.append(f"tk {' '.join(map(str, call[-4:]))}: {err}")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "r").exists() and not (tmp_path / "p").exists()  # refused before any work


SETTINGS = [  # a settings file's text -> the flag its one line names
    ('{"lr": Infinity}', ".json", "--lr"),
    ('{"lr": NaN}', ".json", "--lr"),
    ('{"lr": 1' + "0" * 400 + "}", ".json", "--lr"),
    ('{"steps": 1' + "0" * 30 + "}", ".json", "--steps"),
    ('{"eval_batches": 100000000000}', ".json", "--eval-batches"),
    ('{"weight_decay": 2.0, "lr": 1.0}', ".json", "--weight-decay"),
    ("lr = inf\n", ".toml", "--lr"),
    ("grad_clip = nan\n", ".toml", "--grad-clip"),
    ("seed = 18446744073709551616\n", ".toml", "--seed"),
]


def test_settings_files_are_held_to_the_same_ranges(base, tmp_path):
    calls = []
    for i, (text, suffix, _) in enumerate(SETTINGS):
        settings = tmp_path / f"settings{i}{suffix}"
        settings.write_text(text, encoding="utf-8")
        calls.append(["train-model", base["corpus"], "-t", base["tok"], "-o", tmp_path / f"r{i}", "--config", settings])
    for (_, _, flag), result in zip(SETTINGS, tk_many([[*c, "-q", "--workers", "1"] for c in calls]), strict=True):
        one_line(result, flag)
    assert not list(tmp_path.glob("r*"))  # refused before any work


def test_a_diverging_run_is_one_line_without_numpy_warnings(base, tmp_path):
    tensors, meta = safetensors_file.read(base["model"])
    tensors["wte.weight"] *= np.float32(1e30)  # finite, but its squares overflow float32 in the first step
    model = tmp_path / "m.safetensors"
    with open(model, "wb") as f:
        safetensors_file.write(f, tensors, meta)
    for workers in ("1", "2"):  # forked workers write their warnings straight to the terminal: a real tk
        argv = ["train-model", base["corpus"], "--init-from", model, "-o", tmp_path / f"r{workers}", "--steps", "3"]
        proc = subprocess.run(
            [sys.executable, "-m", "tokenkit.cli.main", *map(str, argv), "-q", "--workers", workers],
            capture_output=True,
            text=True,
            timeout=CALL_SECONDS,
        )
        one_line((proc.returncode, "", proc.stderr), "training diverged")
    for result in tk_many([["predict-next", "-m", model, "the fox"], ["explain", "-m", model, "the fox"]]):
        assert result[0] == 0 or len(result[2].strip().splitlines()) == 1, result[2]  # runs, or one line
        assert "Warning" not in result[2], result[2]


# --- 4. messages: a full disk, a dangling link -------------------------------------------------


class _FullDisk:
    """A file object whose writes fail as on a full disk."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def test_a_full_disk_names_the_file_and_the_free_space(base, tmp_path, capsys, monkeypatch):
    real = atomic.create_temp
    monkeypatch.setattr(atomic, "create_temp", lambda tmp: _FullDisk(real(tmp)))
    tok, corpus = base["tok"], base["corpus"]
    free = f"free in {tmp_path}"
    for argv, target in [
        (["bpe-train", corpus, "--vocab-size", "280", "-o", tmp_path / "t.safetensors", "-q"], "t.safetensors"),
        (["encode", "-t", tok, "the fox", "-o", tmp_path / "ids.npy"], "ids.npy"),
        (["bpe-import", base["hf"] / "tokenizer.json", "-o", tmp_path / "b.safetensors"], "b.safetensors"),
        (["import-hf", base["hf"], "-o", tmp_path / "i.safetensors"], "i.safetensors"),
        (["train-model", corpus, "-t", tok, "-o", tmp_path / "r", *TINY, "--steps", "2", "-q"], str(tmp_path / "r")),
    ]:
        line = one_line(cli(capsys, *argv), "disk is full", target)
        assert free in line or "bytes free in" in line, line
    assert not list(tmp_path.glob("**/*.tmp"))


def test_a_full_disk_while_logging_names_the_log(base, tmp_path, capsys, monkeypatch):
    real = trainlog.JsonlLog.__init__

    def init(self, path):
        real(self, path)
        self._f = _FullDisk(self._f)

    monkeypatch.setattr(trainlog.JsonlLog, "__init__", init)
    run = tmp_path / "run"
    shutil.copytree(base["run"], run)
    line = one_line(cli(capsys, "train-model", "--resume", run, "-q"), "disk is full")
    assert str(run / checkpoint.LOG_FILE) in line and f"free in {run}" in line, line


def test_a_dangling_link_as_an_output_is_named_and_kept(base, tmp_path, capsys):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "missing" / "target")
    tok, corpus = base["tok"], base["corpus"]
    for argv in [
        ["pipeline", corpus, "-o", link, *TINY, "--steps", "2", "-q"],
        ["train-model", corpus, "-t", tok, "-o", link, *TINY, "--steps", "2", "-q"],
        ["bpe-train", corpus, "--vocab-size", "280", "-o", link, "-q"],
        ["bpe-train", corpus, "--vocab-size", "280", "-o", link / "tok.safetensors", "-q"],
        ["encode", "-t", tok, "the fox", "-o", link],
        ["bpe-import", base["hf"] / "tokenizer.json", "-o", link],
        ["import-hf", base["hf"], "-o", link],
        ["export-hf", base["run"], "-o", link],  # directories of files, replaced as a whole
        ["bpe-export", tok, "--format", "hf", "-o", link],
    ]:
        one_line(cli(capsys, *argv), f"{link} is a dangling symbolic link")
        assert link.is_symlink() and not (tmp_path / "missing").exists()
