"""The attention view's worked arithmetic for a Llama-family model (rotary positions, RMSNorm,
SwiGLU, 4 query heads sharing 2 K/V heads), in a real browser: it says RMSNorm and shows the rms
and the scaled row (no mean or std), q and k before and after the rotation with their angles,
SwiGLU's gate, SiLU(gate), up and their product, and which K/V head the query head shares; every
number's data-key/data-value is `tk explain --json`'s. A tiny run is trained here (a few seconds).
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from browser import open_page, shot
from test_page import attrs, same, step_values
from test_serve import REPO, Running, cli_json

from tokenkit.bpe import Tokenizer
from tokenkit.cli import serve
from tokenkit.cli.main import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    corpus = d / "corpus.txt"
    corpus.write_bytes((REPO / "corpora" / "tiny_tales.txt").read_bytes()[:20_000])
    Tokenizer.train([corpus], vocab_size=300, workers=1, quiet=True).save(d / "tok.safetensors")
    flags = ["--arch", "llama", "--n-layers", "2", "--n-heads", "4", "--n-kv-heads", "2", "--d-model", "32"]
    flags += ["--context-length", "32", "--batch-size", "4", "--steps", "20", "--eval-interval", "20"]
    flags += ["--eval-batches", "1", "--quiet"]
    assert main(["train-model", str(corpus), "-t", str(d / "tok.safetensors"), "-o", str(d / "run"), *flags]) == 0
    return d / "run"


@pytest.fixture(scope="module")
def srv(run):
    with Running(serve.make_server(run, port=0)) as running:
        yield running


def test_llama_arithmetic_shows_rope_rmsnorm_swiglu_and_the_shared_kv_head(browser, srv, run, capsys):
    text, layer, head, query = "Once upon a time", 1, 3, 2
    address = urlencode({"view": "attention", "text": text, "layer": layer, "head": head, "query": query})
    p = open_page(browser, srv.base + "?" + address)
    try:
        p.wait_for_selector("#arith [data-key]", timeout=10_000)
        argv = ["explain", "-m", str(run), text, "--layer", str(layer), "--head", str(head), "--query", str(query)]
        values = step_values(cli_json(capsys, *argv, "--json"))
        p.eval_on_selector_all("#arith .vec > button.more", "buttons => buttons.forEach(b => b.click())")
        h = f"h.{layer}."
        whole = (h + "attn.k", h + "attn.v", h + "attn.k_pre", "rope_angle")  # every key's row
        checked = set()
        for key, value, row, col in attrs(p, "#arith [data-key]", "key", "value", "row", "col"):
            want = values[key] if row is None else values[key][int(row)]  # a gain has no rows
            if col is None:
                assert json.loads(value) == want, key
            else:
                assert same(value, want[int(col)]), (key, row, col)
            assert row is None or int(row) == query or key in whole, key
            checked.add(key)
        new = ["ln_1.rms", "ln_1.scaled", "ln_1.gain", "attn.q_pre", "attn.k_pre", "attn.q", "attn.k", "ln_2.rms"]
        new += ["ln_2.scaled", "mlp.gate", "mlp.silu_gate", "mlp.up", "mlp.act"]
        assert {h + k for k in new} | {"rope_angle"} <= checked
        rows = {r for k, r in attrs(p, "#arith [data-key]", "key", "row") if k == h + "attn.k_pre"}
        assert rows == {str(j) for j in range(query + 1)}  # k before the rotation for each key
        arith = p.inner_text("#arith")
        assert "RMSNorm" in arith and "LayerNorm" not in arith and "mean, std" not in arith
        assert "SiLU(gate) × up" in arith and "rotated (RoPE)" in arith
        assert p.inner_text("#arith .gqa").startswith("head 3 reads K/V head 1, shared with heads 2 and 3")
        assert p.tk_errors == []
        shot(p, "attention-llama")
    finally:
        p.context.close()


def test_a_padded_vocabularys_ids_are_shown_and_not_offered_as_text(browser, run, tmp_path):
    """A model whose vocabulary is padded beyond its tokenizer (Qwen2's kind), its padding made the
    most likely: the next-token bars show `<pad id N>` as the server sends it, and only real tokens
    are buttons that add their text."""
    import numpy as np

    from tokenkit.pipeline import checkpoint
    from tokenkit.transformer.config import GPTConfig

    loaded = checkpoint.load_model(run)
    tok, n = loaded.tokenizer, loaded.tokenizer.vocab_size
    logits = loaded.model.forward(np.array([tok.encode("Once upon a time")]))[0, -1]
    params = {}
    for name, value in loaded.model.params.items():  # 6 more rows for every (V, C) tensor, all alike
        if value.shape[0] == n:
            value = np.concatenate([value, np.repeat(3 * value[int(np.argmax(logits))][None], 6, axis=0)])
        params[name] = value
    config = GPTConfig.from_dict({**loaded.model.config.to_dict(), "vocab_size": n + 6})
    checkpoint.save_model(tmp_path / "padded.safetensors", params, tok, config=config.to_dict(), step=0,
                          val_loss=None, best_val_loss=None, provenance={})  # fmt: skip
    running = Running(serve.make_server(tmp_path / "padded.safetensors", port=0))
    address = urlencode({"view": "next", "text": "Once upon a time"})
    p = open_page(browser, f"http://127.0.0.1:{running.port}/?{address}")
    try:
        p.wait_for_selector("#next-bars .bar", timeout=10_000)
        rows = p.eval_on_selector_all("#next-bars .bar", "bars => bars.map(b => [+b.dataset.id, b.tagName])")
        assert any(i >= n for i, _ in rows) and any(i < n for i, _ in rows)  # the premise: both are shown
        assert all((tag == "BUTTON") == (i < n) for i, tag in rows), rows
        assert f"<pad id {n}>" in p.inner_text("#next-bars")
        assert f"its {n + 6} ids ({n} tokens and 6 padding)" in p.inner_text("#next-card")
        assert p.tk_errors == []
        shot(p, "next-padded")
    finally:
        p.context.close()
        running.stop()


def test_the_mlps_width_is_the_models_own(browser, run, tmp_path):
    """A GPT-2-style model with --mlp-hidden 48 (not 4 x d_model = 128): the arithmetic titles c_fc's
    pre-activation with its real width, read from the explain step's shape, and its head size so too."""
    from tokenkit.pipeline import checkpoint
    from tokenkit.transformer import GPT, GPTConfig

    tok = checkpoint.load_model(run).tokenizer
    config = GPTConfig(vocab_size=tok.vocab_size, context_length=32, d_model=32, n_layers=1, n_heads=2, mlp_hidden=48)
    path = tmp_path / "wide.safetensors"
    checkpoint.save_model(path, GPT(config).params, tok, config=config.to_dict(), step=0, val_loss=None,
                          best_val_loss=None, provenance={})  # fmt: skip
    running = Running(serve.make_server(path, port=0))
    address = urlencode({"view": "attention", "text": "Once upon a time", "query": 1})
    p = open_page(browser, f"http://127.0.0.1:{running.port}/?{address}")
    try:
        p.wait_for_selector("#arith [data-key]", timeout=10_000)
        arith = p.inner_text("#arith")
        assert "pre-activation (48)" in arith and "(128)" not in arith
        assert "√16" in arith  # q·k / √d_head
        assert p.tk_errors == []
    finally:
        p.context.close()
        running.stop()
