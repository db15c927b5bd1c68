"""The page's Training view in bits per byte, and the run's evaluations (issue 31), in a real browser.

The loss chart switches between nats per token (train and validation, the unigram baseline) and
bits per byte (the validation loss alone: a train step's bytes are not counted); its points are
the log's numbers exactly, read back from their data-* attributes (tests/test_page.py says why
that comparison is exact). A log written before tk logged bits per byte leaves the switch off. The
evaluations `tk eval -m RUN_DIR` recorded are a table of their own. Screenshots go to
build/page-shots/ (tests/browser.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from browser import open_page, shot
from test_serve import Running, train_files

from tokenkit.cli import serve
from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint, trainlog

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("page_eval")
    found = train_files(d)
    tuned = d / "tuned"  # a run --init-from the first: its curve starts at step 0
    flags = ["--batch-size", "8", "--steps", "10", "--eval-interval", "5", "--eval-batches", "1", "--quiet"]
    assert main(["train-model", str(found["corpus"]), "--init-from", str(found["run"]), "-o", str(tuned), *flags]) == 0
    held = d / "held.txt"
    held.write_text((REPO / "corpora" / "tiny_tales_test.txt").read_text(encoding="utf-8")[:3000], encoding="utf-8")
    for corpus in (held, found["corpus"]):
        assert main(["eval", "-m", str(tuned), str(corpus), "-q"]) == 0
    return {**found, "tuned": tuned}


def opened(browser, run):
    live = Running(serve.make_server(run, port=0))
    return live, open_page(browser, f"http://127.0.0.1:{live.port}/?view=training")


def points(p, kind: str) -> list[tuple[int, float]]:
    found = p.eval_on_selector_all(
        f'#loss-chart .curve-point[data-kind="{kind}"]', "ns => ns.map(n => [n.dataset.step, n.dataset.loss])"
    )
    return [(int(s), float(x)) for s, x in found]


def test_the_loss_axis_switches_to_bits_per_byte(browser, files):  # noqa: F811
    run = files["tuned"]
    records = [r for r in trainlog.read_log(run / checkpoint.LOG_FILE) if r["type"] == "eval"]
    assert [r["step"] for r in records] == [0, 5, 10]
    live, p = opened(browser, run)
    try:
        assert p.is_enabled("#loss-unit") and p.input_value("#loss-unit") == "nats"
        assert points(p, "val") == [(r["step"], r["val_loss"]) for r in records]
        assert points(p, "train") and p.locator("#baseline").count() == 1
        p.select_option("#loss-unit", "bpb")
        assert p.get_attribute(".chart-wrap:has(#loss-chart)", "data-unit") == "bpb"
        assert points(p, "val") == [(r["step"], r["val_bits_per_byte"]) for r in records]
        assert points(p, "train") == [] and p.locator("#baseline").count() == 0
        assert "bits / byte" in p.text_content("#loss-chart")
        stats = p.text_content("#training-stats")
        best = min(r["val_bits_per_byte"] for r in records if r["step"] > 0)  # step 0 is the base model's
        assert f"{records[-1]['val_bits_per_byte']:.4f}" in stats and f"(best {best:.4f})" in stats
        assert "step 0: the model the run started from" in p.text_content("#training-body")
        rows = p.eval_on_selector_all(
            "#evaluations-table tbody tr",
            "ns => ns.map(n => [n.dataset.corpus, n.dataset.bitsPerByte, n.dataset.step])",
        )
        recorded = json.loads((run / checkpoint.EVAL_FILE).read_text())["evaluations"]
        assert [(c, float(b), int(s)) for c, b, s in rows] == [
            (key, e["bits_per_byte"], e["step"]) for key, e in sorted(recorded.items())
        ]
        shot(p, "training-bits-per-byte")
        p.select_option("#loss-unit", "nats")
        assert points(p, "val") == [(r["step"], r["val_loss"]) for r in records]
        shot(p, "training-init-from")
        assert p.tk_errors == []
    finally:
        p.context.close()
        live.stop()


def test_an_old_log_leaves_the_switch_off_and_no_evaluations_are_said(browser, files, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(files["run"], run)
    log = run / checkpoint.LOG_FILE
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "val_bits_per_byte"}) + "\n" for r in lines))
    live, p = opened(browser, run)
    try:
        assert not p.is_enabled("#loss-unit") and "no bits per byte" in p.get_attribute("#loss-unit", "title")
        assert points(p, "val") == [(r["step"], r["val_loss"]) for r in lines if r["type"] == "eval"]
        assert "None recorded: tk eval -m RUN_DIR" in p.text_content("#evaluations")
        assert p.tk_errors == []
    finally:
        p.context.close()
        live.stop()
