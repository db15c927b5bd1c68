"""`tk explain ... --html FILE`: the page of `tk serve` for one text as one file that loads nothing
from outside itself, drawn in headless Chromium with the network cut, its numbers the commands'.

A small run is trained once for the module (2 layers, 2 heads: the file holds every head's
arithmetic); the page is written for a text that holds what could end its inline script early
(`</script>`, `<!--`, U+2028), and others full of HTML. The file's Content-Security-Policy allows
its own inline scripts and styles by hash: every page the browser tests open reports no violation.
The browser tests skip without Playwright or a Chromium (tests/browser.py); screenshots go to
build/page-shots/.
"""

from __future__ import annotations

import base64
import contextlib
import doctest
import hashlib
import html
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from browser import shot, wait_drawn, watched

from tokenkit.bpe import Tokenizer
from tokenkit.cli import page_file
from tokenkit.cli.main import main
from tokenkit.pipeline import views
from tokenkit.pipeline.run import load_model_and_tokenizer

REPO = Path(__file__).resolve().parents[1]
TEXT = "Once upon a time </script><!-- a cat\u2028sat. Ça va?"
SVG_NS = "http://www.w3.org/2000/svg"  # a name in the page's code (createElementNS), never loaded
EOT = "<|endoftext|>"


def tk(*argv: str) -> tuple[int, str, str]:
    """Run `tk ARGV` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """A run, its page for TEXT (--layer 1 --head 1, with --json) and the page of the chai example."""
    d = tmp_path_factory.mktemp("page_html")
    corpus = d / "corpus.txt"
    corpus.write_bytes((REPO / "corpora" / "tiny_tales.txt").read_bytes()[:30_000])
    Tokenizer.train([corpus], vocab_size=320, special_tokens=[EOT], workers=1, quiet=True).save(d / "tok.safetensors")
    run = d / "run"
    flags = ["--n-layers", "2", "--n-heads", "2", "--d-model", "32", "--context-length", "64", "--batch-size", "4"]
    flags += ["--steps", "6", "--eval-interval", "3", "--eval-batches", "1", "--quiet"]
    assert main(["train-model", str(corpus), "-t", str(d / "tok.safetensors"), "-o", str(run), *flags]) == 0
    page = d / "page.html"
    code, out, err = tk("explain", "-m", str(run), TEXT, "--layer", "1", "--head", "1", "--html", str(page), "--json")
    assert code == 0, err
    example = d / "chai.html"
    code, _, example_err = tk("explain", "--example", "chai", "--html", str(example))
    assert code == 0, example_err
    return {"dir": d, "run": run, "page": page, "doc": json.loads(out), "err": err, "example": example}


def explain_json(run: Path, layer: int, head: int) -> dict:
    code, out, err = tk("explain", "-m", str(run), TEXT, "--layer", str(layer), "--head", str(head), "--json")
    assert code == 0, err
    return json.loads(out)


def step(doc: dict, key: str) -> list:
    return next(s for s in doc["steps"] if s["key"] == key)["value"]


VIOLATIONS = """window.tkViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.tkViolations.push(e.violatedDirective));"""


@contextlib.contextmanager
def offline(browser, path: Path, query: str = ""):  # noqa: F811
    """A page of the file at `path` (+ `query`) in a context with the network off and every request
    that is not the file itself aborted; waited until drawn. It records its console errors and
    requests (`page.tk_errors`, `page.tk_requests`) and the CSP's violations (`tkViolations`, of the
    page now shown; a violation is a console error too): none, unless a test says otherwise."""
    context = browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
    context.add_init_script(VIOLATIONS)
    url = path.as_uri()
    page = watched(context.new_page(), requests=False)  # the route below records them: aborted ones too
    page.tk_violations_expected = False

    def route(r):
        page.tk_requests.append(r.request.url)
        if r.request.url.split("?")[0] == url:
            r.continue_()
        else:
            r.abort()

    context.route("**/*", route)
    page.goto(url + query)
    wait_drawn(page)
    try:
        yield page
        if not page.tk_violations_expected:
            assert page.evaluate("window.tkViolations") == []
            assert not [e for e in page.tk_errors if "Content Security Policy" in e]
    finally:
        context.close()


def goto(page, path: Path, query: str) -> None:
    page.goto(path.as_uri() + query)
    wait_drawn(page)


# ----------------------------------------------------------------------------- the file


def test_the_command_says_where_and_how_big(made):
    size = made["page"].stat().st_size
    assert made["err"] == f"page written to {made['page']} ({size / 1000:,.0f} KB)\n"
    assert made["doc"]["kind"] == "model" and made["doc"]["text"] == TEXT  # --json printed as without --html


class _References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.found += [(tag, name, value or "") for name, value in attrs if name in ("src", "href", "action")]


@pytest.mark.parametrize("which", ["page", "example"])
def test_the_file_loads_nothing_from_outside_itself(made, which):
    text = made[which].read_text(encoding="utf-8")
    parser = _References()
    parser.feed(text)
    assert parser.found, "the favicon at least"
    for tag, name, value in parser.found:
        assert value.startswith(("data:", "#")), (tag, name, value)
    assert not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/", text.replace(SVG_NS, ""), re.IGNORECASE)
    assert not re.search(r"@import|url\((?!data:)", text)
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert text.index("window.TK_DATA") < text.index("const TK = ")  # the answers before core.js
    assert text.count("</script>") == text.count("<script>")  # TEXT's </script> did not end one early


class _Inline(HTMLParser):
    """The file's inline <script> and <style> contents, and its CSP meta's content."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.inline: list[tuple[str, str]] = []
        self.policy: list[str] = []
        self.open: str | None = None
        self.tags: list[str] = []  # every start tag, in order
        self.policy_at = -1  # the CSP meta's place in them

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "meta" and (attrs.get("http-equiv") or "").lower() == "content-security-policy":
            self.policy.append(attrs["content"])
            self.policy_at = len(self.tags) - 1
        if tag in ("script", "style"):
            self.open = tag
            self.inline.append((tag, ""))

    def handle_data(self, data) -> None:
        if self.open:
            self.inline[-1] = (self.open, self.inline[-1][1] + data)

    def handle_endtag(self, tag) -> None:
        self.open = None


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def assert_policy_is_the_inline_hashes(text: str) -> None:
    """The file has one CSP, before any script or style, allowing exactly its inline elements'
    hashes, data: images, and nothing else."""
    parser = _Inline()
    parser.feed(text)
    parser.close()
    (policy,) = parser.policy
    assert 0 < parser.policy_at < min(parser.tags.index("style"), parser.tags.index("script"))
    directives = {name: set(values) for name, *values in (d.split(" ") for d in policy.split("; "))}
    assert directives == {
        "default-src": {"'none'"},
        "script-src": {sha256(c) for t, c in parser.inline if t == "script"},
        "style-src": {sha256(c) for t, c in parser.inline if t == "style"},
        "img-src": {"data:"},
        "base-uri": {"'none'"},
        "form-action": {"'none'"},
    }
    assert {t for t, _ in parser.inline} == {"script", "style"} and "unsafe" not in policy


@pytest.mark.parametrize("which", ["page", "example"])
def test_the_policy_allows_the_files_inline_elements_by_hash(made, which):
    assert_policy_is_the_inline_hashes(made[which].read_text(encoding="utf-8"))


def test_the_policy_is_in_force_in_the_browser(made, browser):  # noqa: F811
    with offline(browser, made["page"]) as page:
        assert page.evaluate("window.tkViolations") == []  # every inline script and style ran
        page.tk_violations_expected = True
        ran = page.evaluate(
            """() => { const s = document.createElement("script"); s.textContent = "window.tkRan = 1";
                       document.body.append(s); return window.tkRan === 1; }"""
        )
        page.wait_for_function("window.tkViolations.length > 0")
        assert not ran and page.evaluate("window.tkViolations") == ["script-src-elem"]
        assert [e for e in page.tk_errors if "Content Security Policy" in e]  # the console says so too
        assert page.evaluate("getComputedStyle(document.body).fontFamily") != ""
        sheets = (REPO / "cli" / "page" / "index.html").read_text(encoding="utf-8").count('rel="stylesheet"')
        assert page.evaluate("[...document.styleSheets].map(s => s.cssRules.length > 0)") == [True] * sheets


HTML_TEXTS = [  # each within the module's model's context (64 tokens)
    '<a href="http://x.example/">a</a>',
    "<img src=x onerror=alert(1)>",
    "SRC = 'http://x.example/s.js' Href=//c.example",
    "</script><script>alert(1)</script>",
    '<script src="http://x.example/s.js">',
    "<style>@import url(//x.example)</style>",
    '<base href="http://x.example/"> href=',
    'it\'s "quoted" `x` href= src=',
    '<meta http-equiv="refresh" content="0">',
    "<!-- --> <![CDATA[ ]]> &amp; &lt; &#60;",
    "</title><iframe src=//x.example>",
]


@pytest.mark.parametrize("text", HTML_TEXTS)
def test_a_text_full_of_html_is_data_in_the_file(made, browser, tmp_path, text):  # noqa: F811
    out = tmp_path / "html.html"
    code, stdout, err = tk("explain", "-m", str(made["run"]), text, "--html", str(out))
    assert code == 0 and err.startswith("page written to"), err
    written = out.read_text(encoding="utf-8")
    assert_policy_is_the_inline_hashes(written)
    parser = _References()
    parser.feed(written)
    assert all(value.startswith(("data:", "#")) for _, _, value in parser.found), parser.found
    title = text if len(text) <= 60 else text[:57] + "..."
    assert f"<title>tokenkit: {html.escape(title)}</title>" in written
    dialogs = []
    with offline(browser, out, "?view=tokens") as page:
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        goto(page, out, "?view=tokens")  # again, with the dialogs watched
        assert page.eval_on_selector("#text", "t => t.value") == text
        assert page.title() == f"tokenkit: {title}"
        assert page.evaluate("document.querySelectorAll('base, iframe, meta[http-equiv=refresh], img').length") == 0
        assert page.evaluate("document.scripts.length") == written.count("<script>")
        chips = page.eval_on_selector_all(".panel .chip", "cs => cs.map(c => c.textContent)")
        assert chips and page.tk_errors == [] and dialogs == []
        assert {u.split("?")[0] for u in page.tk_requests} == {out.as_uri()}


def test_the_pages_request_keys_are_pythons(made, browser):  # noqa: F811
    tricky = {"text": "a*b~c-d._e f+g&h=i%j/ü😀\n\t'\"<", "z": 1, "layer": "0", "specials": "", "head": 2}
    with offline(browser, made["page"]) as page:
        got = page.evaluate("(p) => TK.request('/api/explain', p)", tricky)
    assert got == page_file.request("/api/explain", tricky)


# ----------------------------------------------------------------------------- in the browser


def test_every_view_draws_offline_without_errors(made, browser):  # noqa: F811
    with offline(browser, made["page"]) as page:
        assert page.get_attribute("body", "data-view") == "attention"  # the default first view
        assert page.eval_on_selector("#text", "t => [t.readOnly, t.value]") == [True, TEXT]
        assert "tk serve" in page.inner_text("#file-note")
        held = page.evaluate("TK.info.views")
        assert held == list(views.VIEWS)  # a run directory with its log: every view
        for view in held:
            goto(page, made["page"], f"?view={view}")
            assert page.get_attribute("body", "data-view") == view
            errors = page.eval_on_selector_all("#view .error", "es => es.map(e => e.textContent)")
            assert errors == [], (view, errors)
            if view in ("attention", "next"):
                shot(page, f"page-html-{view}")
        assert page.tk_errors == []
        assert {u.split("?")[0] for u in page.tk_requests} == {made["page"].as_uri()}


def test_chips_and_cells_are_tk_explain_json_s(made, browser):  # noqa: F811
    doc = made["doc"]
    with offline(browser, made["page"], "?view=tokens") as page:
        ids = page.eval_on_selector_all(".panel .chip", "cs => cs.map(c => Number(c.dataset.id))")
        assert ids == [t["id"] for t in doc["tokens"]]
        goto(page, made["page"], "")  # attention, at --layer 1 --head 1
        assert page.eval_on_selector(".thumb.selected", "b => [b.dataset.layer, b.dataset.head]") == ["1", "1"]
        read = "cs => cs.map(c => [+c.dataset.q, +c.dataset.k, c.dataset.w])"
        cells = page.eval_on_selector_all(".heatmap .cell", read)
    weights = step(doc, "h.1.attn.weights")
    assert len(cells) == len(weights) ** 2
    for q, k, w in cells:
        assert float(w) == (weights[q][k] or 0.0), (q, k)


def test_a_deep_link_opens_its_state(made, browser):  # noqa: F811
    doc = explain_json(made["run"], 0, 1)
    with offline(browser, made["page"], "?view=attention&layer=0&head=1&query=2") as page:
        assert page.eval_on_selector(".thumb.selected", "b => [b.dataset.layer, b.dataset.head]") == ["0", "1"]
        assert page.query_selector("#arith-error") is None
        shown = page.eval_on_selector_all(
            '#arith [data-key="h.0.attn.weights"][data-row="2"][data-col]',
            "vs => vs.map(v => [+v.dataset.col, v.dataset.value])",
        )
        assert shown and page.get_attribute("#arith select", "aria-label") == "query position"
        assert page.tk_errors == []
    weights = step(doc, "h.0.attn.weights")
    for col, value in shown:
        assert float(value) == weights[2][col]


def test_what_the_file_does_not_hold_says_so_in_one_line(made, browser, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(page_file, "ALL_HEADS_BYTES", 0)  # as for a big model: --layer/--head's arithmetic only
    one = tmp_path / "one.html"
    assert tk("explain", "-m", str(made["run"]), TEXT, "--layer", "1", "--head", "0", "--html", str(one))[0] == 0
    with offline(browser, one, "?view=attention&layer=0&head=1&query=1") as page:
        assert "layer 1, head 0 only" in page.inner_text("#arith-error")
        assert page.query_selector(".heatmap .cell")  # the weights of every head are there
        goto(page, one, "?view=attention&layer=1&head=0&query=1")
        assert page.query_selector("#arith-error") is None
        assert page.tk_errors == []
    with offline(browser, made["page"], "?view=next&seed=7") as page:  # settings other than the defaults
        assert "tk serve" in page.inner_text("#gen-missing")
        page.fill("#gen-seed", "0")
        page.dispatch_event("#gen-seed", "change")
        page.wait_for_selector("#gen-tokens .gen-token")  # the default settings again: drawn
        assert page.tk_errors == []


def test_a_long_texts_file_draws_each_heads_own_weights(made, browser, tmp_path):  # noqa: F811
    text = "Once upon a time, there was a little cat who sat. " * 2  # over 48 tokens: pooled thumbnails
    out = tmp_path / "long.html"
    assert tk("explain", "-m", str(made["run"]), text, "--html", str(out))[0] == 0
    model, tok = load_model_and_tokenizer(made["run"])
    with offline(browser, out, "?view=attention&layer=0&head=1") as page:
        assert page.locator(".thumb canvas").count() == 4 and page.query_selector("#thumb-note")
        cells = page.eval_on_selector_all(
            ".heatmap .cell", "cs => cs.map(c => [+c.dataset.q, +c.dataset.k, c.dataset.w])"
        )
        assert page.tk_errors == []
    weights = views.unpack_weights(views.attention_view(model, tok, text, layer=0, head=1)["weights"])
    assert len(cells) == weights.size
    for q, k, w in cells:
        assert float(w) == weights[q, k], (q, k)


def test_the_example_file_opens_the_example(made, browser):  # noqa: F811
    doc = views.example_doc("chai")
    with offline(browser, made["example"]) as page:
        assert page.get_attribute("body", "data-view") == "examples"
        assert page.get_attribute(".example-link.active", "data-example") == "chai"
        assert page.inner_text(".view h2") == doc["title"]
        first = page.get_attribute('.example-step [data-key$="weights"][data-row="0"][data-col="0"]', "data-value")
        assert float(first) == step(doc, next(s["key"] for s in doc["steps"] if s["key"].endswith("weights")))[0][0]
        assert page.eval_on_selector_all("#tabs a:not(.off)", "as => as.map(a => a.dataset.view)") == ["examples"]
        goto(page, made["example"], "?view=examples&example=sitting")
        assert page.get_attribute(".example-link.active", "data-example") == "sitting"
        shot(page, "page-html-example")
        assert page.tk_errors == []


# ----------------------------------------------------------------------------- the command


def test_html_flags_refused_in_one_line(made, tmp_path, monkeypatch):
    run, out = str(made["run"]), tmp_path / "p.html"
    cases = [
        (["-m", run, TEXT, "--view", "next"], "--view picks the view a --html page opens in"),
        (["-m", f"{run}/model.safetensors", TEXT, "--html", str(out), "--view", "training"], "needs a run directory"),
        (["--example", "chai", "--html", str(out), "--view", "tokens"], "holds the worked examples only"),
    ]
    for argv, said in cases:
        code, _, err = tk("explain", *argv)
        assert code == 1 and said in err and err.count("\n") == 1, err
    monkeypatch.setattr(page_file, "MAX_BYTES", 100_000)
    code, stdout, err = tk("explain", "-m", run, TEXT, "--html", str(out))
    assert code == 1 and "the page would be" in err and "give a shorter text" in err and err.count("\n") == 1
    assert not out.exists() and stdout == ""  # refused before any output


def test_an_existing_file_is_replaced_whole(made, tmp_path):
    out = tmp_path / "p.html"
    out.write_text("an older page")
    code, _, err = tk("explain", "-m", str(made["run"]), "The cat", "--html", str(out), "--view", "next")
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and '"view":"next"' in text
    assert [p.name for p in tmp_path.iterdir()] == ["p.html"]  # no temp left beside it


def test_the_special_token_policy_is_the_commands(made, browser, tmp_path):  # noqa: F811
    out, text = tmp_path / "eot.html", f"The end.{EOT}Once"
    code, stdout, err = tk("explain", "-m", str(made["run"]), text, "--allow-special", "--html", str(out), "--json")
    assert code == 0, err
    written = out.read_text(encoding="utf-8")
    assert '"specials":"allow"}' in written and "?specials=allow&text=" in written  # fixed, and in the keys
    with offline(browser, out, "?view=tokens") as page:
        ids = page.eval_on_selector_all(".panel .chip", "cs => cs.map(c => Number(c.dataset.id))")
        assert page.query_selector(".panel .chip.special")
        goto(page, out, "?view=attention&query=1")
        assert page.eval_on_selector_all("#view .error", "es => es.map(e => e.textContent)") == []
        assert page.tk_errors == []
    assert ids == [t["id"] for t in json.loads(stdout)["tokens"]]


def _unpacked(value, shared):
    if isinstance(value, dict):
        if list(value) == ["$ref"]:
            return shared[value["$ref"]]
        return {k: _unpacked(v, shared) for k, v in value.items()}
    if isinstance(value, list):
        return [_unpacked(v, shared) for v in value]
    return value


def test_shared_parts_are_stored_once_and_put_back_whole(made):
    text = made["page"].read_text(encoding="utf-8")
    start = text.index("window.TK_DATA = ") + len("window.TK_DATA = ")
    data = json.loads(text[start : text.index(";</script>", start)])
    explains = [k for k in data["answers"] if k.startswith("/api/explain?")]
    attentions = [k for k in data["answers"] if k.startswith(("/api/attention?", "/api/thumbnails?"))]
    assert len(explains) == 4  # every head's arithmetic
    assert attentions == [page_file.request("/api/thumbnails", {"text": TEXT})]  # every head's weights, once
    assert data["missing"].keys() == {"/api/generate"}
    assert len(data["shared"]) > 10 and not data["errors"]
    answers = _unpacked(data["answers"], data["shared"])
    layer1_head1 = page_file.request("/api/explain", {"text": TEXT, "layer": 1, "head": 1})
    assert answers[layer1_head1] == made["doc"]  # tk explain --json's document (its --top-k is the page's 5)
    assert page_file.pack(answers)[0] == json.dumps(data["answers"], ensure_ascii=False, separators=(",", ":"))


def _data(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    start = text.index("window.TK_DATA = ") + len("window.TK_DATA = ")
    data = json.loads(text[start : text.index(";</script>", start)])
    return {**data, "answers": _unpacked(data["answers"], data["shared"])}


@pytest.mark.parametrize("long", [False, True])
def test_the_attention_answers_are_the_servers_for_every_head(made, tmp_path, monkeypatch, long):
    # a text of at most THUMBNAIL_CELLS tokens: its thumbnails, which are every head's weights, and no head's
    # answer; a longer one: its thumbnails and every head's answer while the file stays small, else
    # --layer/--head's only. Each map of weights is in the file once.
    model, tok = load_model_and_tokenizer(made["run"])
    text = "Once upon a time, there was a little cat who sat. " * 2 if long else TEXT
    assert (len(tok.encode(text)) > views.THUMBNAIL_CELLS) == long
    for budget in (page_file.ALL_HEADS_BYTES, 0):
        monkeypatch.setattr(page_file, "ALL_HEADS_BYTES", budget)
        out = tmp_path / f"{long}-{budget}.html"
        assert tk("explain", "-m", str(made["run"]), text, "--layer", "1", "--head", "0", "--html", str(out))[0] == 0
        raw = out.read_text(encoding="utf-8")
        packed = re.findall(r'"base64":"([A-Za-z0-9+/=]*)"', raw)
        assert packed and len(set(packed)) == len(packed)  # each map once
        data = _data(out)
        thumbs = data["answers"][page_file.request("/api/thumbnails", {"text": text})]
        assert thumbs == json.loads(json.dumps(views.thumbnails_view(model, tok, text)))
        held = {k: v for k, v in data["answers"].items() if k.startswith("/api/attention?")}
        every = long and budget > 0
        assert len(held) == (4 if every else 1 if long else 0)
        assert ("/api/attention" in data["missing"]) == (long and not every)
        for layer, head in ((0, 0), (0, 1), (1, 0), (1, 1)):
            key = page_file.request("/api/attention", {"text": text, "layer": layer, "head": head})
            server = json.loads(json.dumps(views.attention_view(model, tok, text, layer=layer, head=head)))
            if every or (long and (layer, head) == (1, 0)):
                assert held[key] == server, (layer, head)
            elif not long:  # the page draws the head from its thumbnail: the same map
                assert thumbs["thumbnails"][layer][head] == server["weights"]


def test_doctests():
    assert doctest.testmod(page_file).failed == 0
