"""Ablation on `tk serve`'s page: /api/next?ablate=SPEC is `tk predict-next --ablate SPEC --json`
and /api/generate?ablate=SPEC `tk generate --ablate SPEC`, a bad SPEC is a one-line 400, and in a
real browser (the system's Chromium through Playwright) a click on a head's thumbnail or an MLP's
block knocks it out, the card shows the next token before and after with the KL divergence, and
the address carries the ablation. Screenshots go to build/page-shots/.

One server (tests/test_serve.py's small run: 2 layers, 2 heads, context 32) serves the module, and
one browser page walks through the views; without Playwright or a Chromium that test skips
(tests/browser.py).
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from browser import open_page, shot
from test_serve import Running, train_files

from tokenkit.cli import serve, serve_api
from tokenkit.cli.main import main

TEXT = "Once upon a time, there was a little cat."
FAILED_400 = "Failed to load resource: the server responded with a status of 400 (Bad Request)"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return train_files(tmp_path_factory.mktemp("page_ablation"))


@pytest.fixture(scope="module")
def srv(files):
    with Running(serve.make_server(files["run"], port=0)) as running:
        yield running


def tk(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(args)) == 0
    return out.getvalue()


def predict_json(files, spec: str, text: str = TEXT) -> dict:
    return json.loads(tk("predict-next", "-m", str(files["run"]), text, "--ablate", spec, "--json"))


# ----------------------------------------------------------------------------- the API


@pytest.mark.parametrize("spec", ["1.1", "0.mlp", "0.mlp,1.0,1.1", "1.1, 0.0"])
def test_next_with_ablate_is_predict_next_ablate_json(srv, files, spec):
    doc = srv.ok("/api/next", text=TEXT, ablate=spec)
    assert doc == predict_json(files, spec)  # the same function, the same floats
    assert doc["ablation"]["parts"] == [part.strip() for part in spec.split(",")] and doc["ablation"]["mode"] == "zero"
    assert doc["kl"] > 0 and doc["top"] != srv.ok("/api/next", text=TEXT)["top"]
    plain = {row["id"]: row["p"] for row in srv.ok("/api/next", text=TEXT, top_k=100)["top"]}
    for row in doc["top"]:  # each ablated row carries its unablated probability, the plain /api/next's
        assert row["before"] == pytest.approx(plain[row["id"]], abs=1e-6)
    assert [row["id"] for row in doc["before"]] == list(plain)[:10]


def test_generate_with_ablate_is_tk_generate_ablate(srv, files):
    printed = tk("generate", "-m", str(files["run"]), TEXT, "-n", "8", "--seed", "3", "--ablate", "1.1,0.mlp")
    doc = srv.ok("/api/generate", text=TEXT, n=8, seed=3, ablate="1.1,0.mlp")
    assert printed.rstrip("\n") == TEXT + doc["text"]
    plain = srv.ok("/api/generate", text=TEXT, n=8, seed=3)  # the model's own odds at the first step differ
    assert doc["steps"][0]["top"] != plain["steps"][0]["top"]


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("1.2", "head 2 does not exist; each layer has 2 heads, 0..1"),
        ("2.0", "layer 2 does not exist; the model has 2, 0..1"),
        ("9.mlp", "layer 9 does not exist"),
        ("", "the ablation SPEC is empty"),
        (" , ", "the ablation SPEC is empty"),
        ("1.1,,0.0", "has an empty part"),
        ("1.x", "is not L.H (a head) or L.mlp (an MLP)"),
        ("1.1,1.1", "is named twice"),
        ("-1.0", "is not L.H"),
        ("1.١", "is not L.H"),  # an Arabic-Indic digit is no number here
        ("x" * (serve_api.ABLATE_CHARS + 1), f"at most {serve_api.ABLATE_CHARS:,}"),
        ("," * serve_api.ABLATE_PARTS, f"at most {serve_api.ABLATE_PARTS:,}"),
    ],
)
@pytest.mark.parametrize("path", ["/api/next", "/api/generate"])
def test_a_bad_spec_is_a_one_line_400(srv, path, spec, said):
    assert said in srv.refused(path, text=TEXT, ablate=spec)


def test_a_part_the_model_lacks_is_said_before_the_text_is_read(srv):
    # even for a text longer than the model's context: the SPEC is checked first, nothing is encoded
    assert "head 5 does not exist" in srv.refused("/api/next", text="x" * 5000, ablate="0.5")


def test_ablate_given_twice_is_refused(srv):
    status, _, body = srv.request("/api/next?text=a&ablate=0.1&ablate=0.0")
    assert status == 400 and json.loads(body) == {"error": "parameter ablate is given twice"}


# ----------------------------------------------------------------------------- the page


def numbers(p, selector: str, keys: tuple[str, ...]) -> list[tuple]:
    rows = p.eval_on_selector_all(selector, f"rs => rs.map(r => [{', '.join(f'r.dataset.{k}' for k in keys)}])")
    return [(int(r[0]), *map(float, r[1:])) for r in rows]


def wait_ablate(p, spec: str) -> None:
    p.wait_for_function(
        "spec => new URLSearchParams(location.search).get('ablate') === spec && document.body.dataset.ready === '1'",
        arg=spec,
    )


def check_card(p, files, spec: str) -> None:
    """The card's bars, KL and moved tokens are `tk predict-next --ablate SPEC --json`'s."""
    want = predict_json(files, spec)
    assert float(p.get_attribute("#abl-kl", "data-kl")) == want["kl"]
    rows = numbers(p, "#abl-bars .abl-row", ("id", "p", "before"))
    assert rows == [(r["id"], r["p"], r["before"]) for r in want["top"]]
    moved = numbers(p, "#abl-moved tr", ("id", "before", "after"))
    assert moved == [(r["id"], r["before"], r["after"]) for r in want["moved"][: len(moved)]] and len(moved) == 5
    assert p.eval_on_selector_all("#abl-parts .abl-part", "bs => bs.map(b => b.dataset.part)") == spec.split(",")


def no_overflow(p) -> None:
    """Nothing of the view is wider than the window (a card or a bar pushed past it)."""
    assert p.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.slow  # a browser, as tests/conftest.py's SLOW_MODULES; the API tests above stay in the quick loop
def test_clicks_knock_parts_out_and_the_address_carries_them(browser, srv, files):
    p = open_page(browser, srv.base + "?view=attention&text=" + TEXT.replace(" ", "+"))
    p.set_default_timeout(15_000)
    try:
        # 1. the Attention view: with the switch on, a thumbnail is knocked out rather than shown large
        assert p.locator("#abl-card").count() == 0
        p.check("#ablate-switch")
        p.wait_for_selector("#abl-card")  # its place, kept while the switch is on
        p.click('.thumb[data-layer="1"][data-head="1"]')
        wait_ablate(p, "1.1")
        check_card(p, files, "1.1")
        assert p.eval_on_selector_all(".thumb.knocked", "bs => bs.map(b => [b.dataset.layer, b.dataset.head])") == [
            ["1", "1"]
        ]
        assert p.eval_on_selector(".thumb.selected", "b => [b.dataset.layer, b.dataset.head]") == ["0", "0"]
        no_overflow(p)
        shot(p, "ablation-attention")

        # 2. the Model view: the switch stays on; a click on block 0's MLP knocks it out beside the head
        p.click('#tabs a[data-view="model"]')
        p.wait_for_selector('body[data-view="model"][data-ready="1"]')
        p.click('button.block[data-name="h.0.mlp.c_fc"]')
        wait_ablate(p, "0.mlp,1.1")
        check_card(p, files, "0.mlp,1.1")
        names = p.eval_on_selector_all(".block.knocked", "bs => bs.map(b => b.dataset.name)")
        assert names == ["h.0.mlp.c_fc", "h.0.mlp.c_proj"]
        assert p.inner_text('.block[data-name="h.1.attn.c_attn"] .block-knocked') == "head 1 knocked out"
        assert p.locator(".block-knocked").count() == 1  # the one layer with a head out
        no_overflow(p)
        shot(p, "ablation-model")

        # 3. the deep link: a reload (the switch off again) draws the same ablation
        p.reload()
        p.wait_for_selector('body[data-ready="1"]')
        check_card(p, files, "0.mlp,1.1")
        assert p.locator("a.block.knocked").count() == 2  # links again, still crossed out

        # 4. the Next token view: the plain bars, then the ablated card; generation ablated too
        p.click('#tabs a[data-view="next"]')
        p.wait_for_selector('body[data-view="next"][data-ready="1"]')
        check_card(p, files, "0.mlp,1.1")
        gen = srv.ok("/api/generate", text=TEXT, n=20, seed=0, show=10, ablate="0.mlp,1.1")
        drawn = p.eval_on_selector_all(".gen-token", "cs => cs.map(c => +c.dataset.id)")
        assert drawn == [s["id"] for s in gen["steps"]]
        no_overflow(p)
        shot(p, "ablation-next")

        # 5. a chip puts its part back; then a bad deep link is one line in the card, the view drawn
        p.click('#abl-parts .abl-part[data-part="1.1"]')
        wait_ablate(p, "0.mlp")
        check_card(p, files, "0.mlp")
        p.goto(srv.base + "?view=attention&ablate=1.7&text=" + TEXT.replace(" ", "+"))
        p.wait_for_selector('body[data-ready="1"]')
        assert p.inner_text("#abl-error") == "ablation part 1.7: head 7 does not exist; each layer has 2 heads, 0..1"
        assert p.locator(".thumb").count() == 4
        assert [e for e in p.tk_errors if e != FAILED_400] == []
        assert [url for url in p.tk_requests if not url.startswith(srv.base)] == []
    finally:
        p.context.close()
