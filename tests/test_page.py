"""The page of `tk serve` in a real browser (the system's Chromium, through Playwright): what it
draws is what the commands print. Text is typed into the page and its chips are checked against
`tk encode`, the heatmap and the worked arithmetic against `tk explain --json`, the bars against
`tk predict-next --json`, the generated tokens against `tk generate`, the training chart against
the run's log (and its growth, live); every view opens from its address, the page asks nothing of
any other server and logs no console error. A screenshot of each view is kept in build/page-shots/
(test artefacts, git-ignored).

One server (a run trained here, with a second tokenizer to compare) and one browser serve the
module; without Playwright or a Chromium it skips, saying which is missing (tests/browser.py).

The numbers are compared exactly: the server writes each float64 as its shortest repr, the page
parses it to the same double and writes it back into its data-* attributes with JavaScript's
String(), which is again the shortest repr that round-trips, so float(attribute) is the very
number `--json` printed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import numpy as np
import pytest
from browser import open_in, open_page, shot, wait_drawn
from test_serve import EOT, Running, cli_json, train_files

from tokenkit.bpe import Tokenizer
from tokenkit.cli import serve
from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint, trainlog, views
from tokenkit.pipeline.run import load_model_and_tokenizer
from tokenkit.transformer import GPT, GPTConfig

VIEWS = ("tokens", "bpe", "attention", "lens", "next", "chat", "training", "model", "examples")
DRAWN = {  # what each view draws, once it has drawn
    "tokens": '.panel[data-role="main"] .chip',
    "bpe": "#bpe-seq .chip",
    "attention": ".heatmap .cell",
    "lens": "#attr-bars .attr-bar",
    "next": "#next-bars .bar",
    "chat": "#chat-absent",  # the run's tokenizer has no chat template (tests/test_page_chat.py chats)
    "training": '#loss-chart .curve-point[data-kind="train"]',
    "model": ".block[data-parameters]",
    "examples": ".example-step",
}
DEFAULTS = {  # cli/page/core.js's: the address leaves these out
    "view": "tokens", "text": "Once upon a time, there was a little cat.", "layer": "0", "head": "0", "query": "",
    "example": "attention-lookup", "step": "", "temperature": "1", "top_k": "", "top_p": "", "seed": "0", "n": "20",
    "specials": "", "position": "", "which": "",
}  # fmt: skip
FAILED_400 = "Failed to load resource: the server responded with a status of 400 (Bad Request)"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return train_files(tmp_path_factory.mktemp("page"))


@pytest.fixture(scope="module")
def srv(files):
    with Running(serve.make_server(files["run"], compare=files["other"], port=0)) as running:
        yield running


@pytest.fixture
def page(browser, srv):  # noqa: F811 -- the fixture imported above
    """A page of the server (opened at its defaults by `visit`); closed after the test, having asked
    nothing of any other server and logged no console error but those the test expected."""
    opened = []

    def visit(allowed_errors=(), context=None, **params):
        target = srv.base + ("?" + urlencode(params) if params else "")
        if opened and context is None:
            p = opened[-1]
            p.goto(target)
            wait_drawn(p)
        else:
            p = open_page(browser, target) if context is None else open_in(context, target)
            opened.append(p)
        p.tk_allowed = list(allowed_errors)
        p.set_default_timeout(10_000)  # a page that never draws fails in seconds, not half a minute
        return p

    yield visit
    for p in opened:
        outside = [url for url in p.tk_requests if not url.startswith(srv.base)]
        assert outside == [], "the page asked another server"
        errors = [e for e in p.tk_errors if e not in p.tk_allowed]
        assert errors == [], "the page logged console errors"
        p.context.close()


def state(p) -> dict[str, str]:
    """The page's state as its address holds it, defaults filled in (the address leaves them out)."""
    query = parse_qs(urlsplit(p.url).query, keep_blank_values=True)
    return {**DEFAULTS, **{k: v[0] for k, v in query.items()}}


def wait_state(p, **want) -> None:
    """Wait until the address holds `want` and the view has drawn it."""
    want = {k: str(v) for k, v in want.items()}
    p.wait_for_function(
        """([want, defaults]) => {
            const q = new URLSearchParams(location.search);
            return Object.entries(want).every(([k, v]) => (q.has(k) ? q.get(k) : defaults[k]) === v)
                && document.body.dataset.ready === "1";
        }""",
        arg=[want, DEFAULTS],
    )


def attrs(p, selector: str, *names: str) -> list[tuple]:
    """The data-* attributes `names` of every element matching `selector`, in document order."""
    return [
        tuple(row)
        for row in p.eval_on_selector_all(
            selector, "(nodes, names) => nodes.map(n => names.map(k => n.dataset[k] ?? null))", list(names)
        )
    ]


def ids(p, selector: str) -> list[int]:
    return [int(i) for (i,) in attrs(p, selector, "id")]


def encode(capsys, tokenizer: Path, text: str, *flags: str) -> list[int]:
    return cli_json(capsys, "encode", "-t", str(tokenizer), text, *flags, "--json")


# ----------------------------------------------------------------------------- tokens


TYPED = [
    "Once upon a time, there was a little cat.",
    "Ça va? café crème, naïve 日本",  # multi-byte characters
    "an emoji 😀🦜 cut into pieces",  # tokens that are parts of a character
    "line one\nline two\n\n\tindented\tand  spaced",
]


def chip_spans_cover(text: str, spans: list[tuple]) -> None:
    raw = text.encode()
    assert [int(s) for s, _ in spans][:1] == [0] and int(spans[-1][1]) == len(raw)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end == start  # one after another, no gap, no overlap


def test_typed_text_redraws_the_chips_as_tk_encode(page, srv, files, capsys):
    p = page()
    for n, text in enumerate(TYPED):
        if n % 2:
            p.fill("#text", text)
        else:  # key by key: a redraw once typing pauses
            p.fill("#text", "")
            wait_state(p, text="")
            p.keyboard.type(text)
        wait_state(p, text=text, view="tokens")
        main_ids = ids(p, '.panel[data-role="main"] .chip')
        assert main_ids == encode(capsys, files["run"], text)
        assert ids(p, '.panel[data-role="compare"] .chip') == encode(capsys, files["other"], text)
        for role in ("main", "compare"):
            chip_spans_cover(text, attrs(p, f'.panel[data-role="{role}"] .chip', "start", "end"))
        assert p.text_content("#ids") == "[" + ", ".join(map(str, main_ids)) + "]"
        if "😀" in text:
            assert p.locator('.panel[data-role="main"] .chip.partial').count() > 0

        # the spans the tokenizers cut differently: listed, and the chips over them marked
        differ = srv.ok("/api/compare", text=text)["differ"]
        assert [[int(s), int(e)] for s, e in attrs(p, ".differ-span", "start", "end")] == differ
        for role in ("main", "compare"):
            for start, end, marked in p.eval_on_selector_all(
                f'.panel[data-role="{role}"] .chip',
                "nodes => nodes.map(n => [+n.dataset.start, +n.dataset.end, n.classList.contains('differ')])",
            ):
                assert marked == any(s < end and start < e for s, e in differ), (role, start, end)
    shot(p, "tokens")


def test_hovering_a_chip_lights_the_same_bytes_in_the_other_panel(page):
    p = page(text="Once upon a time, there was a little cat. Ça va? 😀")
    chips = attrs(p, '.panel[data-role="main"] .chip.differ', "start", "end")
    assert chips, "the two tokenizers should cut this text differently somewhere"
    for start, end in [chips[0], chips[-1]]:
        p.hover(f'.panel[data-role="main"] .chip[data-start="{start}"][data-end="{end}"]')
        lit = attrs(p, '.panel[data-role="compare"] .chip.hl', "start", "end")
        over = [
            (s, e) for s, e in attrs(p, '.panel[data-role="compare"] .chip', "start", "end")
            if int(s) < int(end) and int(start) < int(e)
        ]  # fmt: skip
        assert lit == over and lit
        assert attrs(p, '.panel[data-role="main"] .chip.hl', "start", "end") == [(start, end)]
        chip = f'.panel[data-role="main"] .chip[data-start="{start}"]'
        assert "id " + p.get_attribute(chip, "data-id") in p.text_content("#chip-detail")


def test_copy_puts_the_ids_on_the_clipboard(page, browser, srv, files, capsys):  # noqa: F811
    context = browser.new_context(permissions=["clipboard-read", "clipboard-write"])
    text = "Once upon a time 😀"
    p = page(context=context, text=text)
    p.click("#copy-ids")
    p.wait_for_function("() => document.getElementById('copy-ids').textContent.startsWith('Copied')")
    assert json.loads(p.evaluate("() => navigator.clipboard.readText()")) == encode(capsys, files["run"], text)
    p.click("#copy-ids-compare")
    p.wait_for_function("() => document.getElementById('copy-ids-compare').textContent.startsWith('Copied')")
    assert json.loads(p.evaluate("() => navigator.clipboard.readText()")) == encode(capsys, files["other"], text)


def test_special_tokens_follow_the_control(page, files, capsys):
    text = f"The end.{EOT}Once"
    p = page(text=text, allowed_errors=[FAILED_400])  # refused by default: the server's 400, said in one line
    error = p.text_content("#view .error")
    assert EOT in error and "\n" not in error and "Traceback" not in error
    for policy, flag in [("allow", "--allow-special"), ("text", "--specials-as-text")]:
        p.select_option("#specials", policy)
        wait_state(p, specials=policy, text=text)
        assert ids(p, '.panel[data-role="main"] .chip') == encode(capsys, files["run"], text, flag)
        assert p.locator(".chip.special").count() == (policy == "allow")
    shot(p, "tokens-special")


# ----------------------------------------------------------------------------- bpe


def test_bpe_replay_steps_as_the_server_and_tk_encode(page, srv, files, capsys):
    text = "Once upon a time, the cat sat. Ça va?"
    replay = srv.ok("/api/bpe", text=text)
    steps = replay["steps"]
    p = page(view="bpe", text=text)
    last = len(steps)
    assert p.get_attribute("#bpe-seq", "data-step") == str(last) and state(p)["step"] == ""
    assert ids(p, "#bpe-seq .chip") == encode(capsys, files["run"], text)
    assert p.locator("#bpe-first-merges tbody tr").count() == 50
    p.click("#bpe-first")
    p.wait_for_selector('#bpe-seq[data-step="0"]')
    assert ids(p, "#bpe-seq .chip") == list(text.encode()) == replay["initial"]  # one chip per byte
    assert state(p)["step"] == "0" and p.input_value("#bpe-slider") == "0"
    for k in range(1, last + 1):  # each step the server's
        p.click("#bpe-next")
        p.wait_for_selector(f'#bpe-seq[data-step="{k}"]')
        rank, new_id = attrs(p, "#bpe-step", "rank", "newId")[0]
        assert (int(rank), int(new_id)) == (steps[k - 1]["rank"], steps[k - 1]["new_id"])
        assert p.input_value("#bpe-slider") == str(k) and state(p)["step"] == ("" if k == last else str(k))
    assert ids(p, "#bpe-seq .chip") == replay["ids"]
    # the slider and the address agree, both ways
    k = last // 2
    p.eval_on_selector("#bpe-slider", "(s, k) => { s.value = k; s.dispatchEvent(new Event('input')); }", k)
    p.wait_for_selector(f'#bpe-seq[data-step="{k}"]')
    assert state(p)["step"] == str(k)
    p2 = page(view="bpe", text=text, step=3)
    assert p2.input_value("#bpe-slider") == "3" and p2.get_attribute("#bpe-seq", "data-step") == "3"
    assert attrs(p2, "#bpe-step", "rank")[0][0] == str(steps[2]["rank"])
    shot(p2, "bpe")


# ----------------------------------------------------------------------------- attention


def step_values(doc: dict) -> dict:
    return {s["key"]: s["value"] for s in doc["steps"]}


def same(x: str, want) -> bool:
    """An attribute's number is the JSON's (null: a masked -inf)."""
    return (x == "-inf") if want is None else float(x) == want


def test_attention_cells_and_arithmetic_are_tk_explain_json(page, files, capsys):
    text = "Once upon a time there was"
    p = page(view="attention", text=text, layer=1, head=1)
    expl = cli_json(capsys, "explain", "-m", str(files["run"]), text, "--layer", "1", "--head", "1", "--json")
    T = len(expl["tokens"])
    cells = attrs(p, ".heatmap .cell", "q", "k", "w")
    assert len(cells) == T * T
    values = step_values(expl)
    for q, k, w in cells:  # the heatmap is the layer's trace, as explain's weights step and attention_all_heads
        q, k = int(q), int(k)
        assert float(w) == expl["attention_all_heads"][1][q][k] == values["h.1.attn.weights"][q][k], (q, k)
    # a thumb picks layer and head, in the address
    p.click('.thumb[data-layer="0"][data-head="1"]')
    wait_state(p, layer=0, head=1)
    assert p.locator('.thumb.selected[data-layer="0"][data-head="1"]').count() == 1
    expl0 = cli_json(capsys, "explain", "-m", str(files["run"]), text, "--layer", "0", "--head", "1", "--json")
    assert [float(w) for (w,) in attrs(p, '.heatmap .cell[data-q="2"]', "w")] == expl0["attention_all_heads"][1][2]
    # a query row: the worked arithmetic, every number explain's
    query = T - 2
    p.click(f'.qlabel[data-q="{query}"]')
    wait_state(p, layer=0, head=1, query=query)
    p.wait_for_selector("#arith [data-key]")
    # the chosen query's mark frames exactly its row of cells (it once stretched over two rows)
    box = p.locator(".heatmap .row-mark").bounding_box()
    first = p.locator(f'.heatmap .cell[data-q="{query}"][data-k="0"]').bounding_box()
    last = p.locator(f'.heatmap .cell[data-q="{query}"][data-k="{T - 1}"]').bounding_box()
    assert box["y"] <= first["y"] and box["y"] + box["height"] <= first["y"] + first["height"] + 4
    assert box["x"] <= first["x"] and box["x"] + box["width"] >= last["x"] + last["width"]
    values = step_values(expl0)
    p.eval_on_selector_all("#arith .vec > button.more", "buttons => buttons.forEach(b => b.click())")  # all numbers
    checked = set()
    for key, value, row, col in attrs(p, "#arith [data-key]", "key", "value", "row", "col"):
        want = values[key][int(row)]
        if col is None:  # a vector: its whole row, as JSON
            assert json.loads(value) == want, key
        else:
            assert same(value, want[int(col)]), (key, row, col)
        assert int(row) == query or key in ("h.0.attn.k", "h.0.attn.v"), key  # keys and values of every position
        checked.add(key)
    assert {"x0", "h.0.attn.q", "h.0.attn.scores", "h.0.attn.weights", "h.0.attn.mix", "h.0.resid_2"} <= checked
    shown = p.locator("#arith .vec .num").count()
    assert shown == sum(len(json.loads(v)) for (v,) in attrs(p, "#arith .vec", "value"))  # all expanded
    derived = dict((k, float(v)) for k, v in attrs(p, "#arith [data-derived]", "derived", "value") if k != "exp")
    weights = [w for w in values["h.0.attn.weights"][query] if w is not None][: query + 1]
    assert derived["sum-w"] == pytest.approx(sum(weights), abs=1e-6)
    scores = [s for s in values["h.0.attn.scores"][query][: query + 1]]
    assert derived["max"] == max(scores)
    shot(p, "attention")


@pytest.fixture(scope="module")
def wide(files, tmp_path_factory):
    """A server of an untrained model of 12 layers x 12 heads (GPT-2 124M's) and a context of 256:
    every head's whole weights fit 85 tokens, one head's and every head's thumbnail 256."""
    cfg = GPTConfig(vocab_size=400, context_length=256, d_model=48, n_layers=12, n_heads=12)
    path = tmp_path_factory.mktemp("wide") / "wide.safetensors"
    GPT(cfg).save(path)
    with Running(serve.make_server(path, tokenizer=files["tok"], port=0)) as running:
        yield running


def test_thumbnails_of_a_long_text_pick_the_head_shown_whole(browser, wide):  # noqa: F811
    text = "Once upon a time, there was a little cat who sat. " * 5
    doc = wide.ok("/api/attention", text=text, layer=0, head=0)
    thumbs = wide.ok("/api/thumbnails", text=text)
    T, edges = len(doc["tokens"]), thumbs["thumbnail_edges"]
    assert 85 < T <= 160 and len(edges) == 49  # pooled thumbnails; the large map still a grid of cells
    p = open_page(browser, wide.base + "?" + urlencode({"view": "attention", "text": text}))
    try:
        lo, hi = T // 48, T // 48 + 1
        assert p.locator(".thumb canvas").count() == 144 and p.get_attribute(".thumbs", "data-block") == f"{lo}-{hi}"
        assert f"{T} tokens: each thumbnail cell is the mean of a {lo}–{hi}" in p.text_content("#thumb-note")
        # each cell's colour: its block mean x the block's keys (its share of the queries' attention); masked grey
        got = p.evaluate(
            """([layer, head, cells]) => {
                const canvas = document.querySelector(`.thumb[data-layer="${layer}"][data-head="${head}"] canvas`);
                const g = canvas.getContext("2d"), n = 48;
                return cells.map(([i, j]) => {
                    const x = Math.floor((j + 0.5) * canvas.width / n), y = Math.floor((i + 0.5) * canvas.height / n);
                    return Array.from(g.getImageData(x, y, 1, 1).data.slice(0, 3));
                });
            }""",
            [3, 4, [[i, j] for i in range(0, 48, 5) for j in range(0, 48, 7)]],
        )
        thumb = views.unpack_weights(thumbs["thumbnails"][3][4])
        cells = [(i, j) for i in range(0, 48, 5) for j in range(0, 48, 7)]
        for (i, j), colour in zip(cells, got, strict=True):
            share = float(thumb[i, j]) * (edges[j + 1] - edges[j])
            want = [246, 246, 248] if edges[j] >= edges[i + 1] else p.evaluate("(w) => TK.explain.rgb(w)", share)
            assert max(abs(a - b) for a, b in zip(colour, want, strict=True)) <= 2, ((i, j), colour, want, share)
        # a click shows that head whole: the server's exact weights, the model's trace
        p.click('.thumb[data-layer="5"][data-head="7"]')
        wait_state(p, layer=5, head=7)
        cells = attrs(p, ".heatmap .cell", "q", "k", "w")
        assert len(cells) == T * T
        model = wide.server.held.need_model().model
        trace = {}
        model.forward(np.array([[t["id"] for t in doc["tokens"]]]), trace=trace)
        weights = views.unpack_weights(wide.ok("/api/attention", text=text, layer=5, head=7)["weights"])
        assert weights.tobytes() == trace["h.5.attn.weights"][0, 7].tobytes()
        for q, k, w in cells:
            assert float(w) == weights[int(q), int(k)]
        assert p.locator('.thumb.selected[data-layer="5"][data-head="7"]').count() == 1
        p.go_back()  # the address keeps the head: back is head 0 of layer 0 again
        wait_state(p, layer=0, head=0)
        w = float(p.get_attribute('.heatmap .cell[data-q="9"][data-k="3"]', "data-w"))
        assert w == views.unpack_weights(doc["weights"])[9, 3]
        shot(p, "attention-thumbnails")
        p.goto(wide.base + "?" + urlencode({"view": "attention", "text": text * 2}))
        wait_drawn(p)
        assert p.locator(".thumb canvas").count() == 144 and p.locator("canvas.heatmap-canvas").count() == 1
        shot(p, "attention-thumbnails-canvas")
        assert p.tk_errors == []
        assert wide.ok("/api/thumbnails", text=text * 4)["cut"] > 0  # past the context: its last 256 tokens
    finally:
        p.context.close()


def test_the_page_reads_packed_weights_as_the_server_writes_them(page):
    # views.pack_weights -> JSON -> explain.js's unpackWeights: every number the very double, bit for bit
    rng = np.random.default_rng(3)
    maps = []
    for seed in range(24):
        n = int(rng.integers(1, 60))
        m = n if seed % 4 else int(rng.integers(1, 60))
        w = rng.random((n, m)) ** rng.uniform(1, 40)  # tiny numbers too
        if seed % 3:
            w = np.tril(w)
        if seed % 7 == 0:
            w.flat[rng.integers(0, w.size, 3)] = [np.nan, np.inf, -np.inf]
        maps.append(w.astype(np.float64 if seed % 5 == 0 else np.float32))
    packed = [views.pack_weights(w) for w in maps]
    assert {p["triangle"] for p in packed} == {True, False} and {p["dtype"] for p in packed} == {"float32", "float64"}
    p = page(view="tokens")
    got = p.evaluate("(maps) => maps.map((m) => TK.explain.unpackWeights(m).map((row) => Array.from(row)))", packed)
    for w, rows in zip(maps, got, strict=True):
        np.testing.assert_array_equal(np.array(rows, dtype=np.float64).reshape(w.shape), w.astype(np.float64))
    assert "bytes for" in p.evaluate(
        "(m) => { try { TK.explain.unpackWeights(m); return ''; } catch (e) { return e.message; } }",
        {**packed[1], "shape": [packed[1]["shape"][0] + 1] * 2},
    )


@pytest.fixture(scope="module")
def long_one(files, tmp_path_factory):
    """A server of a model of one layer of two heads and a context of 1024: a text of 990 tokens gives
    a head of 2.6 MB."""
    cfg = GPTConfig(vocab_size=400, context_length=1024, d_model=16, n_layers=1, n_heads=2)
    path = tmp_path_factory.mktemp("long") / "long.safetensors"
    GPT(cfg).save(path)
    with Running(serve.make_server(path, tokenizer=files["tok"], port=0)) as running:
        yield running


def test_the_page_keeps_answers_within_its_byte_bound(browser, long_one, files):  # noqa: F811
    tok = Tokenizer.load(files["tok"])
    texts = []
    for i in range(12):  # each a text of its own (990 tokens): answers the page has not seen
        ids = tok.encode(f"{i} " + "Once upon a time, there was a little cat who sat. " * 80)[:990]
        texts.append(tok.decode(ids))
    p = open_page(browser, long_one.base + "?" + urlencode({"view": "attention", "text": texts[0]}))
    try:
        sizes = []
        p.on("response", lambda r: "/api/" in r.url and sizes.append(int(r.headers.get("content-length", 0))))
        use = []
        for text in texts[1:]:
            for head in ("1", "0"):  # two heads of each text: 5.3 MB, and its thumbnails
                p.evaluate("([text, head]) => TK.go({text, head})", [text, head])
                wait_drawn(p)
                use.append(p.evaluate("TK.cacheUse()"))
        bound = use[-1]["mostBytes"]
        assert bound == 32 * 1024 * 1024 and sum(sizes) > 1.5 * bound  # the bound was needed
        for u in use:
            assert u["bytes"] <= bound and u["answers"] <= u["most"], u
        assert use[-1]["bytes"] > bound / 2  # it keeps what fits, not nothing
        kept = "([text, layer]) => TK.kept('/api/attention', {text, layer, head: 0}) !== null"
        assert not p.evaluate(kept, [texts[0], 0]) and p.evaluate(kept, [texts[-1], 0])  # the oldest went first
        before = len(p.tk_requests)
        p.evaluate("TK.draw()")  # the latest text again: drawn from what the page keeps
        wait_drawn(p)
        assert [u for u in p.tk_requests[before:] if "/api/" in u] == []
        assert p.tk_errors == []
    finally:
        p.context.close()


# ----------------------------------------------------------------------------- next token, generation


def test_next_token_bars_are_tk_predict_next(page, files, capsys):
    text = "Once upon a time, there"
    p = page(view="next", text=text)
    want = cli_json(capsys, "predict-next", "-m", str(files["run"]), text, "--top-k", "10", "--json")
    assert [(int(i), float(x)) for i, x in attrs(p, "#next-bars .bar", "id", "p")] == [
        (t["id"], t["p"]) for t in want["top"]
    ]
    shot(p, "next")


def generated(p) -> list[int]:
    return ids(p, ".gen-token")


def tk_generate(capsys, files, prompt: str, n: int, **settings) -> str:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    assert main(["generate", "-m", str(files["run"]), prompt, "-n", str(n), *flags]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith(prompt) and out.endswith("\n")
    return out[len(prompt) : -1]


def test_generation_is_tk_generate_and_the_seed_repeats_it(page, srv, files, capsys):
    prompt = "Once upon"
    tok = Tokenizer.load(files["tok"])
    settings = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 5}
    p = page(view="next", text=prompt, n=12, **settings)
    first = generated(p)
    assert len(first) == 12 and tok.decode(first) == tk_generate(capsys, files, prompt, 12, **settings)
    steps = srv.ok("/api/generate", text=prompt, n=12, show=10, **settings)["steps"]
    assert [s["id"] for s in steps] == first
    for i in (0, 3, 11):  # the distribution each token was drawn from: the server's, the drawn one marked
        p.click(f'.gen-token[data-step="{i}"]')
        p.wait_for_selector(f'#gen-step[data-step="{i}"]')
        shown = [(t["id"], t["p"]) for t in steps[i]["top"] if t["p"] > 0]
        assert [(int(b), float(x)) for b, x in attrs(p, "#step-bars .bar", "id", "p")] == shown
        assert ids(p, "#step-bars .bar.drawn") == [b for b, _ in shown if b == first[i]]
    # the settings' fields change the address; the same seed draws the same tokens again
    p.fill("#gen-seed", "6")
    p.press("#gen-seed", "Enter")
    wait_state(p, seed=6)
    other = generated(p)
    assert tok.decode(other) == tk_generate(capsys, files, prompt, 12, **{**settings, "seed": 6}) and other != first
    p.fill("#gen-seed", "5")
    p.press("#gen-seed", "Enter")
    wait_state(p, seed=5)
    assert generated(p) == first
    p = page(view="next", text=prompt, n=12, **settings)  # a fresh load of the address, nothing kept
    assert generated(p) == first
    for name, value in [("temperature", "0"), ("top_k", ""), ("top_p", "")]:
        p.fill(f"#gen-{name.replace('_', '-')}", value)
        p.press(f"#gen-{name.replace('_', '-')}", "Enter")
        wait_state(p, **{name: value})
    greedy = {"temperature": 0, "seed": 5}
    assert tok.decode(generated(p)) == tk_generate(capsys, files, prompt, 12, **greedy)
    assert {float(x) for (x,) in attrs(p, "#step-bars .bar", "p")} == {1.0}  # one-hot at temperature 0
    shot(p, "next-generate")


# ----------------------------------------------------------------------------- training


def chart_points(p, kind: str) -> list[tuple[int, float]]:
    return [(int(s), float(x)) for s, x in attrs(p, f'#loss-chart .curve-point[data-kind="{kind}"]', "step", "loss")]


def test_training_chart_is_the_log(page, files):
    p = page(view="training")
    records = trainlog.read_log(files["run"] / "log.jsonl")
    logged = {r["step"]: r["loss"] for r in records if r["type"] == "step"}
    train = chart_points(p, "train")
    assert train and all(logged[s] == x for s, x in train)  # a thinned curve's points are the log's
    assert train == sorted(logged.items())  # 20 steps: none thinned
    assert chart_points(p, "val") == [(r["step"], r["val_loss"]) for r in records if r["type"] == "eval"]
    session = [r for r in records if r["type"] == "session"][-1]
    baseline = checkpoint.load_model(files["run"]).metadata["provenance"]["unigram_baseline"]
    assert float(p.get_attribute("#baseline", "data-loss")) == baseline == session["unigram_baseline"]
    assert attrs(p, "#training-stats", "lastStep", "finished") == [("20", "1")]
    shot(p, "training")


def test_training_follows_a_growing_log_without_reloading(browser, files, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(files["run"], run)
    log_path = run / checkpoint.LOG_FILE
    records = trainlog.read_log(log_path)
    trainlog.truncate_log(log_path, 5)  # a run at step 5 of 20
    live = Running(serve.make_server(run, port=0))
    base = f"http://127.0.0.1:{live.port}/"
    try:
        p = open_page(browser, base + "?view=training")
        assert [s for s, _ in chart_points(p, "train")] == [1, 2, 3, 4, 5]
        assert attrs(p, "#training-stats", "finished") == [("0",)]
        p.evaluate("() => { window.tkNotReloaded = true; }")
        log = trainlog.JsonlLog(log_path)  # training goes on, written as tk writes it
        try:
            for r in records:
                if r["type"] != "session" and 5 < r["step"] <= 12:
                    log.write(r)
            p.wait_for_selector('#training-stats[data-last-step="12"]', timeout=10_000)
            assert [s for s, _ in chart_points(p, "train")] == list(range(1, 13))
            assert [s for s, _ in chart_points(p, "val")] == [10]
            for r in records:
                if r["type"] != "session" and r["step"] > 12:
                    log.write(r)
        finally:
            log.close()
        p.wait_for_selector('#training-stats[data-finished="1"]', timeout=10_000)
        assert chart_points(p, "train") == [(r["step"], r["loss"]) for r in records if r["type"] == "step"]
        assert p.evaluate("() => window.tkNotReloaded") is True
        assert [u for u in p.tk_requests if not u.startswith(base)] == [] and p.tk_errors == []
        shot(p, "training-live")
        p.context.close()
    finally:
        live.stop()


# ----------------------------------------------------------------------------- model


def test_model_blocks_add_up_and_link_to_their_views(page, srv, files):
    p = page(view="model")
    blocks = attrs(p, ".block", "name", "parameters", "layer", "view")
    model, _ = load_model_and_tokenizer(files["run"])
    assert sum(int(b[1]) for b in blocks) == sum(x.size for x in model.params.values())
    assert [b[0] for b in blocks] == [b["name"] for b in srv.ok("/api/model")["blocks"]]
    for name, _, layer, view in blocks:
        p.click(f'.block[data-name="{name}"]')
        wait_state(p, view=view)
        p.wait_for_selector(DRAWN[view])
        if layer is not None and view == "attention":  # a layer's norm or attention: that layer's attention
            assert state(p)["layer"] == layer
        elif layer is not None:  # a layer's MLP: the lens, with that MLP's attribution bar
            assert view == "lens" and ".mlp." in name
            assert p.query_selector(f'#attr-bars .attr-bar[data-part="mlp"][data-layer="{layer}"]') is not None
        p.go_back()
        wait_state(p, view="model")
    shot(p, "model")


# ----------------------------------------------------------------------------- addresses


def test_each_view_opens_from_its_address_asking_only_its_server(page, srv):
    for view in VIEWS:
        p = page(view=view)
        assert p.get_attribute("body", "data-view") == view
        assert p.query_selector(DRAWN[view]) is not None  # drawn with no click
        assert p.get_attribute(f'#tabs a[data-view="{view}"]', "aria-current") == "page"
        shot(p, f"view-{view}")
    assert len(p.tk_requests) > 2 * len(VIEWS)  # the page's files and the answers of every view
    assert [url for url in p.tk_requests if not url.startswith(srv.base)] == []
    assert p.tk_errors == []


def test_an_empty_text_stays_empty(page):
    p = page()
    p.fill("#text", "")
    wait_state(p, text="")
    assert "text=" in p.url and p.locator(".chip").count() == 0
    assert p.text_content('.panel[data-role="main"] .chips') == "no tokens: the text is empty"
    for view in ("bpe", "attention", "next"):  # each says what to do, and asks nothing of a text
        p.click(f'#tabs a[data-view="{view}"]')
        wait_state(p, view=view, text="")
        assert p.locator("#view .error").count() == 0 and "Type some text" in p.text_content("#view")
    p.reload()
    wait_drawn(p)
    assert p.input_value("#text") == "" and state(p)["text"] == ""


def test_an_address_opens_what_it_names(page, srv):
    text = "Once upon a time there was"
    p = page(view="attention", text=text, layer=1, head=1, query=2)
    assert p.locator('.thumb.selected[data-layer="1"][data-head="1"]').count() == 1
    assert p.get_attribute(".qlabel.selected", "data-q") == "2"
    assert {row for (row,) in attrs(p, '#arith [data-key="h.1.attn.q"]', "row")} == {"2"}
    for name in ("chai", "one-layer"):
        p = page(view="examples", example=name)
        assert p.get_attribute(".example-link.active", "data-example") == name
        assert p.text_content("#view h2") == srv.ok("/api/example", name=name)["title"]


def test_back_and_forward_restore_the_views(page):
    p = page(text="the cat")
    for view in ("bpe", "model", "attention"):
        p.click(f'#tabs a[data-view="{view}"]')
        wait_state(p, view=view)
    for view in ("model", "bpe", "tokens"):
        p.go_back()
        wait_state(p, view=view, text="the cat")
        p.wait_for_selector(DRAWN[view])
    p.go_forward()
    wait_state(p, view="bpe", text="the cat")
    assert p.locator("#bpe-seq .chip").count() > 0


# ----------------------------------------------------------------------------- errors


def test_a_text_longer_than_the_context_is_cut_and_said_once_in_each_view(page, srv):
    long = "Once upon a time, there was a little cat. " * 4  # over the model's 32 tokens: its last 32 are read
    ids = srv.ok("/api/tokens", text=long)["ids"]
    said = f"context of 32 tokens: the model reads its last 32, and the first {len(ids) - 32} are left out"
    for view, shown in (("attention", ".thumb"), ("lens", ".lens-pos"), ("next", "#next-bars .bar")):
        p = page(view=view, text=long)
        assert p.locator("#cut-note").count() == 1 and said in p.text_content("#cut-note"), view
        assert p.locator(shown).count() > 0, view
        if view == "lens":
            assert p.locator(".lens-pos").count() == 32
    assert "After these 32 tokens" in p.text_content("#next-card")
    p = page(view="tokens", text=long)  # the tokenizer's views read the whole text: nothing was cut
    assert p.locator("#cut-note").count() == 0 and len(ids) > 32
    assert p.locator('.panel[data-role="main"] .chip').count() == len(ids)


def test_a_text_the_view_cannot_take_is_one_line_in_the_page(page, srv):
    p = page(view="attention", text="a <|endoftext|> b", query=0, allowed_errors=[FAILED_400])
    error = p.text_content("#view .error")
    assert "specials=allow" in error and "\n" not in error and "Traceback" not in error
    assert p.locator("#tabs a").count() == len(VIEWS)  # the page itself stands
    shot(p, "attention-error")
    p.fill("#text", "Once upon")  # and a shorter text draws
    wait_state(p, text="Once upon", view="attention")
    assert p.locator(".heatmap .cell").count() > 0 and p.locator("#view .error").count() == 0
    # a request this page deliberately failed is the only console error it logged
    assert set(p.tk_errors) <= {FAILED_400} and p.tk_errors
