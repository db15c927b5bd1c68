"""`tk serve` at the HTTP level (no browser): every endpoint's numbers are the commands' own, bad
input is a one-line 400, nothing outside the page's files is ever served, and the server follows a
model file that training replaces.

A small run is trained once for the module (tokenizer with a special token, a 2-layer model, 20
steps); the server runs in a thread of this process (`make_server`), except where the test is
about the process itself (the serving line, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import doctest
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

from tokenkit.bpe import Tokenizer
from tokenkit.cli import serve, serve_api
from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint, forward_views, live, token_views, trainlog, views
from tokenkit.pipeline.run import load_model_and_tokenizer
from tokenkit.transformer import GPT, GPTConfig
from tokenkit.transformer.config import llama_config
from tokenkit.transformer.explain import explain_model

REPO = Path(__file__).resolve().parents[1]
EOT = "<|endoftext|>"
TEXTS = ["Once upon a time", "The cat sat. Ça va? 日本😀", "a  b\n\n\tc"]


# ----------------------------------------------------------------------------- fixtures


def train_files(d: Path) -> dict[str, Path]:
    """In folder `d`: a corpus, a tokenizer with a special token, a second one without, and a run
    trained on them (a few seconds; tests/test_page.py builds its own the same way)."""
    corpus = d / "corpus.txt"
    corpus.write_bytes((REPO / "corpora" / "tiny_tales.txt").read_bytes()[:60_000])
    tok = Tokenizer.train([corpus], vocab_size=400, special_tokens=[EOT], workers=1, quiet=True)
    tok.save(d / "tok.safetensors")
    other = Tokenizer.train([corpus], vocab_size=300, pattern="gpt4", workers=1, quiet=True)
    other.save(d / "other.safetensors")
    Tokenizer(other.merges).save(d / "plain.safetensors")  # no training record: counts unknown
    run = d / "run"
    flags = ["--n-layers", "2", "--n-heads", "2", "--d-model", "32", "--context-length", "32"]
    flags += ["--batch-size", "8", "--steps", "20", "--eval-interval", "10", "--eval-batches", "1", "--quiet"]
    assert main(["train-model", str(corpus), "-t", str(d / "tok.safetensors"), "-o", str(run), *flags]) == 0
    return {"corpus": corpus, "tok": d / "tok.safetensors", "other": d / "other.safetensors",
            "plain": d / "plain.safetensors", "run": run}  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return train_files(tmp_path_factory.mktemp("serve"))


class Running:
    """A server in a thread of this process, and a way to ask it anything, byte for byte."""

    def __init__(self, server: serve.Server) -> None:
        self.server = server
        self.port = server.port
        self.base = f"http://127.0.0.1:{self.port}/"  # the page's address, for a browser
        self.thread = threading.Thread(target=server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def raw(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send `request` as it is; (status, headers, body) of the answer."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(request)
            data = b""
            while chunk := s.recv(1 << 16):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        return int(lines[0].split()[1]), headers, body

    def request(self, target: str, method: str = "GET", host: str | None = "default", extra: str = ""):
        host_line = "" if host is None else f"Host: {f'127.0.0.1:{self.port}' if host == 'default' else host}\r\n"
        return self.raw(f"{method} {target} HTTP/1.1\r\n{host_line}Connection: close\r\n{extra}\r\n".encode())

    def get(self, path: str, **params) -> tuple[int, dict]:
        query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
        status, headers, body = self.request(path + ("?" + query if query else ""))
        assert headers["Content-Type"] == "application/json; charset=utf-8"
        assert body.endswith(b"\n") and body.count(b"\n") == 1  # one line of JSON
        return status, json.loads(body)

    def ok(self, path: str, **params) -> dict:
        status, doc = self.get(path, **params)
        assert status == 200, doc
        return doc

    def refused(self, path: str, status: int = 400, **params) -> str:
        got, doc = self.get(path, **params)
        assert got == status and list(doc) == ["error"], (got, doc)
        assert "\n" not in doc["error"] and "Traceback" not in doc["error"]
        return doc["error"]


@pytest.fixture(scope="module")
def srv(files):
    with Running(serve.make_server(files["run"], compare=files["other"], port=0)) as running:
        yield running


def cli_json(capsys, *argv: str):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


# ----------------------------------------------------------------------------- the numbers are the commands'


@pytest.mark.parametrize("text", TEXTS)
def test_tokens_are_tk_encode_s(srv, files, capsys, text):
    doc = srv.ok("/api/tokens", text=text)
    assert doc["ids"] == cli_json(capsys, "encode", "-t", str(files["run"]), text, "--json")
    raw = text.encode("utf-8")
    assert b"".join(bytes.fromhex(t["bytes"]) for t in doc["tokens"]) == raw
    for t in doc["tokens"]:
        piece = raw[t["start"] : t["end"]]
        assert piece.hex() == t["bytes"] and not t["special"]
        assert t["partial"] == (t["text"] != piece.decode("utf-8", "replace"))
        if t["partial"]:
            assert t["text"] == piece.decode("utf-8", "backslashreplace") and "\\x" in t["text"]
    assert doc["n_bytes"] == len(raw) and doc["n_tokens"] == len(doc["ids"])
    assert doc["bytes_per_token"] == pytest.approx(len(raw) / len(doc["ids"]))


def test_special_tokens_follow_the_policy(srv, files, capsys):
    text = f"The end.{EOT}Once"
    error = srv.refused("/api/tokens", text=text)
    assert EOT in error and "specials=allow" in error and "specials=text" in error
    allowed = srv.ok("/api/tokens", text=text, specials="allow")
    assert allowed["ids"] == cli_json(capsys, "encode", "-t", str(files["run"]), text, "--allow-special", "--json")
    assert [t["special"] for t in allowed["tokens"]].count(True) == 1
    as_text = srv.ok("/api/tokens", text=text, specials="text")
    assert as_text["ids"] == cli_json(capsys, "encode", "-t", str(files["run"]), text, "--specials-as-text", "--json")
    assert not any(t["special"] for t in as_text["tokens"])
    assert srv.ok("/api/bpe", text=text, specials="allow")["ids"] == allowed["ids"]


@pytest.mark.parametrize("text", TEXTS)
def test_compare_marks_the_spans_cut_differently(srv, files, capsys, text):
    doc = srv.ok("/api/compare", text=text)
    assert doc["main"] == srv.ok("/api/tokens", text=text)
    assert doc["compare"] == srv.ok("/api/tokens", text=text, which="compare")
    assert doc["compare"]["ids"] == cli_json(capsys, "encode", "-t", str(files["other"]), text, "--json")
    spans = {tuple(s) for s in doc["differ"]}
    for side in ("main", "compare"):  # a token of either lies inside a differing span or is a token of both
        other = "compare" if side == "main" else "main"
        both = {(t["start"], t["end"]) for t in doc[other]["tokens"]}
        for t in doc[side]["tokens"]:
            inside = any(s <= t["start"] and t["end"] <= e for s, e in spans)
            assert inside != ((t["start"], t["end"]) in both)


def test_bpe_replay_ends_in_the_tokens_and_shows_merge_counts(srv, files):
    text = "Once upon a time, there was a little cat."
    doc = srv.ok("/api/bpe", text=text)
    assert doc["ids"] == srv.ok("/api/tokens", text=text)["ids"]
    seq = list(doc["initial"])
    assert len(seq) == len(text.encode())
    for step in doc["steps"]:
        assert step["new_id"] == 256 + step["rank"]
        for i in reversed(step["at"]):
            assert seq[i : i + 2] == step["pair"]
            seq[i : i + 2] = [step["new_id"]]
    assert seq == doc["ids"]
    assert doc["chunks"][0][0] == 0 and doc["chunks"][-1][1] == len(doc["initial"])
    assert all(str(i) in doc["pieces"] for i in doc["initial"] + doc["ids"])
    tok = Tokenizer.load(files["tok"])
    first = doc["first_merges"]
    assert len(first) == views.FIRST_MERGES
    assert [m["count"] for m in first] == tok.training["merge_counts"][:50]
    assert first[0]["count"] >= first[-1]["count"] > 0
    plain = serve.make_server(tokenizer=files["plain"], port=0)  # a tokenizer that recorded no counts
    try:
        assert {m["count"] for m in serve_api.answer(plain.held, "/api/bpe", "text=abc")["first_merges"]} == {None}
    finally:
        plain.server_close()


def test_explain_is_tk_explain_json(srv, files, capsys):
    text = "Once upon a time"
    doc = srv.ok("/api/explain", text=text, layer=1, head=1, top_k=7)
    expected = cli_json(capsys, "explain", "-m", str(files["run"]), text, "--layer", "1", "--head", "1",
                        "--top-k", "7", "--json")  # fmt: skip
    assert doc == expected
    # one query's rows: tk explain --query's document, every kept number the whole one's
    for query in (0, 2):
        one = srv.ok("/api/explain", text=text, layer=1, head=1, top_k=7, query=query)
        assert one == cli_json(capsys, "explain", "-m", str(files["run"]), text, "--layer", "1", "--head", "1",
                               "--top-k", "7", "--query", str(query), "--json")  # fmt: skip
        T = len(doc["tokens"])
        for whole, part in zip(doc["steps"], one["steps"], strict=True):
            per_token = len(whole["shape"]) == 2 and whole["shape"][0] == T and not whole["key"].endswith(("k", "v"))
            if per_token:
                assert part["value"] == [r if t == query else None for t, r in enumerate(whole["value"])]
            else:
                assert part["value"] == whole["value"], whole["key"]
        assert len(json.dumps(one)) < len(json.dumps(doc)) / 2
    assert "not a position" in srv.refused("/api/explain", text=text, query=9)
    assert "at most" in srv.refused("/api/explain", text=text, query=99)
    for name in ("chai", "one-layer"):
        assert srv.ok("/api/example", name=name) == cli_json(capsys, "explain", "--example", name, "--json")
    assert srv.ok("/api/example")["example"] == "attention-lookup"


def test_next_is_tk_predict_next_json(srv, files, capsys):
    for text in TEXTS[:2]:
        doc = srv.ok("/api/next", text=text, top_k=4)
        assert doc == cli_json(capsys, "predict-next", "-m", str(files["run"]), text, "--top-k", "4", "--json")
        assert doc["prompt_ids"] == srv.ok("/api/tokens", text=text)["ids"]


@pytest.mark.parametrize(
    "settings",
    [
        {"seed": 3},
        {"seed": 11, "temperature": 0.7, "top_k": 5},
        {"seed": 1, "top_p": 0.8},
        {"temperature": 0},
    ],
)
def test_generate_steps_give_tk_generate_s_text(srv, files, capsys, settings):
    prompt = "Once upon"
    doc = srv.ok("/api/generate", text=prompt, n=30, show=5, **settings)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    if "seed" not in settings:
        flags.append("--seed=0")  # the server's default seed
    code = main(["generate", "-m", str(files["run"]), prompt, "-n", "30", *flags])
    out, _ = capsys.readouterr()
    assert code == 0 and out == prompt + doc["text"] + "\n"
    assert doc["prompt_ids"] == srv.ok("/api/tokens", text=prompt)["ids"]
    for step in doc["steps"]:
        assert len(step["top"]) == 5
        p = [t["p"] for t in step["top"]]
        assert p == sorted(p, reverse=True) and sum(p) <= 1 + 1e-9
        chosen = [t for t in step["top"] if t["id"] == step["id"]]
        assert not chosen or chosen[0]["p"] == step["p"]
        assert step["p"] > 0
        if settings.get("temperature") == 0:
            assert step["p"] == 1.0 and step["top"][0]["id"] == step["id"]


def test_attention_is_the_forward_trace(srv, files):
    model, tok = load_model_and_tokenizer(files["run"])
    text = "Once upon a time there"
    ids = tok.encode(text)
    trace = {}
    model.forward(np.array([ids]), trace=trace)
    thumbs = srv.ok("/api/thumbnails", text=text)
    assert thumbs == json.loads(json.dumps(views.thumbnails_view(model, tok, text)))
    assert (thumbs["n_layers"], thumbs["n_heads"]) == (2, 2) and [t["id"] for t in thumbs["tokens"]] == ids
    # a text shorter than THUMBNAIL_CELLS: every thumbnail is its head's whole map, bit for bit
    assert thumbs["thumbnail_edges"] == list(range(len(ids) + 1))
    for layer, head in ((0, 0), (0, 1), (1, 0), (1, 1)):
        doc = srv.ok("/api/attention", text=text, layer=layer, head=head)
        assert doc == json.loads(json.dumps(views.attention_view(model, tok, text, layer=layer, head=head)))
        assert (doc["n_layers"], doc["n_heads"], doc["layer"], doc["head"]) == (2, 2, layer, head)
        weights = views.unpack_weights(doc["weights"])
        assert weights.dtype == np.float32 and doc["weights"]["triangle"]  # causal: the cells up to the diagonal
        np.testing.assert_array_equal(weights, trace[f"h.{layer}.attn.weights"][0, head])
        assert thumbs["thumbnails"][layer][head] == doc["weights"]
        np.testing.assert_allclose(weights.sum(-1), 1, rtol=1e-5)
        assert doc["tokens"] == thumbs["tokens"]
    assert srv.ok("/api/attention", text=text) == srv.ok("/api/attention", text=text, layer=0, head=0)
    assert "layer must be" in srv.refused("/api/attention", text=text, layer=2)
    assert srv.refused("/api/attention", text=text, head=-1).startswith("head ")
    assert "unknown parameter 'layer'" in srv.refused("/api/thumbnails", text=text, layer=0)
    long = srv.ok("/api/thumbnails", text="x" * 400)  # past the context: its last 32 tokens (tests/test_long_texts.py)
    ids = srv.ok("/api/tokens", text="x" * 400)["ids"]
    assert [t["id"] for t in long["tokens"]] == ids[-32:] and long["cut"] == len(ids) - 32 > 0


def random_weights(rng, n: int, m: int, causal: bool, dtype) -> np.ndarray:
    """Softmax rows of random scores, the keys after each query masked when `causal`."""
    scores = rng.normal(scale=rng.uniform(0.1, 30), size=(n, m))
    if causal:
        scores[np.triu(np.ones((n, m), bool), 1)] = -np.inf
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)).astype(dtype)


@pytest.mark.parametrize("seed", range(40))
def test_packed_weights_come_back_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 70))
    m = n if seed % 4 else int(rng.integers(1, 70))
    dtype = np.float64 if seed % 5 == 0 else np.float32
    w = random_weights(rng, n, m, causal=seed % 3 != 0, dtype=dtype)
    if seed % 7 == 0:  # a damaged model's numbers: NaN and infinities go as they are
        w.flat[rng.integers(0, w.size, 3)] = [np.nan, np.inf, -np.inf]
    packed = views.pack_weights(w)
    back = views.unpack_weights(json.loads(json.dumps(packed)))
    assert back.dtype == dtype and back.shape == (n, m)
    assert back.tobytes() == w.tobytes()  # every bit, NaN included
    assert packed["triangle"] == (n == m and not np.triu(w, 1).any())
    cells = n * (n + 1) // 2 if packed["triangle"] else n * m
    assert len(packed["base64"]) == 4 * -(-cells * w.itemsize // 3)  # base64 of the cells sent, none more


def test_attention_answers_are_the_models_weights_on_random_texts(files):
    # random texts of 1 to 120 tokens (the thumbnails pooled above 48), random heads: the decoded weights
    # are the trace's float32 numbers exactly, the thumbnails its pooled ones exactly
    tok = Tokenizer.load(files["tok"])
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, context_length=128, d_model=18, n_layers=2, n_heads=3), seed=5)
    rng = np.random.default_rng(0)
    alphabet = list("abcdefghij klmnop.,!?\n") + ["Ça", "日本", "😀", " the", " cat"]
    calls, pooled = [], set()
    forward = model.forward
    model.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    for _ in range(16):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(1, 160))))
        ids = tok.encode(text)[:120]
        text = tok.decode(ids)
        ids = tok.encode(text)
        layer, head = int(rng.integers(0, 2)), int(rng.integers(0, 3))
        trace = {}
        forward(np.array([ids]), trace=trace)
        calls.clear()
        doc = views.attention_view(model, tok, text, layer=layer, head=head)
        thumbs = views.thumbnails_view(model, tok, text)
        assert len(calls) == 1  # the thumbnails came from the head's forward pass
        assert views.unpack_weights(doc["weights"]).tobytes() == trace[f"h.{layer}.attn.weights"][0, head].tobytes()
        for i in range(2):
            got = np.stack([views.unpack_weights(t) for t in thumbs["thumbnails"][i]])
            assert got.tobytes() == views.pool(trace[f"h.{i}.attn.weights"][0]).tobytes()
        assert thumbs["thumbnail_edges"] == views.block_edges(len(ids)).tolist()
        pooled.add(len(ids) > views.THUMBNAIL_CELLS)
        if len(ids) <= views.THUMBNAIL_CELLS:
            assert thumbs["thumbnails"][layer][head] == doc["weights"]
    assert pooled == {False, True}
    # another text's thumbnails are that text's, from a forward pass of their own
    views.attention_view(model, tok, "Once upon a time")
    calls.clear()
    other = views.thumbnails_view(model, tok, "The cat sat")
    trace = {}
    forward(np.array([tok.encode("The cat sat")]), trace=trace)
    assert len(calls) == 1
    assert views.unpack_weights(other["thumbnails"][1][2]).tobytes() == trace["h.1.attn.weights"][0, 2].tobytes()


def pool_by_loops(w: np.ndarray, cells: int) -> np.ndarray:
    """views.pool written plainly: block i of n positions is [i * n // m, (i + 1) * n // m) for
    m = min(n, cells) blocks, and a cell is the mean of its block of rows x columns."""
    (tq, tk), mq, mk = w.shape, min(w.shape[0], cells), min(w.shape[1], cells)
    out = np.zeros((mq, mk))
    for i in range(mq):
        for j in range(mk):
            rows, cols = range(i * tq // mq, (i + 1) * tq // mq), range(j * tk // mk, (j + 1) * tk // mk)
            block = [w[q, k] for q in rows for k in cols]
            out[i, j] = sum(block) / len(block)
    return out


SHAPES = [(5, 5, 8), (8, 8, 8), (9, 9, 8), (50, 50, 8), (48, 48, 48), (49, 49, 48), (101, 37, 48), (3, 17, 4)]


@pytest.mark.parametrize("tq, tk, cells", SHAPES)
def test_pool_is_the_mean_of_each_block(tq, tk, cells):
    rng = np.random.default_rng(tq * 1000 + tk * 10 + cells)
    w = rng.random((tq, tk)).astype(np.float32)
    pooled = views.pool(w, cells)
    assert pooled.dtype == np.float32 and pooled.shape == (min(tq, cells), min(tk, cells))
    np.testing.assert_allclose(pooled, pool_by_loops(w, cells), rtol=1e-6)
    sizes = np.diff(views.block_edges(tq, cells))  # as even as possible
    assert sizes.sum() == tq and sizes.max() - sizes.min() <= (tq % min(tq, cells) != 0)
    if tq <= cells and tk <= cells:  # a map that fits is its own thumbnail
        assert np.array_equal(pooled, w)
    stacked = rng.random((2, 3, tq, tk))  # leading axes: each map pooled alone
    np.testing.assert_allclose(views.pool(stacked, cells)[1, 2], pool_by_loops(stacked[1, 2], cells), rtol=1e-12)


@pytest.mark.parametrize("t", [7, 48, 100, 131])
def test_pooled_causal_weights_keep_each_rows_mass(t):
    # rows of a full map sum to 1, so a pooled block row (a mean over its rows) times its key blocks'
    # widths sums to 1, and a block wholly after its queries is 0
    rng = np.random.default_rng(t)
    scores = np.where(np.tril(np.ones((t, t), bool)), rng.normal(size=(3, t, t)), -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    pooled, edges = views.pool(w), views.block_edges(t)
    np.testing.assert_allclose(pooled @ np.diff(edges), 1, rtol=1e-12)
    for i in range(len(edges) - 1):
        for j in range(len(edges) - 1):
            if edges[j] >= edges[i + 1]:  # every key of block j comes after every query of block i
                assert (pooled[:, i, j] == 0).all()


def test_attention_of_a_text_too_long_for_every_heads_whole_weights(files, tmp_path):
    # SmolLM2-135M's 30 layers x 9 heads (narrow): all their T x T weights passed the numbers bound at
    # 62 tokens; one head whole and every head's thumbnail fit 653
    cfg = GPTConfig(vocab_size=400, context_length=1024, d_model=36, n_layers=30, n_heads=9)
    assert views.attention_tokens(cfg) == 653 and math.isqrt(views.ATTENTION_NUMBERS // 270) == 62
    gpt2 = GPTConfig(vocab_size=50257, context_length=1024, d_model=768, n_layers=12, n_heads=12)
    assert views.attention_tokens(gpt2) == 846 and math.isqrt(views.ATTENTION_NUMBERS // 144) == 85
    GPT(cfg).save(tmp_path / "wide.safetensors")
    running = Running(serve.make_server(tmp_path / "wide.safetensors", tokenizer=files["tok"], port=0))
    try:
        model, tok = running.server.held.need_model().model, Tokenizer.load(files["tok"])
        assert running.ok("/api/info")["limits"]["attention_tokens"] == 653
        text = "Once upon a time, there was a little cat. " * 40
        ids = tok.encode(text)
        assert 62 < len(ids) <= 653, len(ids)
        doc = running.ok("/api/attention", text=text, layer=29, head=8)
        thumbs = running.ok("/api/thumbnails", text=text)
        trace = {}
        model.forward(np.array([ids]), trace=trace)
        np.testing.assert_array_equal(views.unpack_weights(doc["weights"]), trace["h.29.attn.weights"][0, 8])
        thumbnails = np.array([[views.unpack_weights(t) for t in layer] for layer in thumbs["thumbnails"]])
        edges = thumbs["thumbnail_edges"]
        assert thumbnails.shape == (30, 9, 48, 48) and edges == views.block_edges(len(ids)).tolist()
        for layer in (0, 17, 29):
            np.testing.assert_array_equal(thumbnails[layer], views.pool(trace[f"h.{layer}.attn.weights"][0]))
        np.testing.assert_allclose(thumbnails @ np.diff(edges), 1, rtol=1e-5)
        longer = text * 2
        for path in ("/api/attention", "/api/thumbnails"):
            error = running.refused(path, text=longer)
            assert f"{len(tok.encode(longer)):,} tokens; the model reads its last 1,024, more than the 653" in error
    finally:
        running.stop()


def test_training_is_the_log(srv, files):
    doc = srv.ok("/api/training")
    records = trainlog.read_log(files["run"] / "log.jsonl")
    steps = [r for r in records if r["type"] == "step"]
    assert [p["step"] for p in doc["train"]] == [r["step"] for r in steps]
    assert [p["loss"] for p in doc["train"]] == [r["loss"] for r in steps]
    assert doc["train"][3]["tokens_per_s"] == pytest.approx(8 * 32 / steps[3]["dt"])
    evals = [r for r in records if r["type"] == "eval"]
    assert doc["val"] == [{k: r[k] for k in ("step", "val_loss", "val_bits_per_byte")} for r in evals]
    meta = checkpoint.load_model(files["run"]).metadata
    assert doc["config"] == meta["provenance"]["train_config"]
    assert doc["unigram_baseline"] == pytest.approx(meta["provenance"]["unigram_baseline"])
    assert (doc["last_step"], doc["status"], doc["finished"], doc["decimated"]) == (20, "done", True, False)


def test_model_blocks_add_up_to_the_parameters(srv, files):
    doc = srv.ok("/api/model")
    model, _ = load_model_and_tokenizer(files["run"])
    assert doc["parameters"] == sum(p.size for p in model.params.values())
    assert doc["config"] == model.config.to_dict()
    tensors = {name: shape for b in doc["blocks"] for name, shape in b["tensors"].items()}
    assert tensors == {name: list(p.shape) for name, p in model.params.items()}
    names = [b["name"] for b in doc["blocks"]]
    assert names[:3] == ["wte", "wpe", "h.0.ln_1"] and names[-2:] == ["ln_f", "head"]
    assert {b["view"] for b in doc["blocks"]} <= set(views.VIEWS)
    attn = next(b for b in doc["blocks"] if b["name"] == "h.1.attn.c_attn")
    assert (attn["shape"], attn["heads"], attn["head_dim"], attn["layer"]) == ([32, 96], 2, 16, 1)


@pytest.mark.parametrize("tied", [True, False])
def test_model_blocks_of_a_llama_family_model_say_its_pieces(tied):
    cfg = llama_config(vocab_size=40, context_length=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                       tie_embeddings=tied)  # fmt: skip
    model = GPT(cfg)
    doc = views.model_view(cfg, model.params)
    tensors = {name: shape for b in doc["blocks"] for name, shape in b["tensors"].items()}
    assert tensors == {name: list(p.shape) for name, p in model.params.items()}  # every tensor once
    assert doc["parameters"] == sum(p.size for p in model.params.values())
    by_name = {b["name"]: b for b in doc["blocks"]}
    assert "wpe" not in by_name and by_name["rope"]["parameters"] == 0 and "rotary" in by_name["rope"]["what"]
    assert "RMSNorm" in by_name["h.0.ln_1"]["what"] and "RMSNorm" in by_name["ln_f"]["what"]
    assert "K and V for 2 (each shared by 2 query heads)" in by_name["h.1.attn.c_attn"]["what"]
    assert by_name["h.1.attn.c_attn"]["kv_heads"] == 2 and "SiLU(gate) * up" in by_name["h.0.mlp.c_fc"]["what"]
    assert doc["blocks"][-1]["name"] == ("head" if tied else "lm_head")
    assert all(b["what"] != "other" for b in doc["blocks"])


def test_info_says_what_is_served(srv, files):
    doc = srv.ok("/api/info")
    assert doc["tokenizer"]["vocab_size"] == 400 and doc["tokenizer"]["special_tokens"] == {EOT: 399}
    assert doc["compare"]["name"] == str(files["other"]) and doc["compare"]["pattern"] == "gpt4"
    assert doc["model"]["parameters"] == srv.ok("/api/model")["parameters"]
    assert doc["run"] == str(files["run"]) and doc["views"] == list(views.VIEWS)
    assert {e["name"] for e in doc["examples"]} == {"attention-lookup", "sitting", "chai", "one-layer"}
    assert doc["limits"]["text_chars"] == 20_000 and doc["limits"]["context_length"] == 32


# ----------------------------------------------------------------------------- bounds and bad input


@pytest.mark.parametrize(
    ("path", "params", "fragment"),
    [
        ("/api/tokens", {}, "give the text"),
        ("/api/tokens", {"text": "x" * 20_001}, "at most 20,000"),
        ("/api/tokens", {"text": "x", "which": "other"}, "which must be one of"),
        ("/api/tokens", {"text": "x", "specials": "maybe"}, "specials must be one of"),
        ("/api/tokens", {"text": "x", "colour": "red"}, "unknown parameter 'colour'"),
        ("/api/next", {"text": "x", "top_k": 0}, "top_k must be at least 1"),
        ("/api/next", {"text": "x", "top_k": 101}, "top_k must be at most 100"),
        ("/api/next", {"text": "x", "top_k": "1e3"}, "whole number"),
        ("/api/explain", {"text": "x", "layer": 2}, "layer must be at most 1"),
        ("/api/explain", {"text": "x", "head": -1}, "head must not be negative"),
        ("/api/explain", {"text": ""}, "gives no tokens"),
        ("/api/generate", {"text": "x", "n": 201}, "n must be at most 200"),
        ("/api/generate", {"text": "x", "temperature": 11}, "temperature must be at most 10"),
        ("/api/generate", {"text": "x", "temperature": "nan"}, "must be a number"),
        ("/api/generate", {"text": "x", "temperature": "inf"}, "must be a number"),
        ("/api/generate", {"text": "x", "top_p": 0}, "top_p must be positive"),
        ("/api/generate", {"text": "x", "top_p": 1.5}, "top_p must be at most 1"),
        ("/api/generate", {"text": "x", "seed": 2**32}, "seed must be at most"),
        ("/api/generate", {"text": "x", "seed": -1}, "seed must not be negative"),
        ("/api/generate", {"text": "x", "show": 0}, "show must be at least 1"),
        ("/api/example", {"name": "nope"}, "name must be one of"),
        ("/api/info", {"x": 1}, "takes no parameters"),
        ("/api/frobnicate", {}, "unknown view 'frobnicate'"),
    ],
)
def test_bad_requests_are_one_line_400s(srv, path, params, fragment):
    assert fragment in srv.refused(path, **params)


def test_more_bad_queries(srv):
    status, _, body = srv.request("/api/tokens?text=a&text=b")
    assert status == 400 and "given twice" in json.loads(body)["error"]
    status, _, body = srv.request("/api/tokens?text=%ff%fe")
    assert status == 400 and "UTF-8" in json.loads(body)["error"]
    status, _, body = srv.request("/api/tokens?" + "&".join(f"k{i}=1" for i in range(40)))
    assert status == 400 and "parameters" in json.loads(body)["error"]


def test_a_view_of_what_was_not_given_is_404(files):
    bare = Running(serve.make_server(port=0))
    try:
        assert "no tokenizer was given" in bare.refused("/api/tokens", 404, text="x")
        assert "no model was given" in bare.refused("/api/next", 404, text="x")
        assert "no run directory" in bare.refused("/api/training", 404)
        assert "-c TOKENIZER" in bare.refused("/api/compare", 404, text="x")
        assert bare.ok("/api/example", name="sitting")["kind"] == "example"
        info = bare.ok("/api/info")
        assert info["tokenizer"] is info["model"] is info["run"] is None
    finally:
        bare.stop()


def test_an_unexpected_failure_is_a_500_line_and_the_server_goes_on(srv, monkeypatch, capsys):
    def broken(held, q):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setitem(serve_api.ENDPOINTS, "/api/model", (broken, ()))
    status, doc = srv.get("/api/model")
    assert status == 500 and doc == {"error": "internal error in /api/model: RuntimeError: boom second line"}
    monkeypatch.undo()
    assert srv.ok("/api/model")["parameters"] > 0
    assert "Traceback" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- nothing but the page


TRAVERSALS = [
    "/../pyproject.toml",
    "/%2e%2e/pyproject.toml",
    "/%2e%2e%2fpyproject.toml",
    "/..%2f..%2fpyproject.toml",
    "/api/../../etc/passwd",
    "/api/..%2f..%2fetc%2fpasswd",
    "//etc/passwd",
    "/index.html/../../../pyproject.toml",
    "/index.html%00.txt",
    "/.git/config",
    "/cli/page/index.html",
    "/serve.py",
    "/page/index.html",
    "http://127.0.0.1/../pyproject.toml",
    "file:///etc/passwd",
    "/%5c..%5cpyproject.toml",
]


@pytest.mark.parametrize("target", TRAVERSALS)
def test_paths_outside_the_page_are_404_and_never_files(srv, target):
    status, headers, body = srv.request(target)
    assert status == 404, (target, body)
    assert b"[project]" not in body and b"root:" not in body and b"import" not in body
    assert json.loads(body) == {"error": "not found"}


def test_the_page_is_served_with_its_type_and_policy(srv):
    status, headers, body = srv.request("/?view=attention&text=Once")
    index = (REPO / "cli" / "page" / "index.html").read_bytes()
    assert status == 200 and body == index
    assert headers["Content-Type"] == "text/html; charset=utf-8" and headers["Cache-Control"] == "no-cache"
    assert headers["Content-Security-Policy"].startswith("default-src 'self'")
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert srv.request("/index.html")[2] == index
    status, headers, body = srv.request("/", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) == len(index)
    for name, (_, kind) in srv.server.files.items():  # every file of cli/page, by its exact name
        assert srv.request(name)[0] == 200 and kind


def test_page_files_are_regular_named_files_only(tmp_path):
    (tmp_path / "index.html").write_text("<p>hi</p>", encoding="utf-8")
    (tmp_path / "app.js").write_text("1", encoding="utf-8")
    (tmp_path / "icons").mkdir()
    (tmp_path / "icons" / "a.svg").write_text("<svg/>", encoding="utf-8")
    (tmp_path / ".secret.js").write_text("x", encoding="utf-8")
    (tmp_path / "notes.md").write_text("x", encoding="utf-8")
    (tmp_path / "link.js").symlink_to(REPO / "pyproject.toml")
    (tmp_path / "linked").symlink_to(REPO, target_is_directory=True)
    (tmp_path / "has space.js").write_text("x", encoding="utf-8")
    files = serve.page_files(tmp_path)
    assert sorted(files) == ["/", "/app.js", "/icons/a.svg", "/index.html"]
    assert files["/app.js"][1] == "text/javascript; charset=utf-8" and files["/icons/a.svg"][1] == "image/svg+xml"


@pytest.mark.parametrize(
    ("host", "status"),
    [("evil.example:{port}", 403), ("127.0.0.1", 403), ("localhost:{port}", 200), (None, 403),
     ("127.0.0.1:{port}@evil.example", 403), ("[::1]:{port}", 200)],
)  # fmt: skip
def test_only_requests_for_this_server_are_answered(srv, host, status):
    got, _, body = srv.request("/api/info", host=None if host is None else host.format(port=srv.port))
    assert got == status
    if status == 403:
        assert "Host header" in json.loads(body)["error"] and b"vocab_size" not in body


def test_hosts_allowed_on_a_non_loopback_address():
    assert serve.host_allowed("192.168.1.5:8765", "0.0.0.0", 8765)
    assert not serve.host_allowed("192.168.1.5:9999", "0.0.0.0", 8765)
    assert not serve.host_allowed("rebound.example:8765", "0.0.0.0", 8765)
    assert serve.is_loopback("127.0.0.2") and serve.is_loopback("::1") and not serve.is_loopback("0.0.0.0")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "FROB"])
def test_only_get_and_head(srv, method):
    status, headers, body = srv.request("/api/info", method=method, extra="Content-Length: 5\r\n")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert "not allowed" in json.loads(body)["error"]


def test_a_long_request_line_is_414_json(srv):
    status, _, body = srv.request("/api/tokens?text=" + "a" * 70_000)
    assert status == 414 and list(json.loads(body)) == ["error"]


# ----------------------------------------------------------------------------- following a run


def test_a_model_replaced_on_disk_is_picked_up(files, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(files["run"], run)
    running = Running(serve.make_server(run, port=0))
    try:
        before = running.ok("/api/next", text="Once upon")
        loaded = checkpoint.load_model(run)
        params = {k: v * 1.5 for k, v in loaded.model.params.items()}
        meta = loaded.metadata
        checkpoint.save_model(
            run / "model.safetensors",
            params,
            loaded.tokenizer,
            config=loaded.model.config.to_dict(),
            step=meta["step"],
            val_loss=None,
            best_val_loss=None,
            provenance=meta["provenance"],
        )
        after = running.ok("/api/next", text="Once upon")
        assert after != before
        assert after == cli_json(capsys, "predict-next", "-m", str(run), "Once upon", "--json")
        assert running.server.held.live.loads == 2
        checkpoint.write_bytes(run / "model.safetensors", b"not a model")  # a file that does not load
        assert running.ok("/api/next", text="Once upon") == after  # the previous model stays
        assert running.server.held.live.error is not None
    finally:
        running.stop()


def test_the_training_log_is_read_incrementally_and_decimated(tmp_path):
    path = tmp_path / "log.jsonl"
    config = {"batch_size": 4, "context_length": 8, "steps": 5000}
    lines = [{"type": "session", "step": 0, "train_config": config, "unigram_baseline": 3.5}]
    lines += [{"type": "step", "step": s, "loss": 5 - s / 2000, "lr": 1e-3, "grad_norm": 1.0, "dt": 0.01}
              for s in range(1, 3001)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + "not json\n", encoding="utf-8")
    log = live.TrainingLog(path)
    doc = views.training_view(tmp_path, name="r", log=log)
    assert doc["decimated"] and len(doc["train"]) <= views.TRAIN_POINTS and doc["train"][-1]["step"] == 3000
    assert doc["damaged_lines"] == 1 and doc["status"] == "training" and not doc["finished"]
    assert doc["unigram_baseline"] == 3.5 and doc["train"][0]["tokens_per_s"] == pytest.approx(3200)
    with open(path, "a", encoding="utf-8") as f:  # training goes on: only the new lines are read
        more = [{"type": "step", "step": s, "loss": 1.0, "dt": 0.01} for s in range(3001, 5001)]
        f.write("".join(json.dumps(r) + "\n" for r in more))
        f.write('{"type": "eval", "step": 5000, "val_')  # being written
    offset = log._offset
    doc = views.training_view(tmp_path, name="r", log=log)
    assert log._offset > offset and doc["last_step"] == 5000 and doc["status"] == "done" and doc["val"] == []
    with open(path, "a", encoding="utf-8") as f:
        f.write('loss": 2.5}\n{"type": "interrupt", "step": 5000}\n')
    doc = views.training_view(tmp_path, name="r", log=log)
    assert doc["val"] == [{"step": 5000, "val_loss": 2.5, "val_bits_per_byte": None}] and doc["status"] == "interrupted"
    trainlog.truncate_log(path, 10)  # a resume cuts the log back: a new file, read from its start
    doc = views.training_view(tmp_path, name="r", log=log)
    assert doc["last_step"] == 10 and not doc["decimated"] and doc["damaged_lines"] == 0
    path.unlink()
    assert views.training_view(tmp_path, name="r", log=log)["status"] == "waiting"


# ----------------------------------------------------------------------------- tk serve, the process


def _start(args: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkit.cli.main", "serve", *args, "--port", "0", "--no-browser", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    first = proc.stdout.readline()
    assert first.startswith("serving http://127.0.0.1:") and first.endswith("/\n"), (first, proc.stderr.read())
    return proc, first.split()[1]


def _children(pid: int) -> list[str]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += (task / "children").read_text().split()
        except FileNotFoundError:  # a thread (a request's) that ended since the listing: it has none
            pass
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts children through /proc")
@pytest.mark.parametrize(("signum", "code", "line"), [(signal.SIGINT, 130, "interrupted"),
                                                      (signal.SIGTERM, 143, "terminated (SIGTERM)")])  # fmt: skip
def test_tk_serve_prints_its_address_first_and_stops_in_one_line(files, signum, code, line):
    proc, url = _start([str(files["run"])])
    try:
        port = int(url.rsplit(":", 1)[1].strip("/"))
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(f"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            assert s.recv(100).startswith(b"HTTP/1.1 200")
        assert _children(proc.pid) == []
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == code and out == "" and err.splitlines() == [line], err


def test_a_non_loopback_host_warns(files):
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkit.cli.main", "serve", "--host", "0.0.0.0", "--port", "0", "--no-browser"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        first = proc.stdout.readline()
        warning = proc.stderr.readline()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert first.startswith("serving http://0.0.0.0:")
    assert warning.startswith("warning: listening on 0.0.0.0") and "no login" in warning


def test_a_port_in_use_is_one_line(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--port", str(port), "--no-browser"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and f"port {port}" in err and "in use" in err and "--port" in err


def test_startup_errors_are_one_line(files, tmp_path, capsys):
    for args, fragment in [
        ([str(tmp_path / "nothing")], "no such run directory or model file"),
        ([str(tmp_path)], "is not a run directory"),
        ([str(files["tok"])], "is a tokenizer file, not a model"),
        (["-t", str(tmp_path / "none.safetensors")], "not found"),
        (["--host", "203.0.113.77", "--port", "0"], "cannot listen on 203.0.113.77"),
    ]:
        code = main(["serve", *args, "--no-browser"])
        _, err = capsys.readouterr()
        assert code == 1 and err.count("\n") == 1 and fragment in err and "Traceback" not in err, (args, err)


# ----------------------------------------------------------------------------- speed and docs


def test_explain_json_arrays_equal_the_trace_with_masked_scores_as_null():
    # the fast json_array (tolist, an object array only for non-finite cells) against the values;
    # its speed is bench/page.py's to measure, not a test's
    cfg = GPTConfig(vocab_size=50, context_length=16, d_model=32, n_layers=2, n_heads=4)
    model = GPT(cfg)
    ids = np.random.default_rng(0).integers(0, 50, 12)
    expl = explain_model(model, ids, [str(i) for i in ids], layer=1, head=3)
    doc = json.loads(json.dumps(expl.to_dict()))
    for step, got in zip(expl.steps, doc["steps"], strict=True):
        want = np.asarray(step.value, dtype=np.float64)
        arr = np.array(got["value"], dtype=object)
        finite = np.isfinite(want)
        assert (arr[~finite] == None).all()  # noqa: E711 -- JSON null for -inf
        assert np.array_equal(arr[finite].astype(np.float64), want[finite]), step.key
    assert any((np.array(s["value"], dtype=object) == None).any() for s in doc["steps"])  # noqa: E711
    big = GPTConfig(vocab_size=50257, context_length=1024, d_model=768, n_layers=12, n_heads=12)
    assert views.explain_tokens(big) >= 64 and views.attention_tokens(big) <= 1024


def test_docstring_examples():
    from tokenkit.bpe import replay

    for module in (views, token_views, forward_views, replay, serve, live, serve_api):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_serve_md_lists_every_endpoint():
    doc = (REPO / "docs" / "serve.md").read_text(encoding="utf-8")
    for path in serve_api.ENDPOINTS:
        assert f"GET {path}" in doc, path
    assert "tk serve" in (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    assert os.path.exists(REPO / "cli" / "page" / "index.html")
