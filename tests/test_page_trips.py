"""What a learner tripped on when trying the page, each checked as a class in a real browser (the
system's Chromium, through Playwright):

- the BPE replay's first-merges table shows every merge as its tokens' text (bpe/show.py's
  `token_str`, the one spelling), never a raw id, whether or not its pieces are in the typed text;
- with `tk serve -c OTHER`, either tokenizer can be replayed, and the address keeps the choice;
- the Model view at 1280 px keeps each layer's blocks on one row, no label wrapped or clipped, and
  every MLP block opens the lens view (its attribution bars), for a small run and for models with
  GPT-2's and Llama's names and parameter counts.

One server (tests/test_serve.py's small run, with a second tokenizer to compare) and one browser
serve the module; without Playwright or a Chromium it skips (tests/browser.py).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from browser import open_page, shot, wait_drawn
from test_serve import Running, train_files

from tokenkit.bpe import Tokenizer
from tokenkit.bpe.show import token_str
from tokenkit.cli import serve
from tokenkit.transformer import GPT, GPTConfig
from tokenkit.transformer.config import llama_config

TEXT = "Once upon a time, there was a little cat."
FEW = "zq"  # two bytes no merge of a tales tokenizer touches: every first merge's pieces are absent


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return train_files(tmp_path_factory.mktemp("page_trips"))


@pytest.fixture(scope="module")
def srv(files):
    running = Running(serve.make_server(files["run"], compare=files["other"], port=0))
    running.base = f"http://127.0.0.1:{running.port}/"
    yield running
    running.stop()


@pytest.fixture
def opened():
    """Pages the test opens (`pages.append`), closed after it, with no console error logged."""
    pages = []
    yield pages
    for p in pages:
        assert p.tk_errors == [], "the page logged console errors"
        p.context.close()


def visit(browser, base: str, opened: list, **params):
    p = open_page(browser, base + ("?" + urlencode(params) if params else ""))
    p.set_default_timeout(10_000)
    opened.append(p)
    return p


def query_of(p) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(p.url).query, keep_blank_values=True).items()}


def shown(p, text: str) -> str:
    """`text` as the page writes a token (its own `TK.visible`: whitespace marks only)."""
    return p.evaluate("(t) => t === '' ? '∅' : TK.visible(t)", text)


def tokenizers(files) -> dict[str, Tokenizer]:
    """The replay's choices (`which`): the run's tokenizer and -c's."""
    return {"": Tokenizer.load(files["tok"]), "compare": Tokenizer.load(files["other"])}


# ----------------------------------------------------------------------------- the first merges


@pytest.mark.parametrize("which", ["", "compare"])
@pytest.mark.parametrize("text", [FEW, TEXT])
def test_every_first_merge_reads_as_its_tokens_text(browser, srv, files, opened, which, text):
    tok = tokenizers(files)[which]
    p = visit(browser, srv.base, opened, view="bpe", text=text, **({"which": which} if which else {}))
    rows = p.eval_on_selector_all(
        "#bpe-first-merges tbody tr",
        "rows => rows.map(r => [...r.querySelectorAll('td')].map(td => td.textContent))",
    )
    merges = tok.merges[: len(rows)]
    assert len(rows) == min(50, len(tok.merges)) > 0
    in_text = set(tok.encode(text)) | set(text.encode())
    absent = [m for m in merges if not set(m) <= in_text]
    assert text != FEW or len(absent) >= len(merges) - 2, "FEW should leave the first merges' pieces out"
    for rank, ((a, b), (shown_rank, pair, new_id, made, _count)) in enumerate(zip(merges, rows, strict=True)):
        spell = [shown(p, token_str(tok.decode_bytes([i]))) for i in (a, b, tok.merged_id(rank))]
        assert (int(shown_rank), int(new_id)) == (rank, tok.merged_id(rank))
        assert pair == f"{spell[0]} + {spell[1]}", rank
        assert made == spell[2], rank
    assert p.query_selector_all("#bpe-first-merges .tok.muted") == []  # no "#id" stand-in left
    shot(p, f"trips-bpe-first-merges-{which or 'main'}-{len(text)}")


# ----------------------------------------------------------------------------- replaying either tokenizer


def replay_end(p) -> tuple[list[int], int]:
    ids = [int(i) for i in p.eval_on_selector_all("#bpe-seq .chip", "cs => cs.map(c => c.dataset.id)")]
    return ids, int(p.get_attribute("#bpe-seq", "data-step"))


@pytest.mark.parametrize("which", ["", "compare"])
def test_either_tokenizer_replays_from_its_address(browser, srv, files, opened, which):
    tok = tokenizers(files)[which]
    replay = tok.replay(TEXT)
    assert len(replay.steps) > 3
    p = visit(browser, srv.base, opened, view="bpe", text=TEXT, **({"which": which} if which else {}))
    assert p.input_value("#bpe-which") == which
    assert replay_end(p) == (replay.ids, len(replay.steps))  # the last step: that tokenizer's tokens
    # a deep link to a step keeps the choice: the caption names that tokenizer's merge
    step = 3
    address = {"view": "bpe", "text": TEXT, "step": step, **({"which": which} if which else {})}
    p.goto(srv.base + "?" + urlencode(address))
    wait_drawn(p)
    assert p.input_value("#bpe-which") == which
    caption = p.query_selector("#bpe-step")
    assert int(caption.get_attribute("data-rank")) == replay.steps[step - 1].rank
    assert int(caption.get_attribute("data-new-id")) == replay.steps[step - 1].new_id


def test_the_switch_changes_the_replay_and_the_address(browser, srv, files, opened):
    toks = tokenizers(files)
    p = visit(browser, srv.base, opened, view="bpe", text=TEXT, step=2)
    for which in ["compare", ""]:
        p.select_option("#bpe-which", which)
        drawn = "(w) => document.body.dataset.ready === '1' && document.querySelector('#bpe-which').value === w"
        p.wait_for_function(drawn, arg=which)
        replay = toks[which].replay(TEXT)
        assert query_of(p).get("which", "") == which
        assert "step" not in query_of(p)  # the other tokenizer's steps: the replay starts again at the end
        assert replay_end(p) == (replay.ids, len(replay.steps))
        p.reload()  # the address alone brings it back
        wait_drawn(p)
        assert p.input_value("#bpe-which") == which and replay_end(p) == (replay.ids, len(replay.steps))


def test_without_a_second_tokenizer_there_is_no_switch(browser, files, opened):
    running = Running(serve.make_server(files["run"], port=0))
    try:
        base = f"http://127.0.0.1:{running.port}/"
        p = visit(browser, base, opened, view="bpe", text=TEXT, which="compare")  # an old link: the main one
        assert p.query_selector("#bpe-which") is None
        replay = Tokenizer.load(files["tok"]).replay(TEXT)
        assert replay_end(p) == (replay.ids, len(replay.steps))
    finally:
        running.stop()


# ----------------------------------------------------------------------------- the model view

# each block's box and its labels' lines, measured in the page (a label of one line is one client rect)
MEASURE = """() => [...document.querySelectorAll('.layer')].map(layer => {
  const box = layer.getBoundingClientRect();
  const blocks = [...layer.querySelectorAll('.block')];
  return {layer: layer.dataset.layer, right: box.right, left: box.left, blocks: blocks.map(b => {
    const r = b.getBoundingClientRect();
    const lines = (sel) => { const e = b.querySelector(sel); if (!e) return 1; const range = document.createRange();
      range.selectNodeContents(e); return new Set([...range.getClientRects()].map(c => Math.round(c.top))).size; };
    const fits = (sel) => { const e = b.querySelector(sel);
      return !e || e.getBoundingClientRect().right <= r.right + 0.5; };
    return {name: b.dataset.name, top: Math.round(r.top), left: r.left, right: r.right,
      lines: {name: lines('.block-name'), go: lines('.block-go')}, fits: fits('.block-name') && fits('.block-go')
        && b.scrollWidth <= b.clientWidth + 1, view: b.dataset.view, href: b.getAttribute('href')};
  })};
})"""


def check_model_view(p, n_layers: int) -> None:
    layers = p.evaluate(MEASURE)
    assert len(layers) == n_layers
    for layer in layers:
        blocks = layer["blocks"]
        assert len(blocks) == 6, layer["layer"]
        assert len({b["top"] for b in blocks}) == 1, f"layer {layer['layer']}'s blocks are on more than one row"
        for b in blocks:
            assert b["lines"] == {"name": 1, "go": 1}, b["name"]
            assert b["fits"] and layer["left"] <= b["left"] and b["right"] <= layer["right"], b["name"]
            mlp = ".mlp." in b["name"]
            assert (b["view"] == "lens") == mlp, b["name"]
            assert parse_qs(urlsplit(b["href"]).query)["view"] == ["lens" if mlp else "attention"], b["name"]


def test_the_runs_model_view_fits_1280_px_and_its_mlps_open_the_lens(browser, srv, opened):
    p = visit(browser, srv.base, opened, view="model")
    assert p.viewport_size["width"] == 1280
    check_model_view(p, 2)
    shot(p, "trips-model-1280")
    mlps = p.query_selector_all('.block[data-view="lens"]')
    assert len(mlps) == 4
    for i in range(len(mlps)):  # each opens the lens view, its attribution drawn with every MLP's bar
        block = p.query_selector_all('.block[data-view="lens"]')[i]
        layer = block.get_attribute("data-layer")
        assert f"block {layer}" in block.inner_text()
        block.click()
        p.wait_for_selector("#attr-bars .attr-bar")
        wait_drawn(p)
        assert query_of(p)["view"] == "lens"
        assert p.query_selector(f'#attr-bars .attr-bar[data-part="mlp"][data-layer="{layer}"]') is not None
        p.go_back()
        wait_drawn(p)
        p.wait_for_selector(".block[data-parameters]")


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_wide_models_fit_1280_px(browser, files, opened, tmp_path, arch):
    """Twelve layers (names up to h.11.mlp.c_proj) and counts in the millions, as GPT-2's."""
    shape = {"vocab_size": 400, "context_length": 32, "d_model": 384, "n_layers": 12, "n_heads": 12}
    config = GPTConfig(**shape) if arch == "gpt2" else llama_config(**shape, n_kv_heads=4)
    path = tmp_path / "model.safetensors"
    GPT(config, seed=0).save(path)
    running = Running(serve.make_server(path, tokenizer=files["tok"], port=0))
    try:
        p = visit(browser, f"http://127.0.0.1:{running.port}/", opened, view="model")
        check_model_view(p, 12)
        assert "parameters" in p.inner_text('.block[data-name="h.11.mlp.c_fc"]')
        shot(p, f"trips-model-{arch}-1280")
    finally:
        running.stop()
