"""One rule for a text longer than the model's context (pipeline/run.py's `fit_context`): every
command and view that runs the model forward on a text reads its last context_length tokens (a
tokenizer's BOS stays first), and says so once: one line on stderr, `"cut": N` in --json and in
tk serve's answers. Each is run on a text of context + k tokens and on the text it kept, and must
answer for the kept text alone; a text of exactly the context is read whole, and nothing is said.
(The page's notice: tests/test_page.py.)"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import pytest

from tokenkit.bpe import Tokenizer
from tokenkit.cli import serve_api
from tokenkit.cli.main import main
from tokenkit.pipeline import PipelineError, checkpoint, views
from tokenkit.pipeline.run import fit_context, load_model_and_tokenizer
from tokenkit.transformer import GPT, GPTConfig

CONTEXT = 8  # short: `tk explain --html` asks every position's attribution and every head's arithmetic


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Two random models of 2 layers x 2 heads over byte tokenizers (no merges: a character of
    ASCII is a token), one with a BOS; saved as tk checkpoints, each loads in milliseconds."""
    d = tmp_path_factory.mktemp("long_texts")
    plain, bos = Tokenizer([], special_tokens=["<|endoftext|>"]), Tokenizer([], special_tokens=["<s>"], bos="<s>")
    for seed, (name, tok) in enumerate({"plain": plain, "bos": bos}.items()):
        config = GPTConfig(vocab_size=tok.vocab_size, context_length=CONTEXT, d_model=16, n_layers=2, n_heads=2)
        model, rng = GPT(config, seed=seed), np.random.default_rng(seed)
        for value in model.params.values():  # every weight matters: no near-ties among the next tokens
            value[...] = rng.normal(0.0, 0.3, value.shape)
        meta = {"config": config.to_dict(), "step": 0, "val_loss": None, "best_val_loss": None, "provenance": {}}
        checkpoint.save_model(d / f"{name}.safetensors", model.params, tok, **meta)
    return {"plain": d / "plain.safetensors", "bos": d / "bos.safetensors"}


def text_of(n: int) -> str:
    """n characters, each a token, no two neighbours alike: a kept window is told apart from others."""
    return "".join(chr(ord("a") + (7 * i) % 26) for i in range(n))


def kept_ids(tok: Tokenizer, text: str) -> list[int]:
    """The plain reference: the model reads the text's last CONTEXT ids, its BOS (when it has one) first."""
    ids = tok.encode_for_model(text)
    if len(ids) <= CONTEXT:
        return ids
    return [ids[0], *ids[len(ids) - CONTEXT + 1 :]] if tok.bos is not None else ids[len(ids) - CONTEXT :]


def tk(capsys, *argv: str) -> tuple[str, list[str]]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err.splitlines()


# ----------------------------------------------------------------------------- the rule itself


@pytest.mark.parametrize("bos", [False, True])
def test_fit_context_keeps_the_last_ids_and_says_how_many_it_dropped(bos):
    for context in (1, 2, 5):
        for n in range(1, 12):
            if bos and context == 1:
                continue  # a model of context 1 with a BOS reads the BOS alone: no text
            ids = list(range(100, 100 + n))
            said: list[str] = []
            got = fit_context(ids, context, bos, said.append)
            want = ids if n <= context else ids[:1] + ids[n - context + 1 :] if bos else ids[n - context :]
            assert got.ids == want and len(got.ids) == min(n, context)
            assert got.cut == max(0, n - context) == n - len(got.ids)
            assert len(said) == (n > context)
            if said:
                assert said[0].startswith(
                    f"warning: the text is {n} tokens, longer than the model's context of {context}"
                )
                assert f"the first {n - context}" in said[0] and "\n" not in said[0]
    assert views.cut_field(0) == {} and views.cut_field(3) == {"cut": 3}


def test_a_views_own_bound_below_the_context_still_refuses_in_one_line(models):
    model, tok = load_model_and_tokenizer(models["plain"])
    assert views.model_ids(model, tok, text_of(5), views.REFUSE, limit=5).ids == tok.encode(text_of(5))
    with pytest.raises(PipelineError, match=r"^the text is 6 tokens, more than the 5 this view shows; shorten it$"):
        views.model_ids(model, tok, text_of(6), views.REFUSE, limit=5)
    with pytest.raises(
        PipelineError, match=rf"^the text is {CONTEXT + 3} tokens; the model reads its last {CONTEXT}, more"
    ):
        views.model_ids(model, tok, text_of(CONTEXT + 3), views.REFUSE, limit=5)


# ----------------------------------------------------------------------------- every command and view


def cli_json(capsys, *argv: str) -> tuple[dict, list[str]]:
    out, err = tk(capsys, *argv)
    return json.loads(out), err


def read_ids(doc: dict) -> list[int]:
    return doc["prompt_ids"] if "prompt_ids" in doc else [t["id"] for t in doc["tokens"]]


def commands(capsys, model: Path, text: str) -> dict[str, tuple[object, list[str]]]:
    """Each command's output on `text` (what it printed, or its document) and its stderr lines."""
    m = ["-m", str(model)]
    out = {
        "predict-next": tk(capsys, "predict-next", *m, text, "--top-k", "5"),
        "predict-next --json": cli_json(capsys, "predict-next", *m, text, "--top-k", "5", "--json"),
        "generate": tk(capsys, "generate", *m, text, "-n", "4", "--temperature", "0"),
        "explain": tk(capsys, "explain", *m, text, "--layer", "1", "--head", "1"),
        "explain --json": cli_json(capsys, "explain", *m, text, "--json"),
    }
    generated, err = out["generate"]
    out["generate"] = generated[len(text) :], err  # the continuation, after the echoed text
    return out


def page_answers(capsys, model: Path, text: str, html: Path) -> tuple[dict[str, dict], list[str]]:
    """`tk explain --html`'s answers of the model's views (each layer, head and position), and its
    stderr lines but the last ("page written")."""
    _, err = tk(capsys, "explain", "-m", str(model), text, "--html", str(html))
    page = html.read_text(encoding="utf-8")
    start = page.index("window.TK_DATA = ") + len("window.TK_DATA = ")
    answers = json.loads(page[start : page.index(";</script>", start)])["answers"]
    return {key: answer for key, answer in answers.items() if key.startswith(tuple(ENDPOINTS))}, err[:-1]


ENDPOINTS = {  # tk serve's views of a text, with their parameters
    "/api/next": {"top_k": 5},
    "/api/generate": {"n": 4, "temperature": 0},
    "/api/attention": {"layer": 1, "head": 1},
    "/api/thumbnails": {},
    "/api/explain": {"layer": 1, "head": 1, "query": 3},
    "/api/lens": {},
    "/api/attribution": {"position": 3},
}


def served(model: Path, text: str) -> dict[str, dict]:
    held = serve_api.open_holdings(model)
    return {path: serve_api.answer(held, path, urlencode({"text": text, **q})) for path, q in ENDPOINTS.items()}


@pytest.mark.parametrize("tokenizer", ["plain", "bos"])
@pytest.mark.parametrize("over", [0, 5])
def test_every_command_and_view_reads_the_last_context_tokens_and_says_so(models, capsys, tmp_path, tokenizer, over):
    model = models[tokenizer]
    _, tok = load_model_and_tokenizer(model)
    text = text_of(CONTEXT + over - (tok.bos is not None))  # context + over ids, the BOS among them
    kept = kept_ids(tok, text)
    kept_text = tok.decode(kept[1:] if tok.bos is not None else kept)
    assert tok.encode_for_model(kept_text) == kept and len(kept) == CONTEXT
    said = (
        []
        if not over
        else [
            f"warning: the text is {CONTEXT + over} tokens, longer than the model's context of {CONTEXT}; using "
            + (f"its BOS and last {CONTEXT - 1} (the first {over} after the BOS dropped)" if tok.bos else "")
            + ("" if tok.bos else f"its last {CONTEXT} (the first {over} dropped)")
        ]
    )
    long = commands(capsys, model, text)
    whole = commands(capsys, model, kept_text) if over else copy.deepcopy(long)
    for name in long:
        (got, err), (want, want_err) = long[name], whole[name]
        assert err == said + want_err, name  # one line, before what the kept text says
        if isinstance(got, str):
            assert got == want, name  # the tables and the continuation are the kept text's
            continue
        assert read_ids(got) == kept and got.pop("cut", 0) == over, name
        got.pop("text", None), want.pop("text", None)  # explain's document holds the text it was given
        assert got == want, name
    if over:  # the page file: its answers are tk serve's, below; here what it holds and says
        answers, err = page_answers(capsys, model, text, tmp_path / "page.html")
        assert err == said and len(answers) > len(ENDPOINTS) and all(a["cut"] == over for a in answers.values())
        assert answers[f"/api/next?{urlencode({'text': text, 'top_k': 10})}"]["prompt_ids"] == kept
    long_views, whole_views = served(model, text), served(model, kept_text)
    for path, doc in long_views.items():
        assert read_ids(doc) == kept and doc.pop("cut", 0) == over, path
        if path == "/api/explain":
            doc.pop("text"), whole_views[path].pop("text")
        assert doc == whole_views[path], path
