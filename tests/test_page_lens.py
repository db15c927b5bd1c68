"""The page's Lens view in a real browser (the system's Chromium, through Playwright): the logit
lens's grid and the attribution's bars are /api/lens's and /api/attribution's numbers
(tests/test_serve_lens.py holds those to `tk explain --json`), a head's bar opens that head's
attention, the address carries the view, the text and the position, bad input is one line, and a
`tk explain --html` file draws the same view offline. Screenshots go to build/page-shots/.

One server (tests/test_serve.py's small run: 2 layers, 2 heads, context 32) and one browser serve
the module; without Playwright or a Chromium it skips (tests/browser.py).
"""

from __future__ import annotations

import contextlib
import io
import math
from urllib.parse import urlencode

import pytest
from browser import open_page, shot
from test_lens import random_model
from test_page_html import goto, offline
from test_serve import Running, train_files

from tokenkit.bpe import Tokenizer
from tokenkit.cli import serve
from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint
from tokenkit.transformer.config import llama_config

TEXT = "Once upon a time, there was a little cat."
FAILED_400 = "Failed to load resource: the server responded with a status of 400 (Bad Request)"
# explain.js's colour scale (ColorBrewer "Blues"), to check a cell's colour against the probability
STOPS = [(255, 255, 255), (222, 235, 247), (198, 219, 239), (158, 202, 225), (107, 174, 214),
         (66, 146, 198), (33, 113, 181), (8, 81, 156), (8, 48, 107)]  # fmt: skip


def visible(text: str) -> str:
    """A token's text as core.js's `visible` shows it (whitespace and control characters as marks)."""
    if text == "":
        return "∅"
    marks = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍", "\x7f": "␡"}
    return "".join(marks.get(c, chr(0x2400 + ord(c)) if ord(c) < 0x20 else c) for c in text)


def blues(p: float) -> str:
    """The colour explain.js's `colour(p)` gives, as the browser's computed style writes it."""
    x = min(1.0, max(0.0, p)) * (len(STOPS) - 1)
    i = min(len(STOPS) - 2, math.floor(x))
    f = x - i
    r, g, b = (math.floor(a + f * (c - a) + 0.5) for a, c in zip(STOPS[i], STOPS[i + 1], strict=True))
    return f"rgb({r}, {g}, {b})"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return train_files(tmp_path_factory.mktemp("page_lens"))


@pytest.fixture(scope="module")
def srv(files):
    with Running(serve.make_server(files["run"], port=0)) as running:
        yield running


@pytest.fixture
def page(browser, srv):  # noqa: F811 -- the fixture tests/browser.py defines
    """`visit(**address)`: a page of the server at that address, drawn; after the test it has asked
    nothing of any other server and logged no console error but those the test allowed."""
    opened = []

    def visit(allowed_errors=(), **params):
        p = open_page(browser, srv.base + "?" + urlencode({"view": "lens", **params}))
        p.set_default_timeout(10_000)
        p.tk_allowed = list(allowed_errors)
        opened.append(p)
        return p

    yield visit
    for p in opened:
        assert [url for url in p.tk_requests if not url.startswith(srv.base)] == []
        assert [e for e in p.tk_errors if e not in p.tk_allowed] == []
        p.context.close()


def wait_address(p, condition: str) -> None:
    """Wait until `condition` (JavaScript over `q`, the address's parameters) holds and the view has drawn."""
    p.wait_for_function(f"() => {{ const q = new URLSearchParams(location.search); return ({condition}) "
                        "&& document.body.dataset.ready === '1'; }")  # fmt: skip


def wait_position(p, position: int) -> None:
    wait_address(p, f"q.get('position') === '{position}'")


def cells(p) -> list[dict]:
    return p.eval_on_selector_all(
        ".lens-cell",
        """cs => cs.map(c => ({layer: +c.dataset.layer, pos: +c.dataset.pos, p: c.dataset.p, rank: c.dataset.rank,
            top: +c.dataset.top, colour: getComputedStyle(c).backgroundColor}))""",
    )


def bars(p) -> list[tuple]:
    return [
        (b["part"], b["layer"], b["head"], float(b["value"]))
        for b in p.eval_on_selector_all(
            "#attr-bars .attr-bar",
            "bs => bs.map(b => ({part: b.dataset.part, layer: b.dataset.layer == null ? null : +b.dataset.layer, "
            "head: b.dataset.head == null ? null : +b.dataset.head, value: b.dataset.value}))",
        )
    ]


def api_bars(doc: dict, rotary: bool = False) -> list[tuple]:
    """The attribution's shares in the page's order: embeddings (no position's with rotary
    positions), then each block's heads and MLP, then the biases (when the model has any)."""
    out = [("token_embedding", None, None, doc["embeddings"]["token"])]
    if not rotary:
        out.append(("position_embedding", None, None, doc["embeddings"]["position"]))
    for layer in range(doc["n_layers"]):
        out += [("head", layer, h, share) for h, share in enumerate(doc["heads"][layer])]
        out.append(("mlp", layer, None, doc["mlps"][layer]))
    biases = doc["biases"]
    if not any(biases["attn"]) and not any(biases["mlp"]) and not biases["norm"]:
        return out
    for layer in range(doc["n_layers"]):
        out += [("attn_bias", layer, None, biases["attn"][layer]), ("mlp_bias", layer, None, biases["mlp"][layer])]
    return [*out, ("norm_bias", None, None, biases["norm"])]


# ----------------------------------------------------------------------------- the lens's grid


def test_the_grid_is_boundaries_by_positions_each_cell_the_apis(page, srv):
    p = page(text=TEXT)
    doc = srv.ok("/api/lens", text=TEXT)
    T, N = len(doc["tokens"]), doc["n_layers"] + 1
    got = cells(p)
    assert len(got) == N * T and p.locator(".lens-pos").count() == T and p.locator(".lens-label").count() == N + 1
    assert [(c["layer"], c["pos"]) for c in got] == [(n, t) for n in range(N) for t in range(T)]
    for c in got:
        layer = doc["lens"][c["layer"]]
        p_final = layer["predicted_probability"][c["pos"]]
        assert float(c["p"]) == p_final  # the very number the server sent
        assert c["colour"] == blues(p_final)
        assert c["top"] == layer["top"][c["pos"]][0][0]
        rank = layer["next_rank"][c["pos"]]
        assert c["rank"] == ("" if rank is None else str(rank))
    # the last row is the model's output: its first choices are the whole model's predictions
    assert [c["top"] for c in got if c["layer"] == N - 1] == doc["predicted"]
    shot(p, "lens")


def test_hovering_a_cell_shows_the_apis_top_tokens(page, srv):
    p = page(text=TEXT)
    doc = srv.ok("/api/lens", text=TEXT)
    T = len(doc["tokens"])
    for layer, pos in [(0, 0), (1, T // 2), (doc["n_layers"], T - 1)]:
        p.hover(f'.lens-cell[data-layer="{layer}"][data-pos="{pos}"]')
        tip = p.wait_for_selector(f'#lens-tip[data-layer="{layer}"][data-pos="{pos}"]:not([hidden])')
        rows = tip.eval_on_selector_all("tr", "rs => rs.map(r => [+r.dataset.id, r.dataset.p, r.cells[0].textContent])")
        top = doc["lens"][layer]["top"][pos]
        assert [(i, float(prob)) for i, prob, _ in rows] == [(i, prob) for i, prob in top]
        assert [text for _, _, text in rows] == [visible(doc["labels"][str(i)]) for i, _ in top]
        said = tip.inner_text()
        if pos + 1 < T:
            assert f"rank {doc['lens'][layer]['next_rank'][pos]}" in said
        else:
            assert "no next token" in said
    p.mouse.move(1, 1)
    p.wait_for_selector("#lens-tip", state="hidden")


def test_the_keyboard_moves_through_the_grid_and_picks_a_position(page):
    p = page(text=TEXT)
    T, N = p.locator(".lens-pos").count(), p.locator(".lens-label").count() - 1
    assert p.locator('.lens-cell[tabindex="0"]').count() == 1  # one stop in the tab order: the last position's output
    p.focus('.lens-cell[tabindex="0"]')
    for key in ("ArrowUp", "ArrowLeft", "ArrowLeft", "ArrowDown", "ArrowDown"):  # down stays within the grid
        p.keyboard.press(key)
    assert p.evaluate("[document.activeElement.dataset.layer, document.activeElement.dataset.pos]") == [
        str(N - 1),
        str(T - 3),
    ]
    assert p.get_attribute("#lens-tip", "data-pos") == str(T - 3) and p.is_visible("#lens-tip")
    p.keyboard.press("Enter")
    wait_position(p, T - 3)


# ----------------------------------------------------------------------------- the attribution


def test_the_bars_are_the_apis_shares_and_sum_to_the_logit(page, srv):
    p = page(text=TEXT)
    T = p.locator(".lens-pos").count()
    last = srv.ok("/api/attribution", text=TEXT, position=T - 1)
    assert bars(p) == api_bars(last)  # the last position at first
    p.click('.lens-cell[data-layer="0"][data-pos="2"]')  # any cell of a column picks its position
    wait_position(p, 2)
    doc = srv.ok("/api/attribution", text=TEXT, position=2)
    got = bars(p)
    assert got == api_bars(doc)
    assert sum(v for *_, v in got) == pytest.approx(doc["logit"], abs=1e-4)
    assert float(p.get_attribute("#attr-logit", "data-value")) == doc["logit"]
    assert int(p.get_attribute("#attr-token", "data-id")) == doc["token"] == doc["prediction"]
    assert "frozen at its actual value" in p.inner_text("#attr-frozen")
    assert p.locator('.lens-cell.selected[data-pos="2"]').count() == doc["n_layers"] + 1
    shot(p, "lens-position-2")


def test_a_head_bar_opens_that_heads_attention_at_the_position(page, srv):
    p = page(text=TEXT, position=3)
    p.click('#attr-bars a.attr-bar[data-part="head"][data-layer="1"][data-head="0"]')
    wait_address(p, "q.get('view') === 'attention'")
    assert p.eval_on_selector(".thumb.selected", "b => [b.dataset.layer, b.dataset.head]") == ["1", "0"]
    assert p.get_attribute(".qlabel.selected", "data-q") == "3"
    p.go_back()  # and back to the lens at the same position
    wait_position(p, 3)
    assert p.get_attribute("body", "data-view") == "lens"
    assert p.locator('.lens-pos.selected[data-pos="3"]').count() == 1


def test_typing_a_new_text_forgets_the_position(page):
    p = page(text=TEXT, position=4)
    p.fill("#text", "The cat sat")
    wait_address(p, "!q.has('position')")
    n = p.locator(".lens-pos").count()
    assert p.locator(f'.lens-pos.selected[data-pos="{n - 1}"]').count() == 1  # the last position again


def test_a_llama_model_has_no_position_or_bias_bars(browser, files, tmp_path):  # noqa: F811
    """Rotary positions, RMSNorm, no biases, K/V heads shared: the bars are its parts, no others."""
    tok = Tokenizer.load(files["tok"])
    cfg = llama_config(vocab_size=tok.vocab_size, context_length=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
    model = random_model(cfg)
    path = tmp_path / "llama.safetensors"
    saved = {"config": cfg.to_dict(), "step": 0, "val_loss": None, "best_val_loss": None, "provenance": {}}
    checkpoint.save_model(path, model.params, tok, **saved)
    running = Running(serve.make_server(path, port=0))
    try:
        p = open_page(browser, f"http://127.0.0.1:{running.port}/?" + urlencode({"view": "lens", "text": TEXT}))
        doc = running.ok("/api/attribution", text=TEXT)
        got = bars(p)
        assert got == api_bars(doc, rotary=True) and {part for part, *_ in got} == {"token_embedding", "head", "mlp"}
        assert sum(v for *_, v in got) == pytest.approx(doc["logit"], abs=1e-4)
        assert "1/rms" in p.inner_text("#attr-frozen")
        lens = running.ok("/api/lens", text=TEXT)
        assert [float(c["p"]) for c in cells(p)] == [x for n in lens["lens"] for x in n["predicted_probability"]]
        assert p.tk_errors == []
        p.context.close()
    finally:
        running.stop()


# ----------------------------------------------------------------------------- bad input


def test_bad_input_is_one_line_on_the_page(page, srv):
    p = page(text=TEXT, position=99, allowed_errors=[FAILED_400])
    said = p.inner_text("#attr-error")
    assert said == srv.refused("/api/attribution", text=TEXT, position=99) and "\n" not in said
    assert p.locator(".lens-cell").count() > 0  # the lens still stands
    special = TEXT + "<|endoftext|>"  # a special token the default policy refuses (a long text is cut: test_page.py)
    p = page(text=special, allowed_errors=[FAILED_400])
    said = p.inner_text("#view .error")
    assert said == srv.refused("/api/lens", text=special) and "\n" not in said and "Traceback" not in said
    assert p.locator("#tabs a").count() >= 8  # the page itself stands


# ----------------------------------------------------------------------------- tk explain --html


def test_the_html_file_draws_the_lens_and_every_positions_attribution_offline(browser, srv, files, tmp_path):  # noqa: F811
    out = tmp_path / "lens.html"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["explain", "-m", str(files["run"]), TEXT, "--html", str(out), "--view", "lens"]) == 0
    doc = srv.ok("/api/lens", text=TEXT)
    with offline(browser, out) as p:
        assert p.get_attribute("body", "data-view") == "lens"
        got = cells(p)
        assert [float(c["p"]) for c in got] == [x for layer in doc["lens"] for x in layer["predicted_probability"]]
        for position in (0, len(doc["tokens"]) - 1):
            goto(p, out, f"?position={position}")
            assert bars(p) == api_bars(srv.ok("/api/attribution", text=TEXT, position=position))
        assert p.tk_errors == []
