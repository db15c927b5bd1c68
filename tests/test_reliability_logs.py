"""A long training log and `tk serve` (issue 36): the log is parsed as plainly as json.loads reads
each line, the chart sent for it is thinned honestly, and reading it stalls no other view.

- `TrainingLog`, followed in random pieces, holds what a plain json.loads per whole line gives,
  on logs with damaged lines (not UTF-8, not JSON, not an object, a bad step, huge numbers),
  lines nested past jsonsafe's bound and lines with many brackets inside strings;
- `jsonsafe.loads` refuses exactly the texts nested deeper than MAX_DEPTH, whatever the fast path
  skips, and parses the rest as json.loads does;
- `views.chart_points` keeps the first, last, lowest, highest and latest points, within its bound;
- the model's views answer while the log is being read: the log has a lock of its own.

Every log is small and made here; bench/page.py times a million-step one.
"""

from __future__ import annotations

import json
import math
import random
import threading
import urllib.request

import numpy as np
import pytest
from conftest import random_model
from hypothesis import given, settings
from hypothesis import strategies as st
from test_serve import Running

from tokenkit.bpe import Tokenizer
from tokenkit.cli import serve
from tokenkit.common import FileError, jsonsafe
from tokenkit.pipeline import checkpoint, live, trainlog, views

# ----------------------------------------------------------------------------- the plain reference


def nesting(value) -> int:
    """The depth of a parsed JSON value, by recursion (0 for a scalar)."""
    if isinstance(value, dict):
        return 1 + max(map(nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(nesting, value), default=0)
    return 0


def plain_record(line: bytes):
    """A log line's record as plain json.loads reads it, or None for a damaged line."""
    if len(line) > trainlog.MAX_LOG_LINE:
        return None
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or nesting(record) > jsonsafe.MAX_DEPTH:
        return None
    step = record.get("step", 0)
    if type(step) is not int or not 0 <= step < 2**63:
        return None
    return record


def number(value) -> float:
    if type(value) not in (int, float):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.nan


def plain_log(data: bytes) -> dict:
    """What a followed log should hold after reading `data`'s whole lines (those ending in a newline)."""
    lines = data.split(b"\n")[:-1]
    records = [plain_record(line + b"\n") for line in lines]
    kept = {"steps": [], "loss": [], "lr": [], "dt": [], "grad_norm": [], "evals": []}
    kept |= {"config": None, "unigram_baseline": None, "status": "waiting"}
    for r in records:
        if r is None:
            continue
        kind = r.get("type")
        if kind == "step":
            kept["steps"].append(r.get("step", 0))
            for key in ("loss", "lr", "dt", "grad_norm"):
                kept[key].append(number(r.get(key)))
        elif kind == "eval":
            kept["evals"].append((r.get("step", 0), number(r.get("val_loss"))))
        elif kind == "session":
            kept["status"] = "training"
            if isinstance(r.get("train_config"), dict):
                kept["config"] = r["train_config"]
            if math.isfinite(number(r.get("unigram_baseline"))):
                kept["unigram_baseline"] = number(r["unigram_baseline"])
        elif kind in ("interrupt", "stop"):
            kept["status"] = "interrupted" if kind == "interrupt" else "diverged"
    kept["damaged"] = sum(r is None for r in records)
    return kept


def held(log: live.TrainingLog) -> dict:
    kept = {key: list(getattr(log, key)) for key in ("steps", "loss", "lr", "dt", "grad_norm")}
    return kept | {
        "evals": list(log.evals),
        "config": log.config,
        "unigram_baseline": log.unigram_baseline,
        "status": log.status,
        "damaged": log.damaged,
    }


def assert_same(got: dict, want: dict) -> None:
    for key in ("steps", "loss", "lr", "dt", "grad_norm"):
        np.testing.assert_array_equal(np.array(got[key], dtype=float), np.array(want[key], dtype=float), err_msg=key)
    assert json.dumps(got["evals"]) == json.dumps(want["evals"])  # NaN equal to NaN
    assert json.dumps(got["config"]) == json.dumps(want["config"])
    rest = ("unigram_baseline", "status", "damaged")
    assert [got[k] for k in rest] == [want[k] for k in rest]


# ----------------------------------------------------------------------------- random logs


def deep(n: int, inner: str = "1") -> str:
    return "[" * n + inner + "]" * n


def random_line(rng: random.Random) -> bytes:
    """One line of a log, as training writes it or damaged in one of many ways."""
    step = rng.randrange(0, 10_000)
    kind = rng.randrange(30)
    if kind < 12:
        record = {"type": "step", "step": step, "loss": rng.uniform(0, 8), "lr": 3e-4, "dt": rng.uniform(0.001, 1)}
        record |= {"grad_norm": rng.choice([0.5, float("nan"), float("inf"), None, "x", 10**400])}
        return json.dumps(record, sort_keys=True).encode()
    if kind < 14:
        return json.dumps({"type": "eval", "step": step, "val_loss": rng.choice([2.5, float("nan"), True])}).encode()
    if kind < 16:
        config = rng.choice([{"steps": 9000, "batch_size": 4, "context_length": 8, "list": [[1, [2]]]}, None, [1]])
        baseline = rng.choice([4.5, float("inf"), "4.5", None])
        record = {"type": "session", "step": step, "train_config": config, "unigram_baseline": baseline}
        return json.dumps(record).encode()
    if kind < 17:
        return json.dumps({"type": rng.choice(["interrupt", "stop"]), "step": step}).encode()
    return rng.choice(
        [
            b"\xff\xfe not UTF-8",
            b"not json",
            b"",
            b"   ",
            b"[1, 2]",
            b'"a string"',
            b'{"type": "step", "step": "3", "loss": 1.0}',
            b'{"type": "step", "step": -1, "loss": 1.0}',
            b'{"type": "step", "step": 3.0, "loss": 1.0}',
            b'{"type": "step", "step": 99999999999999999999999, "loss": 1.0}',
            b'{"type": "step", "step": 9223372036854775807, "loss": 1e999}',
            b'{"type": "step", "step": 5, "loss": NaN, "lr": Infinity}',
            b'{"type": "step", "step": 5, "loss": 1.0,}',
            b'{"type": "step", "step": 5, "loss": 1.0}\r',
            b'{"type": "step", "step": 7, "loss": 2.0} {"type": "step"}',
            f'{{"type": "step", "step": 8, "loss": 1.5, "x": {deep(63)}}}'.encode(),  # 64 deep: kept
            f'{{"type": "step", "step": 8, "loss": 1.5, "x": {deep(64)}}}'.encode(),  # 65 deep: damaged
            f'{{"type": "step", "step": 8, "x": {deep(5000)}}}'.encode(),
            deep(100_000).encode(),
            json.dumps({"type": "step", "step": 9, "loss": 0.5, "note": "[{" * 200}).encode(),  # brackets in a string
            json.dumps({"type": "step", "step": 9, "loss": 0.25, "n": [[{"a": [1]}]] * 40}).encode(),  # many, shallow
            '{"type": "step", "step": 10, "loss": 3.0, "é": "日本"}'.encode(),
        ]
    )


@pytest.mark.parametrize("seed", range(8))
def test_the_followed_log_is_a_plain_parse_of_its_whole_lines(tmp_path, seed):
    """The log written in random pieces (cutting lines anywhere), read after each: what it holds
    is what plain json.loads of each whole line gives; read_log agrees with the same reference."""
    rng = random.Random(seed)
    data = b"".join(random_line(rng) + b"\n" for _ in range(rng.randrange(50, 250)))
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"")
    log = live.TrainingLog(path)
    at = 0
    while at < len(data):
        end = min(len(data), at + rng.choice([1, 7, 100, 1000, 20_000]))
        with open(path, "ab") as f:
            f.write(data[at:end])
        at = end
        assert_same(held(log.read()), plain_log(data[:at]))
    want = [r for r in (plain_record(line + b"\n") for line in data.split(b"\n")[:-1]) if r is not None]
    assert json.dumps(trainlog.read_log(path), sort_keys=True) == json.dumps(want, sort_keys=True)
    # a resume cuts the log back: a new file, read from its start
    cut = data[: data.index(b"\n", len(data) // 2) + 1]
    tmp = tmp_path / "new.jsonl"
    tmp.write_bytes(cut)
    tmp.replace(path)
    assert_same(held(log.read()), plain_log(cut))


def test_a_line_over_the_bound_is_one_damaged_line(tmp_path):
    path = tmp_path / "log.jsonl"
    good = json.dumps({"type": "step", "step": 1, "loss": 1.0}).encode() + b"\n"
    long = b'{"type": "step", "step": 2, "pad": "' + b"x" * trainlog.MAX_LOG_LINE + b'"}\n'
    path.write_bytes(good + long + good)
    log = live.TrainingLog(path).read()
    assert list(log.steps) == [1, 1] and log.damaged == 1
    assert_same(held(log), plain_log(good + long + good))


# ----------------------------------------------------------------------------- the nesting check

BITS = ["[", "]", "{", "}", '"', "\\", '\\"', "1", ",", ":", '"a"', '"[{"', " "]


@settings(max_examples=400, deadline=None)
@given(bits=st.lists(st.sampled_from(BITS), max_size=40), levels=st.integers(0, 80), inside=st.integers(0, 80))
def test_loads_refuses_exactly_what_nests_too_deep(bits, levels, inside):
    """Random texts, with up to 80 levels around them and up to 80 brackets in a string beside:
    refused as too deep exactly when the plain regex count says so, else json.loads' answer."""
    text = "[" * levels + json.dumps("[" * inside) + "," + "".join(bits) + "]" * levels
    too_deep = jsonsafe._depth_plain(text) > jsonsafe.MAX_DEPTH
    try:
        want = json.loads(text)
    except (ValueError, RecursionError):
        want = None
    for given_text in (text, text.encode("utf-8")):
        try:
            got = jsonsafe.loads(given_text, "it")
        except FileError as err:
            assert ("nested deeper" in str(err)) == too_deep, (text, str(err))
            assert too_deep or want is None
            continue
        assert not too_deep and json.dumps(got) == json.dumps(want)


# ----------------------------------------------------------------------------- the chart


@pytest.mark.parametrize("seed", range(30))
def test_chart_points_keep_first_last_extremes_and_recent(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 5, views.TRAIN_POINTS, views.TRAIN_POINTS + 1, rng.integers(2, 300_000)]))
    values = np.cumsum(rng.normal(size=n)) + rng.normal(size=n) * 5
    for _ in range(int(rng.integers(0, 20))):  # missing and infinite values, and whole stretches of them
        at = int(rng.integers(0, max(n, 1)))
        values[at : at + int(rng.integers(1, 5000))] = rng.choice([np.nan, np.inf, -np.inf])
    keep = views.chart_points(values)
    assert len(keep) <= views.TRAIN_POINTS and np.all(np.diff(keep) > 0)
    if n <= views.TRAIN_POINTS:
        assert keep.tolist() == list(range(n))
        return
    kept = set(keep.tolist())
    assert {0, n - 1} | set(range(n - views.RECENT_POINTS, n)) <= kept
    if not np.isnan(values).all():
        low, high = np.nanmin(values), np.nanmax(values)
        assert values[keep][~np.isnan(values[keep])].min() == low and np.nanmax(values[keep]) == high


def test_the_training_view_sends_the_extremes_of_a_long_log(tmp_path):
    n = 50_000
    loss = 5 - np.arange(n) / n
    loss[12_345], loss[23_456] = 0.125, 40.0  # a lucky batch and a spike, deep inside buckets
    path = tmp_path / checkpoint.LOG_FILE
    lines = [{"type": "step", "step": s + 1, "loss": float(v), "dt": 0.01} for s, v in enumerate(loss)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    doc = views.training_view(tmp_path, name="r")
    steps = [p["step"] for p in doc["train"]]
    assert doc["decimated"] and len(steps) <= views.TRAIN_POINTS
    assert steps[0] == 1 and steps[-views.RECENT_POINTS :] == list(range(n - views.RECENT_POINTS + 1, n + 1))
    assert {12_346, 23_457} <= set(steps) and min(p["loss"] for p in doc["train"]) == 0.125


# ----------------------------------------------------------------------------- the server


def test_the_model_view_answers_while_the_log_is_being_read(tmp_path):
    """The log's read, held open: from inside it, /api/model is asked over HTTP and answers, and
    the lock of the model's views is free; then /api/training answers with the log."""
    run = tmp_path / "run"
    run.mkdir()
    tok = Tokenizer.train([b"the fox ran up a hill and down again " * 20], vocab_size=270)
    random_model(run / checkpoint.MODEL_FILE, tok)
    (run / checkpoint.LOG_FILE).write_text(
        "".join(json.dumps({"type": "step", "step": s, "loss": 1.0}) + "\n" for s in range(1, 1001)), encoding="utf-8"
    )
    running = Running(serve.make_server(run, port=0))
    seen: dict = {}
    real = running.server.held.training.read

    def read_slowly():
        seen["model lock held"] = running.server.lock.locked()
        url = f"http://127.0.0.1:{running.port}/api/model"
        request = urllib.request.Request(url, headers={"Host": f"127.0.0.1:{running.port}"})
        with urllib.request.urlopen(request, timeout=20) as answer:  # a stalled server fails here, never hangs
            seen["model"] = json.loads(answer.read())
        seen["thread"] = threading.current_thread().name
        return real()

    running.server.held.training.read = read_slowly
    try:
        doc = running.ok("/api/training")
        assert seen["model lock held"] is False
        assert seen["model"] == running.ok("/api/model") and seen["model"]["parameters"] > 0
        assert doc["last_step"] == 1000 and len(doc["train"]) == 1000
    finally:
        running.stop()
