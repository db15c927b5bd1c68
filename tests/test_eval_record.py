"""`tk eval -m RUN_DIR FILE...` records its result in the run directory's eval.json (issue 31).

One entry per corpus, the same numbers as `--json` prints; a model file records nothing. The
file is written whole under the run directory's lock or not at all: a failed write leaves the old
file and no temp, a run directory in use by another process is not written, and a damaged
eval.json is never replaced. Each of those is one warning line after the printed result, which
stands (exit 0). The page's training view lists the entries.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenkit.cli.main import main
from tokenkit.common import atomic
from tokenkit.pipeline import checkpoint, eval_record, views
from tokenkit.pipeline.checkpoint import load_model

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--n-layers", "1", "--n-heads", "2", "--d-model", "32", "--context-length", "16", "--batch-size", "4"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("evalrec")
    (d / "tales.txt").write_bytes((REPO / "corpora" / "tiny_tales.txt").read_bytes()[:20_000])
    held = (REPO / "corpora" / "tiny_tales_test.txt").read_text(encoding="utf-8").split("\n\n")
    (d / "a.txt").write_text(held[0], encoding="utf-8")
    (d / "docs").mkdir()
    for i in range(3):
        (d / "docs" / f"{i}.md").write_text(held[1 + i], encoding="utf-8")
    run = d / "run"
    argv = ["train-model", str(d / "tales.txt"), "-o", str(run), *SMALL, "--steps", "4", "--eval-interval", "2"]
    assert main([*argv, "--workers", "1", "--quiet"]) == 0
    return {"dir": d, "run": run, "a": d / "a.txt", "docs": d / "docs"}


@pytest.fixture
def run(files, tmp_path) -> Path:
    """A copy of the trained run, without evaluations."""
    copy = tmp_path / "run"
    copy.mkdir()
    for p in files["run"].iterdir():
        if p.is_file():
            (copy / p.name).write_bytes(p.read_bytes())
    return copy


def tk_eval(capsys, *argv: str) -> tuple[int, dict | str, list[str]]:
    """(exit code, the --json object or the printed text, stderr's lines)."""
    code = main(["eval", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out) if "--json" in argv and code == 0 else out, err.splitlines()


def entries(run: Path) -> dict:
    return json.loads((run / checkpoint.EVAL_FILE).read_text())["evaluations"]


def test_each_corpus_gets_its_entry_with_the_printed_numbers(files, run, capsys):
    code, doc, err = tk_eval(capsys, "-m", str(run), str(files["a"]), "--json")
    assert code == 0 and err == [f"recorded in {run / checkpoint.EVAL_FILE}"]
    key = str(files["a"].resolve())
    (entry,) = entries(run).values()
    assert list(entries(run)) == [key] and entry["corpus"] == [key]
    assert {k: entry[k] for k in doc if k != "model"} == {k: v for k, v in doc.items() if k != "model"}
    assert entry["step"] == load_model(run).metadata["step"] and entry["utc"].endswith("Z")
    # another corpus (a directory read with --glob) is another entry; the same corpus again replaces its own
    code, doc2, _ = tk_eval(capsys, "-m", str(run), str(files["docs"]), "--glob", "*.md", "--json", "-q")
    code, doc3, err = tk_eval(capsys, "-m", str(run), str(files["a"]), "--stride", "4", "--json", "-q")
    assert code == 0 and err == []  # --quiet: no note
    both = entries(run)
    assert sorted(both) == sorted([key, f"{files['docs'].resolve()} --glob '*.md'"])
    assert both[key]["stride"] == 4 and both[key]["bits_per_byte"] == doc3["bits_per_byte"] != doc["bits_per_byte"]
    assert both[f"{files['docs'].resolve()} --glob '*.md'"]["documents"] == doc2["documents"] == 3
    # the text output records as --json does
    code, out, err = tk_eval(capsys, "-m", str(run), str(files["a"]), "--allow-special")
    assert code == 0 and "bits per byte:" in out and err == [f"recorded in {run / checkpoint.EVAL_FILE}"]
    assert f"{key} --allow-special" in entries(run) and len(entries(run)) == 3


def test_a_model_file_records_nothing(files, run, capsys, tmp_path):
    model = tmp_path / "m.safetensors"
    model.write_bytes((run / checkpoint.MODEL_FILE).read_bytes())
    before = {p: p.stat().st_mtime_ns for p in (*tmp_path.iterdir(), *run.iterdir())}
    for path in (model, run / checkpoint.MODEL_FILE):
        code, doc, err = tk_eval(capsys, "-m", str(path), str(files["a"]), "--json")
        assert code == 0 and doc["tokens"] > 0 and err == []
    assert {p: p.stat().st_mtime_ns for p in (*tmp_path.iterdir(), *run.iterdir())} == before


DAMAGED = {
    "not JSON": b'{"format": "tokenkit.evaluations", "version": 1, "evaluations": {',
    "not UTF-8": b'{"format": "\xff\xfe"}',
    "a list": b"[]",
    "another format": b'{"format": "tokenkit.model", "version": 1, "evaluations": {}}',
    "a later version": b'{"format": "tokenkit.evaluations", "version": 2, "evaluations": {}}',
    "an entry not an object": b'{"format": "tokenkit.evaluations", "version": 1, "evaluations": {"a": 3}}',
    "nested too deep": b"[" * 5000 + b"]" * 5000,
}


@pytest.mark.parametrize("kind", [*DAMAGED, "too big", "a directory", "a FIFO"])
def test_a_damaged_eval_json_is_left_alone_in_one_warning(files, run, capsys, kind):
    path = run / checkpoint.EVAL_FILE
    if kind == "too big":
        with open(path, "wb") as f:
            f.truncate(eval_record.MAX_EVAL_FILE + 1)
    elif kind == "a directory":
        path.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(path)
    else:
        path.write_bytes(DAMAGED[kind])
    before = path.read_bytes() if path.is_file() else None
    code, out, err = tk_eval(capsys, "-m", str(run), str(files["a"]))
    assert code == 0 and "bits per byte:" in out  # the evaluation stands
    assert len(err) == 1 and err[0].startswith(f"warning: {path}") and "not be recorded" in err[0], err
    assert "Traceback" not in err[0]
    assert (path.read_bytes() if path.is_file() else None) == before and path.exists()
    assert [p.name for p in run.iterdir() if atomic.TEMP_NAME.match(p.name)] == []
    doc = views.training_view(run, name="r")  # the page says why it lists none
    assert doc["evaluations"] == [] and str(path) in doc["evaluations_error"]


def test_a_failed_write_keeps_the_old_file_whole_and_leaves_no_temp(files, run, capsys, monkeypatch):
    assert tk_eval(capsys, "-m", str(run), str(files["a"]), "-q")[0] == 0
    path = run / checkpoint.EVAL_FILE
    old = path.read_bytes()
    written = []
    real = atomic.write_atomic
    monkeypatch.setattr(atomic, "write_atomic", lambda p, d: (written.append(Path(p)), real(p, d))[1])

    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full_disk)  # the temp is written whole; the rename fails
    code, out, err = tk_eval(capsys, "-m", str(run), str(files["docs"]))
    assert code == 0 and "bits per byte:" in out
    assert len(err) == 1 and err[0].startswith(f"warning: {path}: cannot write") and "disk is full" in err[0], err
    assert written == [path]  # through the one atomic writer
    assert path.read_bytes() == old and [p.name for p in run.iterdir() if atomic.TEMP_NAME.match(p.name)] == []
    monkeypatch.undo()
    assert tk_eval(capsys, "-m", str(run), str(files["docs"]), "-q")[0] == 0 and len(entries(run)) == 2


def test_a_run_directory_in_use_is_not_written(files, run, capsys):
    """Another process holds the run directory's lock (a training run): the evaluation is printed,
    not recorded, and says so; once the lock is gone it records."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom tokenkit.pipeline.rundir import RunDir\n"
         f"with RunDir({str(run)!r}):\n    print('locked', flush=True)\n    sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "locked\n"
        code, out, err = tk_eval(capsys, "-m", str(run), str(files["a"]))
        assert code == 0 and "bits per byte:" in out
        assert len(err) == 1 and f"in use by process {holder.pid}" in err[0] and "not recorded" in err[0], err
        assert not (run / checkpoint.EVAL_FILE).exists()
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert tk_eval(capsys, "-m", str(run), str(files["a"]), "-q")[0] == 0 and len(entries(run)) == 1


def test_the_training_view_lists_the_evaluations(files, run, capsys):
    assert views.training_view(run, name="r")["evaluations"] == []
    for corpus in (files["docs"], files["a"]):
        assert tk_eval(capsys, "-m", str(run), str(corpus), "-q")[0] == 0
    doc = views.training_view(run, name="r")
    assert doc["evaluations_error"] is None
    assert [e["corpus"] for e in doc["evaluations"]] == sorted(entries(run))
    for row in doc["evaluations"]:
        entry = entries(run)[row["corpus"]]
        assert row == {"corpus": row["corpus"], **{k: entry[k] for k in eval_record.NUMBERS}, "utc": entry["utc"]}


def test_a_run_replacing_another_drops_its_evaluations(files, run, capsys):
    assert tk_eval(capsys, "-m", str(run), str(files["a"]), "-q")[0] == 0
    argv = ["train-model", str(files["dir"] / "tales.txt"), "-o", str(run), *SMALL, "--steps", "2", "--workers", "1"]
    assert main([*argv, "-q"]) == 1  # another run's files, eval.json among them: refused without --overwrite
    assert "eval.json" in capsys.readouterr().err and (run / checkpoint.EVAL_FILE).exists()
    assert main([*argv, "-q", "--overwrite"]) == 0
    assert not (run / checkpoint.EVAL_FILE).exists()  # the old model's evaluations went with it


def test_docstring_examples():
    import doctest

    from tokenkit.pipeline import val_bytes

    for module in (eval_record, val_bytes):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
