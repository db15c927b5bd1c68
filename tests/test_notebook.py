"""`tokenkit.show`: `tk serve`'s page for one text inline in a notebook, as an <iframe> holding the
whole self-contained page; and docs/notebook.ipynb, executed in a kernel of this interpreter
(nbclient), its outputs drawn in headless Chromium with the network cut.

The frames are checked for what a notebook needs: the srcdoc is the page itself, nothing is loaded
from outside, the tabs switch and come back (a srcdoc frame's address cannot be rewritten:
cli/page/core.js keeps the page's state in memory there), several frames on one page each show
their own text, and their numbers are the Python API's (the ids `Tokenizer.encode` gives, the weights of
the model's own forward trace). The notebook is executed once for the module; the browser tests
skip without Playwright or a Chromium (tests/browser.py), the notebook's without nbclient,
nbformat or ipykernel (the `test` extra). Screenshots go to build/page-shots/.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from browser import shot, wait_drawn, watched
from conftest import random_model

import tokenkit
from tokenkit.bpe import Tokenizer
from tokenkit.cli import notebook, page_file
from tokenkit.common import FileError
from tokenkit.pipeline import PipelineError, views
from tokenkit.transformer import GPT, GPTConfig

pytestmark = pytest.mark.slow  # a browser and a notebook kernel

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "docs" / "notebook.ipynb"
TEXT = 'Once upon a time </iframe><script>alert(1)</script> "a" &amp; cat'
OTHER = "The dog sat."
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    corpus = (REPO / "corpora" / "tiny_tales.txt").read_bytes()[:20_000]
    return Tokenizer.train([corpus], vocab_size=300, special_tokens=[EOT], quiet=True)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, tok) -> Path:
    path = tmp_path_factory.mktemp("show") / "model.safetensors"
    random_model(path, tok)
    return path


@pytest.fixture(scope="module")
def model_shown(model_file, tok) -> notebook.Shown:
    """A model file's page (made once: every view's answers take a second or two)."""
    return tokenkit.show(str(model_file), OTHER, view="next", layer=1, head=3, specials="allow", tokenizer=tok)


def tk_data(shown: notebook.Shown) -> dict:
    start = shown.html.index("window.TK_DATA = ") + len("window.TK_DATA = ")
    return json.loads(shown.html[start : shown.html.index(";</script>", start)])


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.data: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data) -> None:
        self.data.append(data)


# ----------------------------------------------------------------------------- the object


def test_the_frame_holds_the_whole_page_as_data(tok):
    shown = tokenkit.show(tok, TEXT)
    parser = _Tags()
    parser.feed(shown._repr_html_())
    parser.close()
    ((tag, attrs),) = parser.tags  # one element: the text's </iframe> and <script> did not end it
    assert tag == "iframe" and "".join(parser.data) == ""
    assert attrs["sandbox"] == "allow-scripts"  # scripts, in an opaque origin: no same-origin, no navigation
    assert attrs["srcdoc"] == shown.html  # the page itself, whole
    assert "width: 100%" in attrs["style"] and f"height: {notebook.HEIGHT}px" in attrs["style"]
    assert shown.html.startswith("<!doctype html>") and "default-src 'none'" in shown.html
    assert f"<title>tokenkit: {html.escape(TEXT[:57])}...</title>" in shown.html
    assert (shown.views, shown.view) == (["tokens", "bpe"], "tokens")


def test_the_pages_numbers_are_the_views(tok, model_file, model_shown):
    data = tk_data(tokenkit.show(tok, TEXT, view="bpe"))
    assert data["defaults"] == {"view": "bpe"} and data["fixed"] == {"text": TEXT, "specials": ""}
    tokens = data["answers"][page_file.request("/api/tokens", {"text": TEXT})]
    assert tokens == json.loads(json.dumps(views.tokens_view(tok, TEXT, name="tokenizer")))
    assert tokens["ids"] == tok.encode(TEXT)
    assert not data["errors"] and "call tokenkit.show again" in data["note"]
    data = tk_data(model_shown)  # a model file, its own tokenizer given again (the same size: accepted)
    assert data["defaults"] == {"view": "next", "layer": "1", "head": "3"} and data["fixed"]["specials"] == "allow"
    assert f"tk serve {model_file}" in data["note"] and "tk explain" not in data["note"]
    assert "training" not in model_shown.views and "lens" in model_shown.views  # a model file: no training log
    tokens = data["answers"][page_file.request("/api/tokens", {"text": OTHER, "specials": "allow"})]
    assert tokens["ids"] == tok.encode(OTHER)


def test_unknown_views_name_the_choices(tok, model_file):
    for source, view, said in [
        (tok, "nope", "unknown view 'nope'; this page's views are tokens, bpe"),
        (tok, "attention", "this page has no attention view (a model's page has it); its views are tokens, bpe"),
        (model_file, "training", "no training view (a run directory with its log.jsonl has it); its views are tokens"),
    ]:
        with pytest.raises(ValueError) as err:
            tokenkit.show(source, OTHER, view=view)
        assert said in str(err.value) and "\n" not in str(err.value)


def test_bad_arguments_are_one_clear_error(tok, model_file):
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, context_length=16, d_model=16, n_layers=1, n_heads=2))
    small = GPT(GPTConfig(vocab_size=tok.vocab_size - 1, context_length=16, d_model=16, n_layers=1, n_heads=2))
    cases = [
        (lambda: tokenkit.show(tok, "a" * (views.TEXT_CHARS + 1)), ValueError, "at most 20,000"),
        (lambda: tokenkit.show(tok, b"bytes"), TypeError, "text must be a str"),
        (lambda: tokenkit.show(tok, "a\ud800b"), ValueError, "not valid UTF-8"),
        (lambda: tokenkit.show(tok, OTHER, specials="yes"), ValueError, "specials must be one of 'refuse'"),
        (lambda: tokenkit.show(tok, OTHER, height=0), ValueError, "height must be"),
        (lambda: tokenkit.show(tok, OTHER, height=True), ValueError, "height must be"),
        (lambda: tokenkit.show(tok, f"a{EOT}b"), ValueError, 'specials="allow"'),
        (lambda: tokenkit.show(tok, OTHER, tokenizer=tok), ValueError, "with a model only"),
        (lambda: tokenkit.show(model, OTHER), ValueError, "tokenizer=tok"),
        (lambda: tokenkit.show(small, OTHER, tokenizer=tok), ValueError, "the tokenizer has 300 tokens"),
        (lambda: tokenkit.show(model, OTHER, tokenizer=tok, layer=1), ValueError, "layer must be from 0 to 0"),
        (lambda: tokenkit.show(model, OTHER, tokenizer=tok, head=-1), ValueError, "head must be from 0 to 1"),
        (lambda: tokenkit.show(42, OTHER), TypeError, "a Tokenizer, a GPT or a path"),
        (lambda: tokenkit.show(model_file.parent / "none", OTHER), PipelineError, "not found"),
    ]
    for call, kind, said in cases:
        with pytest.raises(kind) as err:
            call()
        assert said in str(err.value) and "\n" not in str(err.value), (said, str(err.value))


def test_a_tokenizer_file_is_a_tokenizers_page(tok, tmp_path):
    tok.save(tmp_path / "tok.safetensors")
    shown = tokenkit.show(tmp_path / "tok.safetensors", OTHER)
    assert (shown.views, shown.view) == (["tokens", "bpe"], "tokens")
    assert tk_data(shown)["answers"][page_file.request("/api/tokens", {"text": OTHER})]["ids"] == tok.encode(OTHER)


def test_save_replaces_a_file_whole_and_refuses_a_fifo(tok, tmp_path):
    shown = tokenkit.show(tok, OTHER)
    out = tmp_path / "page.html"
    out.write_text("an older page")
    assert shown.save(out) == out
    assert out.read_text(encoding="utf-8") == shown.html
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]  # no temp left beside it
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileError):
        shown.save(fifo)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "page.html"]


def test_import_tokenkit_stays_light_and_show_is_found():
    code = (
        "import sys, tokenkit\n"
        "assert 'show' in dir(tokenkit) and 'show' in tokenkit.__all__\n"
        "assert not [m for m in sys.modules if m.startswith(('tokenkit.cli', 'numpy'))]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert tokenkit.show is notebook.show  # imported on first use


# ----------------------------------------------------------------------------- in the browser


def open_offline(browser, path: Path):
    """`path` in a context with the network off, every request other than the file aborted and
    recorded (`page.tk_requests`), its frames drawn; the page and its frames, in document order."""
    context = browser.new_context(offline=True, viewport={"width": 1100, "height": 900})
    page = watched(context.new_page(), requests=False)

    def route(r):
        page.tk_requests.append(r.request.url)
        (r.continue_ if r.request.url == path.as_uri() else r.abort)()

    context.route("**/*", route)
    page.goto(path.as_uri())
    frames = [h.content_frame() for h in page.query_selector_all("iframe")]
    for frame in frames:
        wait_drawn(frame)
    return page, frames


def chip_ids(frame) -> list[int]:
    return frame.eval_on_selector_all(".panel .chip", "cs => cs.map(c => Number(c.dataset.id))")


def click_tab(frame, view: str) -> None:
    frame.click(f'#tabs a[data-view="{view}"]')
    frame.wait_for_selector(f'body[data-ready="1"][data-view="{view}"]', timeout=10_000)


def test_frames_on_one_page_each_show_their_own_and_their_tabs_work(tok, browser, tmp_path):  # noqa: F811
    outputs = [tokenkit.show(tok, TEXT), tokenkit.show(tok, OTHER, view="bpe", height=300)]
    out = tmp_path / "two.html"
    out.write_text("<!doctype html><meta charset=utf-8>" + "".join(s._repr_html_() for s in outputs), encoding="utf-8")
    page, (first, second) = open_offline(browser, out)
    try:
        assert chip_ids(first) == tok.encode(TEXT) and second.evaluate("document.body.dataset.view") == "bpe"
        click_tab(second, "tokens")
        assert chip_ids(second) == tok.encode(OTHER)
        click_tab(first, "bpe")
        click_tab(first, "tokens")  # back to the page's first state: the address the frame keeps is bare again
        assert chip_ids(first) == tok.encode(TEXT) and chip_ids(second) == tok.encode(OTHER)
        assert first.evaluate("document.getElementById('text').value") == TEXT
        sandboxed = "() => { try { return String(parent.document.title); } catch (e) { return 'blocked'; } }"
        assert first.evaluate(sandboxed) == "blocked" and first.evaluate("window.origin") == "null"
        assert page.tk_errors == [] and page.tk_requests == [out.as_uri()]  # the frames asked for nothing
    finally:
        page.context.close()


# ----------------------------------------------------------------------------- docs/notebook.ipynb

KERNEL = "tokenkit-test-python"  # this interpreter's ipykernel

# Run after the notebook's cells, in its kernel: what the Python API says of its objects.
CHECK = """\
import json as _json
_trace = {}
model.forward(np.array([tok.encode(story)]), trace=_trace)
print(_json.dumps({"text": tok.encode(text), "story": tok.encode(story),
                   "weights": _trace["h.1.attn.weights"][0, 1].tolist()}))
"""


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> dict:
    """docs/notebook.ipynb executed in a kernel of this interpreter, with CHECK after it:
    its outputs' HTML in one page (as a notebook shows them), and CHECK's numbers."""
    nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' to run the notebook")
    nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' to run the notebook")
    pytest.importorskip("ipykernel", reason="pip install -e '.[test]' to run the notebook")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells)  # kept without outputs: small, and each run fresh
    nb.cells.append(nbformat.v4.new_code_cell(CHECK))
    # A kernel spec of its own, first on JUPYTER_PATH: a "python3" the user installed may be another Python's.
    kernels = tmp_path_factory.mktemp("jupyter")
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], "language": "python"}
    (kernels / "kernels" / KERNEL).mkdir(parents=True)
    (kernels / "kernels" / KERNEL / "kernel.json").write_text(json.dumps({**spec, "display_name": KERNEL}))
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name=KERNEL, resources={"metadata": {"path": str(REPO / "docs")}}
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(kernels), os.environ.get("JUPYTER_PATH")])))
        client.execute()
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    frames = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    out = tmp_path_factory.mktemp("notebook") / "notebook.html"
    out.write_text("<!doctype html><meta charset=utf-8><body>" + "".join(frames) + "</body>", encoding="utf-8")
    return {"page": out, "frames": frames, "check": json.loads(outputs[-1]["text"])}


def test_the_notebooks_outputs_show_its_objects_numbers(executed, browser):  # noqa: F811
    check = executed["check"]
    assert len(executed["frames"]) == 2
    page, (tokens, attention) = open_offline(browser, executed["page"])
    try:
        assert chip_ids(tokens) == check["text"]
        assert attention.evaluate("document.body.dataset.view") == "attention"
        assert attention.eval_on_selector(".thumb.selected", "b => [b.dataset.layer, b.dataset.head]") == ["1", "1"]
        cells = attention.eval_on_selector_all(
            ".heatmap .cell", "cs => cs.map(c => [+c.dataset.q, +c.dataset.k, +c.dataset.w])"
        )
        weights = np.array(check["weights"])
        assert len(cells) == weights.size and weights.shape == (len(check["story"]),) * 2
        shown = np.zeros_like(weights)
        for q, k, w in cells:
            shown[q, k] = w
        np.testing.assert_allclose(shown, weights, rtol=0, atol=1e-6)
        assert (
            np.abs(weights - np.tril(np.full_like(weights, 1.0)) / np.arange(1, len(weights) + 1)[:, None]).max() > 0.05
        )
        page.set_viewport_size({"width": 1100, "height": 1400})
        shot(page, "notebook")
        click_tab(attention, "tokens")
        assert chip_ids(attention) == check["story"]
        assert page.tk_errors == [] and page.tk_requests == [executed["page"].as_uri()]
    finally:
        page.context.close()
