"""The whole road bundled: `tk pipeline --chat` (issue 32), on slices of the bundled corpora.

Checked, on a tiny model and a few steps: the stages run and write their files; accuracy.json
has its keys and equals pipeline/chat_accuracy.py recomputed on the saved models (the base grown
for the chat tokens, and the fine-tuned one), its baseline the majority baseline; the answers
through ChatSession see exactly the template's rendering of each held-out prompt and are the
greedy answers of the model rerun on the whole sequence for each token; a second run reuses every
stage, and new fine-tuning settings are refused until --overwrite; a run interrupted in
pretraining or in fine-tuning, run again, ends with the weights of the uninterrupted run; and
each bad input (a missing or damaged dialogues file, a damaged held-out line, a chat flag without
--chat, the defaults outside a checkout) is one line that leaves no run directory behind.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import signal_at_step

from tokenkit.bpe.chat_template import CHAT_TOKENS, END, render
from tokenkit.cli.main import main
from tokenkit.pipeline import chat_answers
from tokenkit.pipeline.chat_accuracy import accuracy, baseline, read_held_out
from tokenkit.pipeline.chat_pipeline import ACCURACY_FILE, BASE_DIR, CHAT_DIR, CHAT_STAMP
from tokenkit.pipeline.checkpoint import load_model

REPO = Path(__file__).resolve().parents[1]
N_NEW = 6  # tokens per answer: the tiny models babble, and a short answer keeps the test fast
TINY = ["--n-layers", "1", "--n-heads", "2", "--d-model", "32", "--batch-size", "4", "--eval-batches", "1",
        "--steps", "6", "--eval-interval", "3", "--workers", "1", "--chat-steps", "4", "-n", str(N_NEW)]  # fmt: skip
PRETRAIN_STEPS = 6


def tk(*argv: str) -> tuple[int, str, str]:
    """`tk argv` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("road")
    corpora = REPO / "corpora"
    (d / "tales.txt").write_bytes((corpora / "tiny_tales.txt").read_bytes()[:20_000])
    lines = (corpora / "tiny_dialogues.jsonl").read_bytes().splitlines(keepends=True)
    (d / "dialogues.jsonl").write_bytes(b"".join(lines[:24]))
    held = (corpora / "tiny_dialogues_test.jsonl").read_bytes().splitlines(keepends=True)
    (d / "held.jsonl").write_bytes(b"".join(held[:8]))
    return {"tales": d / "tales.txt", "dialogues": d / "dialogues.jsonl", "held": d / "held.jsonl"}


def road(files, run: Path, *extra: str) -> tuple[int, str, str]:
    return tk("pipeline", "--chat", str(files["tales"]), "--dialogues", str(files["dialogues"]),
              "--held-out", str(files["held"]), "-o", str(run), *TINY, *extra)  # fmt: skip


@pytest.fixture(scope="module")
def whole(files, tmp_path_factory) -> tuple[Path, str]:
    run = tmp_path_factory.mktemp("whole") / "run"
    code, out, err = road(files, run)
    assert code == 0, err
    return run, out


def plain_greedy(model, tok, prompt, n: int) -> str:
    """The greedy answer written plainly: the whole rendered sequence through the model for each
    new token (no cache), stopping at a chat token or after n."""
    ids = render(tok, prompt, generation_prompt=True).ids.astype(np.int64).tolist()
    stops = {tok.special_tokens[t] for t in CHAT_TOKENS}
    answer: list[int] = []
    for _ in range(n):
        logits = np.asarray(model.forward(np.asarray([ids + answer]))[0, -1], dtype=np.float64)
        token = int(np.argmax(logits))
        if token in stops:
            break
        answer.append(token)
    return tok.decode(answer)


def test_the_stages_write_their_files_and_the_report(whole):
    run, out = whole
    for name in ("model.safetensors", "train_state.safetensors", "tokenizer.safetensors", "tokens.npy"):
        assert (run / BASE_DIR / name).is_file(), name
    for name in ("model.safetensors", "train_state.safetensors", "log.jsonl"):
        assert (run / CHAT_DIR / name).is_file(), name
    assert (run / ACCURACY_FILE).is_file() and (run / CHAT_STAMP).is_file()
    assert not [p for p in run.rglob("*") if ".tmp" in p.name], "a temp file was left"
    _, tok, _ = load_model(run / CHAT_DIR)
    assert all(t in tok.special_tokens for t in CHAT_TOKENS)
    for line in ("pretraining:", "fine-tuning:", "majority baseline", "base model", "fine-tuned", "user: "):
        assert line in out, line
    assert "\nassistant: " in out
    assert f"tk chat -m {run / CHAT_DIR}" in out


def test_accuracy_json_is_chat_accuracy_recomputed_on_the_saved_models(whole, files):
    run, _ = whole
    record = json.loads((run / ACCURACY_FILE).read_text())
    assert {"held_out", "held_out_sha256", "base_model_sha256", "chat_model_sha256", "max_new_tokens", "rule",
            "baseline", "base", "chat"} <= set(record)  # fmt: skip
    assert record["max_new_tokens"] == N_NEW
    items = read_held_out(files["held"])
    expected_baseline = baseline(items)
    assert record["baseline"]["right"] == expected_baseline.right and record["baseline"]["total"] == len(items)
    chat_model, chat_tok, _ = load_model(run / CHAT_DIR)
    base_model, base_tok = chat_answers.grown(run / BASE_DIR)
    for key, (model, tok) in (("chat", (chat_model, chat_tok)), ("base", (base_model, base_tok))):
        part = record[key]
        # the plain answerer: no session, no cache
        again = accuracy(items, lambda prompt, m=model, t=tok: plain_greedy(m, t, prompt, N_NEW))
        assert [a["answer"] for a in part["answers"]] == [s.answer for s in again.scored], key
        assert [a["right"] for a in part["answers"]] == [s.right for s in again.scored], key
        assert (part["right"], part["total"]) == (again.right, again.total), key
        assert part["fraction"] == pytest.approx(again.right / again.total)
        assert {k: tuple(v) for k, v in part["by_kind"].items()} == again.by_kind
    assert base_tok.vocab_size == chat_tok.vocab_size  # the base was grown as fine-tuning grew it


def test_the_session_sees_the_templates_rendering_of_each_prompt(whole, files):
    run, _ = whole
    model, tok, _ = load_model(run / CHAT_DIR)
    for item in read_held_out(files["held"]):
        session, question = chat_answers.session_for(model, tok, item.prompt, N_NEW)
        reply = chat_answers.reply(session, question)
        rendered = render(tok, item.prompt, generation_prompt=True).ids.tolist()
        assert session.ids[: len(rendered)] == rendered
        assert session.ids[len(rendered) :] == [*reply.ids, tok.special_tokens[END]][: len(session.ids) - len(rendered)]


def test_a_second_run_reuses_every_stage(whole, files):
    run, out = whole
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".tk.lock"}
    code, again, err = road(files, run)
    assert code == 0, err
    for stage in ("tokenizer: up to date", "train: up to date", "chat: up to date", "accuracy: up to date"):
        assert stage in err, stage
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".tk.lock"} == before
    assert again.split("held-out accuracy")[1] == out.split("held-out accuracy")[1]


@pytest.mark.parametrize("step", [3, PRETRAIN_STEPS + 2], ids=["in-pretraining", "in-fine-tuning"])
def test_an_interrupted_road_run_again_ends_as_the_whole_one(whole, files, tmp_path, monkeypatch, step):
    run, _ = whole
    split = tmp_path / "split"
    restore = signal_at_step(monkeypatch, step)
    code, _, err = road(files, split)
    restore()
    assert code == 130, err
    assert "continue with the same command" in err and not (split / ACCURACY_FILE).exists()
    code, _, err = road(files, split)
    assert code == 0, err
    assert "resuming" in err
    for sub in (BASE_DIR, CHAT_DIR):
        a, b = load_model(run / sub).model.params, load_model(split / sub).model.params
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), sub
    mine, theirs = (json.loads((d / ACCURACY_FILE).read_text()) for d in (split, run))
    for key in ("baseline", "base", "chat"):
        assert mine[key] == theirs[key], key


def one_line(code: int, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, err)


def test_bad_input_is_one_line_before_anything_is_written(files, tmp_path, monkeypatch):
    run = tmp_path / "run"
    tales, held = str(files["tales"]), str(files["held"])
    code, _, err = tk("pipeline", "--chat", tales, "--dialogues", str(tmp_path / "none.jsonl"), "--held-out", held,
                      "-o", str(run), *TINY)  # fmt: skip
    one_line(code, err, "none.jsonl not found")
    bad = tmp_path / "bad.jsonl"
    lines = files["dialogues"].read_text().splitlines()
    bad.write_text("\n".join([*lines[:5], '{"messages": [{"role": "user", "content": "Hi"}', *lines[5:]]) + "\n")
    code, _, err = tk("pipeline", "--chat", tales, "--dialogues", str(bad), "--held-out", held, "-o", str(run), *TINY)
    one_line(code, err, "bad.jsonl:6")
    held_bad = tmp_path / "held_bad.jsonl"
    records = [json.loads(line) for line in files["held"].read_text().splitlines()]
    del records[2]["key"]
    held_bad.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, _, err = tk("pipeline", "--chat", tales, "--dialogues", str(files["dialogues"]), "--held-out",
                      str(held_bad), "-o", str(run), *TINY)  # fmt: skip
    one_line(code, err, "held_bad.jsonl:3", '"key"')
    assert not run.exists()
    code, _, err = tk("pipeline", tales, "--dialogues", str(files["dialogues"]), "-o", str(run))
    one_line(code, err, "--dialogues", "add --chat")
    monkeypatch.chdir(tmp_path)  # no corpora/ here
    code, _, err = tk("pipeline", "--chat", "-o", str(run))
    one_line(code, err, "corpora/tiny_tales.txt not found")
    assert not run.exists()


def test_the_help_says_the_defaults_the_road_uses():
    from tokenkit.pipeline.chat_pipeline import PRETRAIN, ChatSettings

    code, out, _ = tk("pipeline", "--help")
    text = " ".join(out.split())
    assert code == 0
    assert f"--context-length {PRETRAIN['context_length']} and --steps {PRETRAIN['steps']} unless given" in text
    assert f"fine-tuning steps [default: {ChatSettings().steps}]" in text
    assert f"peak learning rate [default: {ChatSettings().lr}]" in text


def test_new_fine_tuning_settings_are_refused_until_overwrite(whole, files, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(whole[0], run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, _, err = road(files, run, "--chat-steps", "5")
    last = err.strip().splitlines()[-1]  # after the notes of the stages kept
    assert code == 1 and last.startswith("error: ") and "Traceback" not in err, err
    assert "fine-tuning settings changed" in last and "--overwrite" in last
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    code, _, err = road(files, run, "--chat-steps", "5", "--overwrite")
    assert code == 0, err
    assert "train: up to date" in err and "fine-tuning again (--overwrite)" in err
    assert load_model(run / CHAT_DIR).metadata["step"] == 5
    record = json.loads((run / ACCURACY_FILE).read_text())
    assert record["chat_model_sha256"] != json.loads((whole[0] / ACCURACY_FILE).read_text())["chat_model_sha256"]


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_plain_pipeline_into_the_road_s_directory_is_one_line_and_touches_nothing(whole, files, overwrite):
    # the road's runs are in base/ and chat/: a plain run beside them would be a third, mixed in
    run = whole[0]
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, _, err = tk("pipeline", str(files["tales"]), "-o", str(run), *TINY[:-4], *overwrite)
    one_line(code, err, "tk pipeline --chat", "base")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
