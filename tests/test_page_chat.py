"""The page's Chat view and its endpoint, /api/chat (pipeline/chat_views.py): the answers are
`tk chat`'s, each token's distribution the model's own, every bad request one line.

A random tiny model over a tokenizer given tk's chat template's tokens (its `<|end|>` row scaled,
so that answers stop at varied points, as tests/test_chat_cli.py builds them) is served. Its
greedy answers, turn after turn, are compared with `tk chat --json`'s for the same conversation;
a sampled one with `tk chat --seed`'s first; each token's `p_model` with the softmax of the model
rerun on the rendered conversation, and its `p` with the same after temperature and top-k. A
model in its own (Jinja) template answers as a ChatSession does, and one without a template is
one line, in the API and on the page.

The browser tests (marked slow, as tests/conftest.py marks the other page modules) share one
page: a message typed, its answer's chips the API's, a token clicked, its bars the API's numbers;
screenshots in build/page-shots/ (chat-*.png).
"""

from __future__ import annotations

import io
import json
import random
import sys
from urllib.parse import urlencode

import numpy as np
import pytest
from browser import open_page, shot, wait_drawn
from test_serve import Running

from tokenkit.bpe import Tokenizer
from tokenkit.bpe.chat_template import CHAT_TOKENS, END, add_chat_tokens, render
from tokenkit.bpe.jinja_template import ChatTemplate, with_template
from tokenkit.cli import serve
from tokenkit.cli.main import main
from tokenkit.pipeline import chat_views, checkpoint
from tokenkit.pipeline.chat_session import ChatSession, Reply
from tokenkit.transformer import GPT, GPTConfig
from tokenkit.transformer.sampling import softmax, top_k_filter

WORDS = ["the", " hero", " found", " a", " key", "\n", "?", "!", " é", "🙂", "Tom", " 42", "'s", " day"]
CONTEXT = 64
EOT = "<|endoftext|>"
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
FAILED = "Failed to load resource: the server responded with a status of 400 (Bad Request)"


def words(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def base() -> Tokenizer:
    text = words(random.Random(0), 3000).encode()
    return Tokenizer.train([text], vocab_size=300, special_tokens=[EOT], quiet=True)


def random_gpt(vocab: int, seed: int, scale_row: int | None = None) -> GPT:
    """A random untied GPT-2-style model, its head's row `scale_row` doubled (that token is the
    argmax in some states and not in others)."""
    config = GPTConfig(
        vocab_size=vocab, context_length=CONTEXT, d_model=32, n_layers=2, n_heads=4, tie_embeddings=False
    )
    model = GPT(config, seed=seed)
    rng = np.random.default_rng(seed)
    for name, value in model.params.items():  # the norms' gains about 1: answers vary with the conversation
        value[...] = rng.normal(1.0 if "ln" in name else 0.0, 0.3, value.shape)
    if scale_row is not None:
        model.params["lm_head.weight"][scale_row] *= 2.0
    return model


def saved(path, model: GPT, tok: Tokenizer):
    cfg = model.config.to_dict()
    checkpoint.save_model(path, model.params, tok, config=cfg, step=0, val_loss=None, best_val_loss=None, provenance={})
    return path


@pytest.fixture(scope="module")
def chat(base, tmp_path_factory):
    """(model file, model, tokenizer) of a model in tk's template."""
    tok = add_chat_tokens(base)
    model = random_gpt(tok.vocab_size, 0, tok.special_tokens[END])
    return saved(tmp_path_factory.mktemp("chat") / "chat.safetensors", model, tok), model, tok


@pytest.fixture(scope="module")
def srv(chat):
    with Running(serve.make_server(chat[0], port=0)) as running:
        yield running


@pytest.fixture(scope="module")
def plain_srv(base, tmp_path_factory):
    """A server of a model whose tokenizer has no chat template."""
    path = saved(tmp_path_factory.mktemp("plain") / "plain.safetensors", random_gpt(base.vocab_size, 1), base)
    with Running(serve.make_server(path, port=0)) as running:
        yield running


def ask(srv, messages, **settings) -> dict:
    return srv.ok("/api/chat", messages=json.dumps(messages), **settings)


def tk_chat(monkeypatch, capsys, path, lines: list[str], *flags: str) -> list[dict]:
    """`tk chat -m PATH --json FLAGS` fed `lines`: its answer lines."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(("\n".join(lines) + "\n").encode())))
    code = main(["chat", "-m", str(path), "--json", *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


# ----------------------------------------------------------------------------- the answers are tk chat's


def test_greedy_answers_turn_after_turn_are_tk_chat_json_s(chat, srv, monkeypatch, capsys):
    path, model, tok = chat
    rng = random.Random(5)
    users = [words(rng, rng.randint(1, 5)) for _ in range(4)]
    system = {"role": "system", "content": "Tom?"}
    lines = [json.dumps(m) for m in [system, *({"role": "user", "content": u} for u in users)]]  # "\n" in a message
    said = tk_chat(monkeypatch, capsys, path, lines, "--temperature", "0", "-n", "9")
    answers = said[1:]
    stops = {a["stop"] for a in answers}
    assert len(answers) == len(users) and "length" in stops and stops & {"end", "turn"}  # the premise: both kinds
    messages, read_before = [system], 0
    for user, expected in zip(users, answers, strict=True):
        messages.append({"role": "user", "content": user})
        doc = ask(srv, messages, temperature=0, n=9)
        assert (doc["ids"], doc["content"], doc["stop"]) == (expected["ids"], expected["content"], expected["stop"])
        assert [s["id"] for s in doc["steps"]] == doc["ids"]
        for step in doc["steps"]:  # greedy: the argmax, drawn with probability 1
            assert step["p"] == 1.0 and step["top"][0]["id"] == step["id"] and step["top"][0]["p_model"] > 0
        end, ending = doc["end_step"], {tok.special_tokens[t] for t in CHAT_TOKENS} | {tok.special_tokens[EOT]}
        assert (end is not None) == (doc["stop"] in ("end", "turn")) and (end is None or end["id"] in ending)
        assert end is None or (end["top"][0]["id"] == end["id"] and end["p"] == 1.0)
        assert doc["dropped_turns"] == 0 and doc["context_length"] == CONTEXT and doc["template"] == "tk"
        # the conversation as the model read it: the template's rendering, each earlier answer its ids and <|end|>
        read = len(render(tok, [system, messages[-1]], generation_prompt=True).ids) + read_before
        assert doc["prompt_tokens"] == read < CONTEXT
        messages.append({"role": "assistant", "content": expected["content"], "ids": expected["ids"]})
        read_before += len(render(tok, [messages[-2]], generation_prompt=True).ids) + len(expected["ids"]) + 1


def test_each_token_s_distribution_is_the_model_s_rerun_on_the_conversation(chat, srv, monkeypatch, capsys):
    path, model, tok = chat
    messages = [{"role": "user", "content": "Tom found a key?"}]
    settings = {"temperature": 0.7, "top_k": 5, "seed": 11, "n": 6}
    doc = ask(srv, messages, **settings, show=8)
    said = tk_chat(monkeypatch, capsys, path, ["Tom found a key?"], "--temperature", "0.7", "--top-k", "5",
                   "--seed", "11", "-n", "6")  # fmt: skip
    assert doc["ids"] == said[0]["ids"] and doc["stop"] == said[0]["stop"]  # a fresh session's first answer
    ids = render(tok, messages, generation_prompt=True).ids.tolist()
    assert doc["steps"], "the premise: an answer of at least one token"
    for step in doc["steps"]:
        logits = model.forward(np.asarray([ids]))[0, -1].astype(np.float64)  # no cache: the whole conversation
        p_model = softmax(logits)
        p = softmax(top_k_filter(logits / 0.7, 5))
        order = np.argsort(-logits, kind="stable")[:8].tolist()
        assert [row["id"] for row in step["top"]] == order
        close = {"rel": 1e-5, "abs": 1e-9}  # float32 logits, from the cache or not
        assert [row["p_model"] for row in step["top"]] == pytest.approx(p_model[order].tolist(), **close)
        assert [row["p"] for row in step["top"]] == pytest.approx(p[order].tolist(), **close)
        assert sum(row["p"] > 0 for row in step["top"]) == 5 and step["p"] == pytest.approx(p[step["id"]], **close)
        ids.append(step["id"])


def test_an_answer_without_ids_is_read_as_its_text(chat, srv):
    _, model, tok = chat
    first = [{"role": "user", "content": "the hero"}]
    answer = ask(srv, first, temperature=0, n=5)
    text_only = [*first, {"role": "assistant", "content": "Tom's day!"}, {"role": "user", "content": " a key"}]
    with_ids = [*text_only[:1], {**text_only[1], "ids": tok.encode("Tom's day!")}, text_only[2]]
    assert ask(srv, text_only, temperature=0, n=7)["ids"] == ask(srv, with_ids, temperature=0, n=7)["ids"]
    assert answer["content"] == tok.decode(answer["ids"])


def test_a_conversation_past_the_context_drops_its_oldest_turns(chat, srv):
    rng = random.Random(2)
    messages = []
    for _ in range(8):  # about 8 tokens a turn: past the context of 64
        messages += [{"role": "user", "content": words(rng, 3)}, {"role": "assistant", "content": words(rng, 2)}]
    messages.append({"role": "user", "content": "the key?"})
    doc = ask(srv, messages, temperature=0, n=4)
    assert doc["dropped_turns"] > 0 and doc["prompt_tokens"] <= CONTEXT - CONTEXT // 4
    # the same as the conversation sent without those turns, which fits: nothing dropped then
    shorter = ask(srv, messages[2 * doc["dropped_turns"] :], temperature=0, n=4)
    assert shorter["dropped_turns"] == 0 and (shorter["ids"], shorter["prompt_tokens"]) == (
        doc["ids"],
        doc["prompt_tokens"],
    )


def test_a_model_in_its_own_template_answers_as_a_chat_session(base):
    pytest.importorskip("jinja2")
    chatml = Tokenizer(base.merges, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok = with_template(chatml, ChatTemplate(CHATML))
    model = random_gpt(tok.vocab_size, 4, tok.special_tokens["<|im_end|>"])
    session = ChatSession(model, tok, system="Be brief.", temperature=0, max_new_tokens=6)
    messages = [{"role": "system", "content": "Be brief."}]
    for text in ["Who found the key?", "And then?", " Tom's 42 "]:
        messages.append({"role": "user", "content": text})
        doc = chat_views.chat_view(model, tok, messages, temperature=0, n=6)
        reply = [e for e in session.reply(text) if isinstance(e, Reply)][0]
        assert (doc["ids"], doc["stop"], doc["template"]) == (list(reply.ids), reply.stop, "own")
        messages.append({"role": "assistant", "content": reply.content})
    assert chat_views.chat_status(model, tok)["template"] == "own"


# ----------------------------------------------------------------------------- bounds: one line, 4xx


def one_line_refusal(srv, status: int, **params) -> str:
    code, doc = srv.get("/api/chat", **params)
    assert code == status, doc
    assert list(doc) == ["error"] and "\n" not in doc["error"] and "Traceback" not in doc["error"]
    return doc["error"]


USER = [{"role": "user", "content": "Tom?"}]


@pytest.mark.parametrize(
    "params, says",
    [
        ({"messages": "[{"}, "is not valid JSON"),
        ({"messages": json.dumps([{"role": "user", "content": "x" * 20_001}])}, "at most 20,000"),
        ({"messages": "[" * 100 + "]" * 100}, "nested deeper"),
        ({"messages": json.dumps([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}] * 33)},
         "more than the 65"),
        ({"messages": json.dumps({"role": "user", "content": "a"})}, "a JSON list"),
        ({"messages": "[]"}, "messages are empty"),
        ({"messages": json.dumps([{"role": "assistant", "content": "Hi"}])}, "where the user's turn comes"),
        ({"messages": json.dumps([*USER, {"role": "assistant", "content": "Hi"}])}, "a prompt ends with the user's"),
        ({"messages": json.dumps([{"role": "user", "content": 3}])}, "not a string"),
        ({"messages": json.dumps([*USER, {"role": "assistant", "content": "a", "ids": "12"}, *USER])}, "whole numbers"),
        ({"messages": json.dumps([*USER, {"role": "assistant", "content": "a", "ids": [True]}, *USER])},
         "whole numbers"),
        ({"messages": json.dumps([*USER, {"role": "assistant", "content": "a", "ids": [10**6]}, *USER])},
         "not one of the tokenizer's"),
        ({"messages": json.dumps([*USER, {"role": "assistant", "content": "a", "ids": [303]}, *USER])},
         "ends a turn"),  # <|end|>
        ({"messages": json.dumps([{"role": "user", "content": "the hero " * 40}])}, "shorten it"),
        ({"messages": json.dumps(USER), "n": 201}, "n must be"),
        ({"messages": json.dumps(USER), "temperature": "-1"}, "temperature"),
        ({"messages": json.dumps(USER), "top_p": "0"}, "top_p"),
        ({"messages": json.dumps(USER), "top_k": "0"}, "top_k"),
        ({"messages": json.dumps(USER), "seed": "-1"}, "seed"),
        ({"messages": json.dumps(USER), "show": "101"}, "show"),
        ({"messages": json.dumps(USER), "turns": "3"}, "unknown parameter"),
    ],
)  # fmt: skip
def test_bad_requests_are_one_line_400s(srv, chat, params, says):
    assert chat[2].special_tokens[END] == 303  # the id the case above names
    assert says in one_line_refusal(srv, 400, **params)


def test_a_model_without_a_template_says_why_in_one_line(plain_srv, srv):
    status = plain_srv.ok("/api/chat")
    assert status == {"available": False, "why": chat_views.NO_TEMPLATE, "template": None,
                      "context_length": CONTEXT, "messages": chat_views.MESSAGES_MAX}  # fmt: skip
    assert one_line_refusal(plain_srv, 404, messages=json.dumps(USER)) == chat_views.NO_TEMPLATE
    assert srv.ok("/api/chat")["available"] is True and srv.ok("/api/chat")["template"] == "tk"


# ----------------------------------------------------------------------------- the page


@pytest.fixture(scope="module")
def page(browser, srv):
    """One page of the chat model's server for the module's browser tests: no console errors but
    the 400s a test caused on purpose, nothing asked of another server."""
    p = open_page(browser, srv.base + "?" + urlencode({"view": "chat", "temperature": "0", "n": "8"}))
    p.set_default_timeout(15_000)
    p.tk_allowed = []
    yield p
    assert [url for url in p.tk_requests if not url.startswith(srv.base)] == []
    assert [e for e in p.tk_errors if e not in p.tk_allowed] == []
    p.context.close()


def send(p, text: str) -> None:
    before = p.locator(".bubble.assistant:not(.pending)").count()
    p.fill("#chat-input", text)
    p.press("#chat-input", "Enter")
    p.wait_for_function(
        "n => document.querySelectorAll('.bubble.assistant:not(.pending)').length > n"
        " && !document.querySelector('#chat-pending')",
        arg=before,
    )


def chips(p, turn: int) -> list[int]:
    return [
        int(i)
        for i in p.eval_on_selector_all(
            f'.chat-token[data-turn="{turn}"]:not(.chat-end)', "els => els.map(e => e.dataset.id)"
        )
    ]


def bar_ps(p) -> list[float]:
    return [float(x) for x in p.eval_on_selector_all("#chat-bars .bar", "els => els.map(e => e.dataset.p)")]


def inside(p) -> None:
    """Nothing overflows: the page no wider than the window, each bubble and chip inside the log."""
    assert p.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert p.evaluate(
        """() => {
            const log = document.querySelector('#chat-log').getBoundingClientRect();
            return [...document.querySelectorAll('#chat-log .bubble')].every(b => {
                const r = b.getBoundingClientRect();
                return r.left >= log.left - 0.5 && r.right <= log.right + 0.5
                    && [...b.querySelectorAll('.chip')].every(c => c.getBoundingClientRect().right <= r.right + 0.5);
            });
        }"""
    )


@pytest.mark.slow
def test_a_typed_message_gets_the_api_s_answer_and_a_token_shows_its_bars(page, srv):
    p = page
    assert p.get_attribute('#tabs a[data-view="chat"]', "aria-current") == "page"
    assert p.query_selector("#text").is_visible() is False  # the view has its own input
    send(p, "Who found the key?")
    messages = [{"role": "user", "content": "Who found the key?"}]
    doc = ask(srv, messages, temperature=0, n=8, show=10)
    assert chips(p, 0) == doc["ids"] and doc["ids"]
    p.click(
        '.chat-token[data-turn="0"][data-step="1"]'
        if len(doc["ids"]) > 1
        else '.chat-token[data-turn="0"][data-step="0"]'
    )
    step = doc["steps"][1 if len(doc["ids"]) > 1 else 0]
    # greedy: the bars are the model's own probabilities, the top one the API's
    assert p.get_attribute("#chat-step", "data-which") == "p_model"
    assert bar_ps(p) == [row["p_model"] for row in step["top"]]
    assert p.get_attribute("#chat-bars .bar.drawn", "data-id") == str(step["id"])
    p.click('button.which[data-which="p"]')  # the distribution drawn from: all of it on that token
    assert bar_ps(p) == [1.0]
    p.click('button.which[data-which="p_model"]')
    # a second turn: the page sends the first answer's ids back, and the answer is the API's
    send(p, " a hero's day")
    messages += [
        {"role": "assistant", "content": doc["content"], "ids": doc["ids"]},
        {"role": "user", "content": " a hero's day"},
    ]
    second = ask(srv, messages, temperature=0, n=8, show=10)
    assert chips(p, 1) == second["ids"]
    inside(p)
    shot(p, "chat-greedy")
    p.reload()  # the conversation stays in the tab
    wait_drawn(p)
    assert chips(p, 0) == doc["ids"] and chips(p, 1) == second["ids"]
    assert "messages" not in p.url and "hero" not in p.url  # not in the address
    p.click("#chat-reset")
    assert p.locator(".bubble").count() == 0 and p.locator("#chat-empty").count() == 1


@pytest.mark.slow
def test_sampled_answers_show_the_distribution_drawn_from(page, srv):
    p = page
    p.goto(srv.base + "?" + urlencode({"view": "chat", "temperature": "1.5", "top_k": "4", "seed": "7", "n": "6"}))
    wait_drawn(p)
    p.click("#chat-system-box summary")  # the system message, folded away until asked for
    p.fill("#chat-system", "Tom?")
    send(p, "the key")
    doc = ask(srv, [{"role": "system", "content": "Tom?"}, {"role": "user", "content": "the key"}],
              temperature=1.5, top_k=4, seed=7, n=6, show=10)  # fmt: skip
    assert chips(p, 0) == doc["ids"] and doc["ids"]
    p.click('.chat-token[data-turn="0"][data-step="0"]')
    assert p.get_attribute("#chat-step", "data-which") == "p"  # sampled: the distribution drawn from
    drawn = [row["p"] for row in doc["steps"][0]["top"] if row["p"] > 0]
    assert bar_ps(p) == drawn and len(drawn) == 4 and max(bar_ps(p)) == bar_ps(p)[0]
    assert p.locator(".bubble.system").count() == 1
    inside(p)
    shot(p, "chat-sampled")
    p.click("#chat-reset")
    p.fill("#chat-system", "")


@pytest.mark.slow
def test_a_conversation_past_one_request_sends_its_latest_turns(page, srv, chat):
    p, tok = page, chat[2]
    turns = [{"user": f"the key {i}", "answer": {"content": "Tom", "ids": tok.encode("Tom"), "stop": "end",
              "steps": [], "end_step": None, "settings": {"temperature": "0"}}} for i in range(40)]  # fmt: skip
    p.evaluate(  # a conversation kept in the tab, as the page keeps it, longer than one request holds
        "turns => sessionStorage.setItem(`tk-chat:${TK.info.model.name}:${TK.info.model.config.vocab_size}`,"
        " JSON.stringify({system: '', turns}))",
        turns,
    )
    p.goto(srv.base + "?" + urlencode({"view": "chat", "temperature": "0", "n": "5"}))
    wait_drawn(p)
    assert p.locator(".bubble.user").count() == 40
    send(p, "a day")
    sent = [m for t in turns[-32:] for m in ({"role": "user", "content": t["user"]}, {"role": "assistant",
            "content": "Tom", "ids": t["answer"]["ids"]})]  # fmt: skip
    doc = ask(srv, [*sent, {"role": "user", "content": "a day"}], temperature=0, n=5)
    assert chips(p, 40) == doc["ids"]  # the 32 latest turns, within the 65 messages a request holds
    assert "the 8 oldest not sent" in p.text_content('.bubble.assistant[data-turn="40"] .bubble-meta')
    inside(p)
    shot(p, "chat-long")
    p.click("#chat-reset")


@pytest.mark.slow
def test_a_refused_message_is_one_line_and_stays_to_edit(page, srv):
    p = page
    p.tk_allowed.append(FAILED)
    long = "the hero " * 40  # past the context of 64
    p.fill("#chat-input", long)
    p.press("#chat-input", "Enter")
    p.wait_for_selector("#chat-note.error")
    note = p.text_content("#chat-note")
    assert "shorten it" in note and "\n" not in note
    assert p.input_value("#chat-input") == long and p.locator(".bubble").count() == 0


@pytest.mark.slow
def test_without_a_template_the_view_says_why(browser, plain_srv):
    p = open_page(browser, plain_srv.base + "?view=chat")
    try:
        assert p.text_content("#chat-absent") == chat_views.NO_TEMPLATE
        assert p.locator("#chat-input").count() == 0 and p.tk_errors == []
        shot(p, "chat-absent")
    finally:
        p.context.close()
