"""`tk chat` and the session under it (pipeline/chat_session.py): a conversation over a kept KV cache.

Random tiny models over a tokenizer given the chat template's tokens (their `<|end|>` or end-of-text
row scaled, so that answers stop at varied points) are compared with a plain reference that
renders the whole conversation and reruns the model on all of it for every token, no cache:
greedy and sampled answers over several turns, the stops, the oldest turns dropped when the
context fills, /reset and /system, then `tk chat --json` and the terminal mode end to end, and
each bad input as one line.
"""

from __future__ import annotations

import io
import json
import random
import sys

import numpy as np
import pytest

from tokenkit.bpe import Tokenizer
from tokenkit.bpe.chat_template import END, ROLE_TOKENS, add_chat_tokens, render
from tokenkit.cli.chat_commands import read_lines
from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint
from tokenkit.pipeline.chat_session import ChatSession, Dropped, Reply, Token
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer import GPT, GPTConfig, llama_config
from tokenkit.transformer.sampling import mask_from, sample_next

WORDS = ["the", " hero", " found", " a", " key", "\n", "?", "!", " é", "🙂", "Tom", " 42", "'s", " day"]


@pytest.fixture(scope="module")
def base() -> Tokenizer:
    rng = random.Random(0)
    text = "".join(rng.choice(WORDS) for _ in range(3000)).encode()
    return Tokenizer.train([text], vocab_size=300, special_tokens=["<|endoftext|>", "<|begin_of_text|>"], quiet=True)


@pytest.fixture(scope="module")
def tok(base) -> Tokenizer:
    return add_chat_tokens(base)


@pytest.fixture(scope="module")
def bos_tok(tok) -> Tokenizer:
    tensors, metadata = tok.to_tensors()
    return Tokenizer.from_tensors(tensors, {**metadata, "format_version": "2", "bos": "<|begin_of_text|>"})


def chat_model(tok, seed=0, context=96, scale=(END, 2.0), llama=False, pad=0) -> GPT:
    """A random untied GPT (GPT-2's or Llama's kind) over `tok`; the head's row of scale[0] times
    scale[1], so that token is the argmax in some states and not in others."""
    sizes = dict(vocab_size=tok.vocab_size + pad, context_length=context, d_model=32, n_layers=2, n_heads=4)
    config = llama_config(**sizes, n_kv_heads=2) if llama else GPTConfig(**sizes, tie_embeddings=False)
    model = GPT(config, seed=seed)
    rng = np.random.default_rng(seed)
    for value in model.params.values():
        value[...] = rng.normal(0.0, 0.3, value.shape)
    name, factor = scale
    if name in tok.special_tokens:
        model.params["lm_head.weight"][tok.special_tokens[name]] *= factor
    return model


def user_ids(tok, text):
    return render(tok, [{"role": "user", "content": text}], generation_prompt=True).ids.tolist()


def system_ids(tok, system):
    """What comes before the first turn: the BOS and the system message, as `render` gives them."""
    messages = ([] if system is None else [{"role": "system", "content": system}]) + [{"role": "user", "content": ""}]
    return render(tok, messages, generation_prompt=True).ids.tolist()[:-3]  # less <|user|><|end|><|assistant|>


def reference_chat(model, tok, steps, max_new, *, temperature=0.0, top_k=None, seed=None, n_tokens=None):
    """The conversation replayed plainly: `steps` are ("user", text), ("system", text or None) or
    ("reset",); every token is picked from the model run on the whole rendered conversation (tk's
    template via `render`), no cache; the oldest turns dropped, after the system message, while it
    passes the context, down to three quarters of it. Returns each answer's (ids, stop) and the
    final ids."""
    T = model.config.context_length
    special = tok.special_tokens
    end = special[END]
    stops = {special[t] for t in (*ROLE_TOKENS.values(), END)} | {special["<|endoftext|>"]}
    rng = np.random.default_rng(seed)
    system, turns, answers = None, [], []

    def prefix():  # BOS and the system message: the rendering before an empty user's turn
        return system_ids(tok, system)

    def fit(cur):
        if len(prefix()) + sum(map(len, turns)) + len(cur) > T:
            while len(prefix()) + sum(map(len, turns)) + len(cur) > T - T // 4 and turns:
                turns.pop(0)

    for step in steps:
        if step[0] == "reset":
            turns = []
            continue
        if step[0] == "system":
            system = step[1]
            continue
        cur = user_ids(tok, step[1])
        cur = cur[1:] if tok.bos is not None else cur  # render's BOS belongs to the prefix
        fit(cur)
        reply, stop = [], "length"
        for n in range(max_new):
            ids = prefix() + [i for t in turns for i in t] + cur
            logits = model.forward(np.asarray([ids]))[0, -1].astype(np.float64)
            if n_tokens is not None:
                logits = mask_from(logits, n_tokens)
            token = sample_next(logits, rng, temperature=temperature, top_k=top_k)
            if token in stops:
                stop = "end" if token == end else "turn"
                break
            cur.append(token)
            reply.append(token)
            if n + 1 == max_new:
                break
            fit(cur)
            if len(prefix()) + sum(map(len, turns)) + len(cur) > T:
                stop = "context"
                break
        turns.append(cur + [end])
        answers.append((reply, stop))
    return answers, prefix() + [i for t in turns for i in t]


def play(session, steps):
    """The session through `steps` (as `reference_chat` takes them): each answer's (ids, stop),
    checking that its Token events make up the Reply; and the Dropped events."""
    answers, dropped = [], []
    for step in steps:
        if step[0] == "reset":
            session.reset()
        elif step[0] == "system":
            session.set_system(step[1])
        else:
            events = list(session.reply(step[1]))
            reply = events[-1]
            assert isinstance(reply, Reply) and not any(isinstance(e, Reply) for e in events[:-1])
            tokens = [e for e in events if isinstance(e, Token)]
            assert [t.id for t in tokens] == list(reply.ids)
            assert "".join(t.text for t in tokens) + reply.rest == reply.content == session.tok.decode(reply.ids)
            dropped += [e for e in events if isinstance(e, Dropped)]
            answers.append((list(reply.ids), reply.stop))
    return answers, dropped


def spy(monkeypatch, model):
    """The (start, n) of every forward_cached call on `model`."""
    calls = []
    real = model.forward_cached

    def counted(ids, start, k, v):
        calls.append((int(start), ids.shape[1]))
        return real(ids, start, k, v)

    monkeypatch.setattr(model, "forward_cached", counted)
    return calls


def conversation(rng, n):
    return [("user", "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))) for _ in range(n)]


@pytest.mark.parametrize("variant", ["gpt2", "llama", "bos", "padded"])
def test_greedy_answers_equal_the_uncached_reference_over_turns_and_nothing_is_recomputed(
    tok, bos_tok, variant, monkeypatch
):
    rng = random.Random(variant)
    stops = set()
    for seed, factor in enumerate((1.5, 3.0, 5.0)):
        t = bos_tok if variant == "bos" else tok
        pad = 5 if variant == "padded" else 0
        model = chat_model(t, seed, llama=variant == "llama", scale=(END, factor), pad=pad)
        steps = ([("system", "Tom's key?")] if seed != 1 else []) + conversation(rng, 4)
        n_tokens = t.vocab_size if pad else None
        expected, final = reference_chat(model, t, steps, 8, n_tokens=n_tokens)
        session = ChatSession(model, t, temperature=0, max_new_tokens=8)
        calls = spy(monkeypatch, model)
        answers, dropped = play(session, steps)
        assert answers == expected and not dropped
        assert session.ids == final
        stops |= {stop for _, stop in answers}
        # every position computed once: the calls follow each other, and cover what the caches hold
        assert [start for start, _ in calls] == list(np.cumsum([0] + [n for _, n in calls[:-1]]))
        assert sum(n for _, n in calls) == len(session._fed) and session._fed == final[: len(session._fed)]
        if pad:
            assert all(i < t.vocab_size for ids, _ in answers for i in ids)
    assert {"end", "length"} <= stops  # answers that stop at <|end|> and answers cut at -n


def test_the_first_prompt_is_the_template_s_rendering(tok, bos_tok):
    for t in (tok, bos_tok):
        model = chat_model(t)
        session = ChatSession(model, t, system="Answer in one word.", temperature=0, max_new_tokens=0)
        list(session.reply("Where is <|end|> the key?"))
        messages = [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Where is <|end|> the key?"},
        ]
        assert session.ids[:-1] == render(t, messages, generation_prompt=True).ids.tolist()
        assert session.ids[-1] == t.special_tokens[END]  # a reply of no tokens, its turn closed


def test_the_model_s_end_token_or_a_role_s_ends_the_turn_closed_with_end(tok):
    for name, seed in (("<|endoftext|>", 0), ("<|user|>", 2)):
        model = chat_model(tok, seed, scale=(name, 8.0))
        steps = conversation(random.Random(name), 4)
        expected, final = reference_chat(model, tok, steps, 10)
        session = ChatSession(model, tok, temperature=0, max_new_tokens=10)
        answers, _ = play(session, steps)
        assert answers == expected and session.ids == final
        assert "turn" in {stop for _, stop in answers}
        # each such turn was closed with <|end|>: the token itself only where the template puts it
        assert session.ids.count(tok.special_tokens[name]) == (len(steps) if name == "<|user|>" else 0)
        assert session.ids.count(tok.special_tokens[END]) == 2 * len(steps)


def test_sampled_answers_repeat_with_a_seed_and_equal_the_reference(tok):
    steps = conversation(random.Random(5), 3)
    model = chat_model(tok, 5, scale=(END, 2.0))
    expected, _ = reference_chat(model, tok, steps, 8, temperature=0.9, top_k=40, seed=11)
    runs = []
    for _ in range(2):
        session = ChatSession(model, tok, temperature=0.9, top_k=40, seed=11, max_new_tokens=8)
        runs.append(play(session, steps)[0])
    assert runs[0] == runs[1] == expected


@pytest.mark.parametrize("llama", [False, True])
def test_old_turns_are_dropped_when_the_context_fills_as_the_reference_drops_them(tok, llama, monkeypatch):
    total_drops, stops = 0, set()
    for seed, factor, max_new in ((0, 0.5, 24), (1, 1.5, 12), (2, 3.0, 20)):
        model = chat_model(tok, seed, context=32, llama=llama, scale=(END, factor))
        steps = [("system", "Tom?")] + conversation(random.Random(seed), 8)
        expected, final = reference_chat(model, tok, steps, max_new)
        session = ChatSession(model, tok, temperature=0, max_new_tokens=max_new)
        calls = spy(monkeypatch, model)
        answers, dropped = play(session, steps)
        assert answers == expected and session.ids == final
        assert all(start + n <= 32 for start, n in calls)  # the caches never hold more than the context
        assert session.ids[:1] == [tok.special_tokens["<|system|>"]]
        system_len = len(session._prefix)
        assert all(start >= system_len for start, _ in calls[1:])  # the system message is computed once
        assert all(d.turns >= 1 and d.tokens > 0 and "system message kept" in d.message() for d in dropped)
        total_drops += len(dropped)
        stops |= {stop for _, stop in answers}
    assert total_drops >= 2 and "context" in stops  # answers that alone fill the context stop there


def test_reset_and_system_equal_the_reference_and_keep_the_system_s_cache(tok, monkeypatch):
    rng = random.Random(7)
    model = chat_model(tok, 7, scale=(END, 2.0))
    before = [("system", "Be brief.")] + conversation(rng, 2)
    after = [("reset",)] + conversation(rng, 2)
    later = [("system", "Tom's day!")] + conversation(rng, 1) + [("system", None)]
    last = conversation(rng, 1)
    expected, final = reference_chat(model, tok, before + after + later + last, 6)
    session = ChatSession(model, tok, temperature=0, max_new_tokens=6)
    calls = spy(monkeypatch, model)
    answers = play(session, before)[0]
    n = len(calls)
    answers += play(session, after)[0]
    start = calls[n][0]  # the first answer after /reset: the system message's positions are kept
    assert (
        len(system_ids(tok, "Be brief.")) <= start < len(system_ids(tok, "Be brief.")) + len(user_ids(tok, after[1][1]))
    )
    answers += play(session, later)[0]
    n = len(calls)
    answers += play(session, last)[0]
    assert answers == expected and session.ids == final
    assert calls[n][0] == 0  # the system message removed: every position moved


def test_refusals_leave_the_session_as_it_was(tok, base):
    model = chat_model(tok, context=32)
    session = ChatSession(model, tok, system="Tom?", temperature=0, max_new_tokens=3)
    list(session.reply("the key"))
    before = (session.ids, session.system)
    with pytest.raises(PipelineError, match=r"context holds 32, \d+ of them the system message: shorten it"):
        session.reply(" hero" * 40)
    with pytest.raises(PipelineError, match="at most half of it for the system message"):
        session.set_system(" hero" * 20)
    with pytest.raises(PipelineError, match="lone surrogate"):
        session.reply("\ud800")
    with pytest.raises(PipelineError, match="must be text"):
        session.reply(b"hi")
    assert (session.ids, session.system) == before
    with pytest.raises(PipelineError, match="was not fine-tuned for chat: its tokenizer lacks the chat template's"):
        ChatSession(chat_model(base), base)
    with pytest.raises(Exception, match="temperature must be >= 0"):
        ChatSession(model, tok, temperature=-1)


def test_an_answer_left_unread_or_closed_early_is_closed_in_the_conversation(tok):
    model = chat_model(tok, 2, scale=(END, 0.1))
    session = ChatSession(model, tok, temperature=0, max_new_tokens=8)
    events = session.reply("the key")
    first = next(events)
    events.close()
    assert session.turns[-1].stop == "interrupted" and session.turns[-1].reply_ids == [first.id]
    session.reply("Tom")  # never read
    list(session.reply("a day"))
    assert [t.stop for t in session.turns][:2] == ["interrupted", "interrupted"]
    assert session.ids.count(tok.special_tokens[END]) == 2 * 3  # each turn's user part and answer closed


# --- the command --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_file(tok, tmp_path_factory):
    model = chat_model(tok, 3, scale=(END, 2.0))
    path = tmp_path_factory.mktemp("chat") / "chat.safetensors"
    cfg = model.config.to_dict()
    checkpoint.save_model(path, model.params, tok, config=cfg, step=0, val_loss=None, best_val_loss=None, provenance={})
    return path, model


def tk_chat(monkeypatch, capsys, args, stdin: bytes):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(["chat", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_mode_end_to_end(model_file, tok, monkeypatch, capsys):
    path, model = model_file
    lines = [
        "Where is the key?",
        json.dumps({"role": "user", "content": "/Tom's key"}),
        json.dumps({"role": "system", "content": "Tom?"}),
        "",
        "//the hero",
        '{"role": "user", "content": ',  # broken JSON
        json.dumps({"role": "assistant", "content": "hi"}),
        "/nope",
        "/reset",
        "a day 🙂",
    ]
    code, out, err = tk_chat(
        monkeypatch,
        capsys,
        ["-m", str(path), "--json", "--temperature", "0", "-n", "7"],
        ("\n".join(lines) + "\n").encode(),
    )
    answers = [json.loads(line) for line in out.splitlines()]
    steps = [
        ("user", "Where is the key?"),
        ("user", "/Tom's key"),
        ("system", "Tom?"),
        ("user", "/the hero"),
        ("reset",),
        ("user", "a day 🙂"),
    ]
    expected, _ = reference_chat(model, tok, steps, 7)
    replies = [a for a in answers if a.get("role") == "assistant"]
    assert [(a["ids"], a["stop"]) for a in replies] == expected
    assert all(a["content"] == tok.decode(a["ids"]) and a["dropped_turns"] == 0 for a in replies)
    assert (
        answers[2]["role"] == "system"
        and answers[2]["content"] == "Tom?"
        and answers[2]["ids"][0] == tok.special_tokens["<|system|>"]
    )
    errors = [a for a in answers if "error" in a]
    assert [a["line"] for a in errors] == [6, 7, 8]
    assert errors[0]["error"].startswith("line 6 is not valid JSON") and '{"role": "user"' in errors[0]["error"]
    assert errors[1]["error"].startswith('line 7: the role "assistant"')
    assert errors[2]["error"].startswith("line 8: unknown command /nope")
    assert answers[7] == {"reset": True, "system": "Tom?"}
    assert len(answers) == len(lines) - 1  # one answer per non-blank line
    assert code == 1 and err.strip() == "error: 3 lines refused (each answer says why)"


def test_text_mode_streams_answers_and_notes_go_to_stderr(model_file, tok, monkeypatch, capsys):
    path, model = model_file
    stdin = b"the key\n/system Tom?\n/what\n\xff\xfe\n//hero\n/reset\n/quit\nnever read\n"
    code, out, err = tk_chat(monkeypatch, capsys, ["-m", str(path), "--temperature", "0", "-n", "5"], stdin)
    steps = [("user", "the key"), ("system", "Tom?"), ("user", "/hero"), ("reset",)]
    expected, _ = reference_chat(model, tok, steps, 5)
    assert code == 0
    assert out == "".join(tok.decode(ids) + "\n" for ids, _ in expected)
    notes = err.splitlines()
    assert "the system message is set" in notes
    assert "line 3: unknown command /what; the commands are /reset, /system TEXT, /quit" in err
    assert "error: line 4: not UTF-8 text; messages are UTF-8" in notes
    assert "the conversation was reset (the system message stays)" in notes
    assert sum("--max-new-tokens (5)" in line for line in notes) == sum(stop == "length" for _, stop in expected)


def test_a_model_without_the_chat_tokens_is_one_line(base, tmp_path, monkeypatch, capsys):
    model = chat_model(base)
    path = tmp_path / "plain.safetensors"
    checkpoint.save_model(
        path,
        model.params,
        base,
        config=model.config.to_dict(),
        step=0,
        val_loss=None,
        best_val_loss=None,
        provenance={},
    )
    code, out, err = tk_chat(monkeypatch, capsys, ["-m", str(path)], b"hi\n")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: {path} was not fine-tuned for chat")
    assert "tk train-model --chat DATA.jsonl --init-from MODEL" in err  # the way to a model that chats


def test_lines_are_bounded_and_a_long_one_is_skipped_whole():
    stream = io.BytesIO(b"short\n" + b"x" * 5000 + b"\nnext\r\nlast")
    got = list(read_lines(stream, limit=100))
    assert got[0] == (1, "short", None)
    assert got[1][:2] == (2, None) and "longer than" in got[1][2]
    assert got[2:] == [(3, "next", None), (4, "last", None)]


def _read_until(fd, marker: bytes, seen: bytearray, timeout: float = 60.0) -> None:
    """Read the terminal's output into `seen` until it holds `marker` after what was there."""
    import os
    import select
    import time

    start, deadline = len(seen), time.monotonic() + timeout
    while marker not in seen[start:]:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no {marker!r} on the terminal; it shows {bytes(seen)!r}"
        try:
            seen += os.read(fd, 4096)
        except OSError:  # the terminal closed: the process ended
            break
    assert marker in seen[start:], bytes(seen)


@pytest.mark.parametrize("end", ["ctrl-d", "ctrl-c"])
def test_at_a_terminal_a_prompt_asks_and_ctrl_d_or_ctrl_c_ends(model_file, tok, end):
    import os
    import signal
    import subprocess

    path, model = model_file
    (expected, _), *_ = reference_chat(model, tok, [("user", "the key")], 5)[0]
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkit", "chat", "-m", str(path), "--temperature", "0", "-n", "5"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    seen = bytearray()
    try:
        _read_until(master, b"> ", seen)
        assert seen.startswith(f"chatting with {path} (a context of 96 tokens); /reset, /system TEXT, /quit".encode())
        os.write(master, b"the key\n")
        _read_until(master, b"> ", seen)
        shown = seen.decode().replace("\r\n", "\n")
        assert f"the key\n{tok.decode(expected)}\n" in shown  # the echoed message, then the answer
        if end == "ctrl-d":
            os.write(master, b"\x04")
        else:
            proc.send_signal(signal.SIGINT)
            _read_until(master, b"interrupted", seen)
        assert proc.wait(timeout=60) == (0 if end == "ctrl-d" else 130)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
