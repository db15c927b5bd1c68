"""`tk explain ... --html FILE`: `tk serve`'s page for one text, as one self-contained HTML file.

`model_page` asks every request the page's views make for one text of one model, and
`example_page` those of the worked examples; both ask `cli.serve_api.answer`, the server's own
code, so the file's numbers are the server's (and the commands' `--json`), and a request the
server would refuse is the same one-line error in the file. `page_html` puts the page's files
(cli/page/: CSS in <style>, the scripts in index.html's order, the favicon as a data: URI) and
the answers (`window.TK_DATA`, before core.js) into one HTML document that needs no server and
no network; a Content-Security-Policy in it allows its own inline scripts and styles, each by its
hash, and data: images, and nothing else (no load, no other script). The user's text is data in
it (JSON in a script, escaped in the title), never markup.

The requests, keyed as cli/page/core.js's `request` keys them (empty parameters left out, the
others sorted by name, the query form-encoded as URLSearchParams writes it), as the views ask
them (grep `TK.api` and `ask(` in cli/page/*.js):

    core.js       /api/info
    tokens.js     /api/tokens     text, specials     (/api/compare only under tk serve -c)
    bpe.js        /api/bpe        text, specials
    attention.js  /api/attention  text, layer, head, specials   (not when the text's thumbnails are its weights)
                  /api/thumbnails text, specials
                  /api/explain    text, layer, head, query, specials   (once a query is chosen; the file holds
                                  whole explanations, and core.js answers any query from one)
    lens.js       /api/lens       text, specials
                  /api/attribution text, position, specials   (position: the one clicked, else the last)
    next.js       /api/next       text, top_k=10, specials
                  /api/generate   text, n, temperature, top_k, top_p, seed, show=10, specials
                                  (the page's defaults: n 20, temperature 1, seed 0; top_k, top_p empty)
    training.js   /api/training
    model.js      /api/model
    examples.js   /api/example    name

`specials` is empty (left out) for the default policy, refuse. The file holds /api/thumbnails, and
/api/attention for every layer and head while they keep the file under ALL_HEADS_BYTES, but none
for a text of at most views.THUMBNAIL_CELLS tokens, whose thumbnails are its heads' weights (the
page draws each head from them); /api/explain for every layer and head when there are at most
ALL_HEADS_COMBOS and they keep it under that too; else each for the --layer/--head given only.
/api/lens, and /api/attribution for every position while they keep the file under ALL_HEADS_BYTES
(else for the last position only). /api/generate: the default settings only. A part that several
answers hold (the tokens, the embeddings each head's arithmetic shows) is stored once
(`TK_DATA.shared`, referenced as {"$ref": n}).

What it deliberately does not do: compute a view (pipeline/views.py does, through
cli/serve_api.py), or write the file (cli/explain_commands.py does, atomically).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import shlex
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenkit import __version__
from tokenkit.bpe import DisallowedSpecialError, TokenizerError
from tokenkit.cli import serve_api
from tokenkit.cli.serve import PAGE_DIR
from tokenkit.common.messages import one_line
from tokenkit.pipeline import PipelineError, checkpoint, views
from tokenkit.pipeline.live import Loaded, TrainingLog
from tokenkit.transformer import ModelError
from tokenkit.transformer.explain_examples import EXAMPLES

MAX_BYTES = 50_000_000  # a page file at most (one a teacher can send); above, tk explain refuses
ALL_HEADS_COMBOS = 64  # layers x heads up to which the file may hold every head's arithmetic
ALL_HEADS_BYTES = 16_000_000  # ... when the file stays this small with them
SHARE_MIN = 512  # a part (JSON characters) that several answers hold is stored once above this
SHARE_DEPTH = 3  # levels below an answer searched for such parts

# The page's defaults the views send (cli/page/core.js DEFAULTS, next.js SHOW).
NEXT_SHOWN = 10
GENERATE = {"n": 20, "temperature": 1, "seed": 0, "show": NEXT_SHOWN}

_ERRORS = (serve_api.Refused, TokenizerError, ModelError, PipelineError)
_FORM_SAFE = frozenset(b"*-._0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_DATA_SLOT = "<!-- TK_DATA: tk explain --html puts the page's answers here -->"
_CSS = re.compile(r'<link rel="stylesheet" href="([A-Za-z0-9_.-]+\.css)">')
_SCRIPT = re.compile(r'<script src="([A-Za-z0-9_.-]+\.js)"></script>')
_ICON = re.compile(r'<link rel="icon" href="([A-Za-z0-9_.-]+\.svg)" type="image/svg\+xml">')
_REFERENCE = re.compile(r"""\b(?:src|href)\s*=\s*(?!["']?(?:data:|#))""", re.IGNORECASE)
_TITLE = "<title>tokenkit</title>"
_CHARSET = '<meta charset="utf-8">'


def form(value: str) -> str:
    """`value` form-encoded as the browser's URLSearchParams writes it: UTF-8, a space as +,
    letters, digits and * - . _ as they are, every other byte as %XX.

    >>> form("Once upon a time, 50% ~ ü")
    'Once+upon+a+time%2C+50%25+%7E+%C3%BC'
    """
    out = []
    for byte in value.encode("utf-8"):
        out.append("+" if byte == 0x20 else chr(byte) if byte in _FORM_SAFE else f"%{byte:02X}")
    return "".join(out)


def request(path: str, params: dict[str, Any]) -> str:
    """The key of a request, as core.js's `request` makes it: empty parameters left out (an empty
    text is kept: it is a text), the others sorted by name.

    >>> request("/api/explain", {"text": "a b", "layer": 1, "head": 0, "specials": ""})
    '/api/explain?head=0&layer=1&text=a+b'
    """
    kept = sorted((k, str(v)) for k, v in params.items() if v is not None and (v != "" or k == "text"))
    return path + ("?" + "&".join(f"{form(k)}={form(v)}" for k, v in kept) if kept else "")


@dataclass
class Page:
    """What a page file holds: the answers by request (or the one-line error the server would
    give), the page's first view and settings, what it holds fixed (its text), and what it says
    when asked for more than it holds (`missing`, by endpoint; `note` otherwise)."""

    title: str
    note: str
    defaults: dict[str, str]
    fixed: dict[str, str] = field(default_factory=dict)
    answers: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    views: list[str] = field(default_factory=list)  # the views it holds: their tabs are on

    def ask(self, held: serve_api.Holdings, path: str, params: dict[str, Any] | None = None) -> Any:
        """The answer of one request (kept under its key), or None when the server would refuse it."""
        key = request(path, params or {})
        try:
            self.answers[key] = serve_api.answer(held, path, key.partition("?")[2])
        except DisallowedSpecialError as err:
            self.errors[key] = one_line(err.advise("--allow-special", "--specials-as-text"))
        except _ERRORS as err:
            self.errors[key] = one_line(err)
        return self.answers.get(key)


class _Loaded:
    """A model loaded once, in `pipeline.live.LiveModel`'s place: the file holds it as it was."""

    def __init__(self, loaded: Loaded, path: Path) -> None:
        self.path, self.error, self._loaded = path, None, loaded

    def get(self) -> Loaded:
        return self._loaded


def model_page(
    model,
    tokenizer,
    text: str,
    *,
    name: str,
    path: Path,
    layer: int,
    head: int,
    specials: str,
    view: str,
) -> Page:
    """The page of `text` for `model` (loaded from `path`, shown as `name`): every view's answers,
    /api/explain for every layer and head when that stays small (else for `layer`, `head`), the
    run's training when `path` is a run directory with a log. `specials`: the policy's name in
    views.SPECIALS; `view`: the view the file opens in."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PipelineError("the text is not valid UTF-8; a --html page holds Unicode text only") from None
    serve = f"tk serve {shlex.quote(name)}"
    policy = "" if specials == "refuse" else specials
    held = serve_api.Holdings(tokenizer=tokenizer, tokenizer_name=name, model_name=name)
    held.live = _Loaded(Loaded(model, tokenizer, {}), path)  # type: ignore[assignment]
    log = Path(path) / checkpoint.LOG_FILE
    if Path(path).is_dir() and log.is_file():
        held.run_dir, held.training = Path(path), TrainingLog(log)
    page = Page(
        title=f"tokenkit: {text if len(text) <= 60 else text[:57] + '...'}",
        note=f"This file holds one text, as tk explain --html wrote it; run `{serve}` to explore others.",
        defaults={"view": view, "layer": str(layer), "head": str(head)},
        fixed={"text": text, "specials": policy},
    )
    if held.run_dir is not None:
        page.ask(held, "/api/training")
    _info(page, held, model_views(path))
    for path_ in ("/api/tokens", "/api/bpe"):
        page.ask(held, path_, {"text": text, "specials": policy})
    page.ask(held, "/api/next", {"text": text, "top_k": NEXT_SHOWN, "specials": policy})
    page.ask(held, "/api/generate", {"text": text, **GENERATE, "specials": policy})
    page.missing["/api/generate"] = (
        f"This file holds the generation of the default settings ({GENERATE['n']} new tokens, temperature "
        f"{GENERATE['temperature']}, seed {GENERATE['seed']}, no top-k or top-p cut); run `{serve}` to try others."
    )
    page.ask(held, "/api/model")
    _examples(page, held)
    _lens(page, held, {"text": text, "specials": policy}, serve)
    heads = [(i, h) for i in range(model.config.n_layers) for h in range(model.config.n_heads)]
    shown = f"layer {layer}, head {head} only (tk explain --layer {layer} --head {head})"
    shown += f"; run `{serve}` for the other heads'."
    if not _attentions(page, held, {"text": text, "specials": policy}, (layer, head), heads):
        page.missing["/api/attention"] = f"This file holds the attention weights of {shown}"
    if len(heads) > ALL_HEADS_COMBOS:
        heads = [(layer, head)]
    if not _every_head(page, held, "/api/explain", {"text": text, "specials": policy}, (layer, head), heads):
        page.missing["/api/explain"] = f"This file holds the worked arithmetic of {shown}"
    return page


def model_views(path: Path) -> list[str]:
    """The views a model's page holds: all, training only for a run directory with its log."""
    run = Path(path).is_dir() and (Path(path) / checkpoint.LOG_FILE).is_file()
    return [v for v in views.VIEWS if run or v != "training"]


EXAMPLE_VIEWS = ["examples"]  # the views a worked example's page holds


def _attentions(page: Page, held, params: dict[str, Any], first: tuple[int, int], heads: list[tuple[int, int]]) -> bool:
    """/api/thumbnails, and /api/attention for head `first`, then for every head while the file
    stays under ALL_HEADS_BYTES; when the text's thumbnails are its heads' whole weights (at most
    views.THUMBNAIL_CELLS tokens) no head's, as the page draws each from them. Whether it holds
    every head's weights."""
    first_params = {**params, "layer": first[0], "head": first[1]}
    answer = page.ask(held, "/api/attention", first_params)  # first: its forward pass pools the thumbnails
    thumbnails = page.ask(held, "/api/thumbnails", params)
    if answer is None or thumbnails is None:  # every head's request is refused as this one
        refused = ("/api/attention", first_params) if answer is None else ("/api/thumbnails", params)
        page.missing["/api/attention"] = page.errors[request(*refused)]
        return True
    if thumbnails["thumbnail_edges"] == list(range(len(thumbnails["tokens"]) + 1)):
        del page.answers[request("/api/attention", first_params)]  # the thumbnails hold it
        return True
    if len(_dump(answer["weights"])) * len(heads) > ALL_HEADS_BYTES:  # each head's weights as large
        return False
    return _every_head(page, held, "/api/attention", params, first, heads)


def _every_head(
    page: Page, held, path: str, params: dict[str, Any], first: tuple[int, int], heads: list[tuple[int, int]]
) -> bool:
    """`path` for head `first`, then for each of `heads` while the file stays under
    ALL_HEADS_BYTES; whether it holds them all (else only `first`)."""

    def ask(lh: tuple[int, int]) -> str:
        page.ask(held, path, {**params, "layer": lh[0], "head": lh[1]})
        return request(path, {**params, "layer": lh[0], "head": lh[1]})

    ask(first)
    size = _Estimate()
    for answer in page.answers.values():
        size.add(answer)
    added = []
    for lh in heads:
        if lh != first:
            added.append(ask(lh))
            if size.add(page.answers.get(added[-1])) > ALL_HEADS_BYTES:
                for key in added:
                    page.answers.pop(key, None)
                    page.errors.pop(key, None)
                return False
    return True


def _lens(page: Page, held, params: dict[str, Any], serve: str) -> None:
    """/api/lens, and /api/attribution at the last position, then at every other while the file
    stays under ALL_HEADS_BYTES (else it says in one line that it holds the last one only)."""
    found = page.ask(held, "/api/lens", params)
    if found is None:
        return  # refused: the page shows the lens's one-line error, and asks no attribution
    last = len(found["tokens"]) - 1
    size = _Estimate()
    for answer in page.answers.values():
        size.add(answer)
    asked = []
    for position in [last, *range(last)]:
        asked.append(request("/api/attribution", {**params, "position": position}))
        page.ask(held, "/api/attribution", {**params, "position": position})
        if size.add(page.answers.get(asked[-1])) > ALL_HEADS_BYTES and position != last:
            for key in asked[1:]:
                page.answers.pop(key, None)
                page.errors.pop(key, None)
            page.missing["/api/attribution"] = (
                f"This file holds the attribution at the last position ({last}) only; run `{serve}` for the others."
            )
            return


def example_page(name: str, view: str = "examples") -> Page:
    """The page of the worked examples, opening at `name`."""
    held = serve_api.Holdings()
    page = Page(
        title=f"tokenkit: the worked example {name}",
        note="This file holds the worked examples of tk explain --example; "
        "run `tk serve RUN_DIR` to watch a model work on any text.",
        defaults={"view": view, "example": name},
    )
    _info(page, held, EXAMPLE_VIEWS)
    _examples(page, held)
    return page


def _info(page: Page, held, shown: list[str]) -> None:
    page.views = [v for v in views.VIEWS if v in shown]
    page.ask(held, "/api/info")["views"] = page.views  # the tabs of the views the file holds


def _examples(page: Page, held) -> None:
    for example in EXAMPLES:
        page.ask(held, "/api/example", {"name": example})


# ----------------------------------------------------------------------------- the answers' JSON


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _branches(value: Any) -> bool:
    """Whether `value` holds dicts or lists to look into (a list of numbers is one part)."""
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and bool(value) and isinstance(value[0], (dict, list))


def _walk(value: Any, depth: int, visit: Callable[[Any, int], bool]) -> None:
    """visit(part, depth) for `value`'s dicts and lists down to SHARE_DEPTH levels; a visit that
    returns False is not looked into."""
    if depth and not visit(value, depth):
        return
    if depth < SHARE_DEPTH and _branches(value):
        for child in value.values() if isinstance(value, dict) else value:
            if isinstance(child, (dict, list)):
                _walk(child, depth + 1, visit)


class _Estimate:
    """The answers' JSON size with each part that several hold counted once (about)."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.size = 0

    def add(self, answer: Any) -> int:
        parts: Iterable[Any] = []
        if isinstance(answer, dict):
            parts = [p for v in answer.values() for p in (v if isinstance(v, list) and _branches(v) else [v])]
        for part in parts:
            text = _dump(part)
            if len(text) < SHARE_MIN:
                self.size += len(text)
            elif (digest := _digest(text)) not in self.seen:
                self.seen.add(digest)
                self.size += len(text)
            else:
                self.size += 12
        return self.size


def pack(answers: dict[str, Any]) -> tuple[str, str]:
    """The answers' JSON object and the JSON list of the parts they share: each dict or list of
    at least SHARE_MIN characters that occurs more than once (within SHARE_DEPTH levels of an
    answer) is written once in the list and as {"$ref": its index} where it occurs.

    >>> big = list(range(200))
    >>> pack({"a": {"x": big, "y": 1}, "b": {"x": big}})[0]
    '{"a":{"x":{"$ref":0},"y":1},"b":{"x":{"$ref":0}}}'
    """
    counts: Counter[bytes] = Counter()

    def count(part: Any, depth: int) -> bool:
        text = _dump(part)
        if len(text) >= SHARE_MIN:
            counts[_digest(text)] += 1
        return True

    for answer in answers.values():
        _walk(answer, 0, count)
    shared: list[str] = []
    index: dict[bytes, int] = {}

    def emit(value: Any, depth: int) -> str:
        if depth and isinstance(value, (dict, list)):
            text = _dump(value)
            if len(text) >= SHARE_MIN and counts[digest := _digest(text)] > 1:
                if digest not in index:
                    index[digest] = len(shared)
                    shared.append(text)
                return f'{{"$ref":{index[digest]}}}'
            if depth >= SHARE_DEPTH or not _branches(value):
                return text
        if isinstance(value, dict):
            return "{" + ",".join(f"{_dump(k)}:{emit(v, depth + 1)}" for k, v in value.items()) + "}"
        if isinstance(value, list) and _branches(value):
            return "[" + ",".join(emit(v, depth + 1) for v in value) + "]"
        return _dump(value)

    body = "{" + ",".join(f"{_dump(k)}:{emit(v, 0)}" for k, v in answers.items()) + "}"
    return body, "[" + ",".join(shared) + "]"


def data_script(page: Page) -> str:
    """`window.TK_DATA = {...};`, safe inside a <script> element (no `<`, no U+2028/2029)."""
    answers, shared = pack(page.answers)
    rest = {
        "errors": page.errors,
        "defaults": page.defaults,
        "fixed": page.fixed,
        "missing": page.missing,
        "note": page.note,
        "written_by": f"tk explain --html (tokenkit {__version__})",
    }
    body = '{"answers":' + answers + ',"shared":' + shared + "," + _dump(rest)[1:]
    body = body.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f"window.TK_DATA = {body};"


# ----------------------------------------------------------------------------- the HTML


def _asset(name: str, root: Path) -> str:
    path = root / name
    if not path.is_file():
        raise RuntimeError(f"the page's file {name} is missing from {root}")
    return path.read_text(encoding="utf-8")


def _inline(text: str, element: str, name: str) -> str:
    """`text` as the content of an inline <element>, line ends as the browser's parser reads them
    (the CSP hashes what it reads): it must not end the element early."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lowered = text.lower()
    if f"</{element}" in lowered or "<!--" in lowered or "\x00" in text:
        raise RuntimeError(f"the page's file {name} holds </{element}, <!-- or NUL: it cannot be inlined")
    return f"\n{text}\n"


def csp(inline: list[tuple[str, str]]) -> str:
    """The file's Content-Security-Policy: its own inline elements (element, content), each by its
    SHA-256 (the content's UTF-8 bytes, in base64), data: images, and nothing else.

    >>> csp([("script", "1")]).split("; ")[:3]
    ["default-src 'none'", "script-src 'sha256-a4ayc/80/OGda4BO/1o/V0etpOqiLx1JwB5S3beHW0s='", "style-src 'none'"]
    """

    def hashes(element: str) -> str:
        found = dict.fromkeys(
            base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode("ascii")
            for kind, body in inline
            if kind == element
        )
        return " ".join(f"'sha256-{h}'" for h in found) or "'none'"

    return (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )


def page_html(page: Page, root: Path = PAGE_DIR) -> bytes:
    """The page (cli/page/index.html with every file it loads inline) holding `page`'s answers,
    under a Content-Security-Policy that allows its own inline scripts and styles only."""
    doc = _asset("index.html", root)
    for needed in (_DATA_SLOT, _TITLE, _CHARSET):
        if doc.count(needed) != 1:
            raise RuntimeError(f"cli/page/index.html does not hold {needed} once")
    inline: list[tuple[str, str]] = []  # (element, content) of each inline element, for the CSP

    def put(element: str, body: str) -> str:
        inline.append((element, body))
        return f"<{element}>{body}</{element}>"

    icon = base64.b64encode(_asset_bytes(root, _ICON, doc)).decode("ascii")
    doc = _ICON.sub(lambda m: f'<link rel="icon" href="data:image/svg+xml;base64,{icon}" type="image/svg+xml">', doc)
    doc = _CSS.sub(lambda m: put("style", _inline(_asset(m.group(1), root), "style", m.group(1))), doc)
    doc = _SCRIPT.sub(lambda m: put("script", _inline(_asset(m.group(1), root), "script", m.group(1))), doc)
    _check_markup(doc)  # tk's own markup, before the user's text goes in (escaped: data, never markup)
    data = put("script", data_script(page))  # one line, no "<" (data_script)
    doc = doc.replace(_DATA_SLOT, data, 1)
    doc = doc.replace(_TITLE, f"<title>{html.escape(page.title)}</title>", 1)
    policy = f'<meta http-equiv="Content-Security-Policy" content="{csp(inline)}">'
    doc = doc.replace(_CHARSET, f"{_CHARSET}\n{policy}", 1)  # first in <head>: before any script or style
    return doc.encode("utf-8")


def _check_markup(doc: str) -> None:
    """Refuse index.html's markup (its inline elements' contents left out) where it still refers
    to a file: a src= or href= other than data: or #, which the file would load from outside."""
    markup = re.sub(r"<(script|style)>.*?</\1>", "", doc, flags=re.DOTALL)
    left = _REFERENCE.search(markup)
    if left:
        where = markup[left.start() :][:60]
        raise RuntimeError(f"cli/page/index.html loads a file this module does not inline: {where}")


def _asset_bytes(root: Path, pattern: re.Pattern[str], doc: str) -> bytes:
    found = pattern.search(doc)
    if found is None:
        raise RuntimeError("cli/page/index.html has no favicon link")
    return (root / found.group(1)).read_bytes()
