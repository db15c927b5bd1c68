"""`tokenkit.show(source, text)`: `tk serve`'s page for one text, inline in a Jupyter notebook.

`show` builds the page `tk explain --html` writes (cli/page_file.py: the page's files and the
server's answers for this one text in one document, no server, no network) and returns a `Shown`,
which a notebook displays through `_repr_html_`: an <iframe> whose srcdoc is the whole page,
sandboxed (its scripts run, in an opaque origin of their own), so several outputs in one notebook
are separate documents that share no state and load nothing. `Shown.html` is the page itself;
`Shown.save(path)` writes it atomically (common/atomic.py): the file `tk explain --html` writes.

The source: a `Tokenizer` (the Tokens and BPE views); a `GPT` with its `tokenizer=` (every view a
model file's page holds); a path: a run directory (every view, Training too when it has its log),
a model file, or a tokenizer file (tk's own `.safetensors`).

In the frame, the page's address cannot change: an about:srcdoc document's URL is fixed. The
page (cli/page/core.js) then keeps its state (the view, the layer, ...) in memory, so its tabs and
links work.

What it deliberately does not do: compute a view or build the page (page_file does, through the
server's own code), start a server, or size the frame to its content (that needs a script in the
notebook's page, which a notebook may not run; the frame scrolls).
"""

from __future__ import annotations

import html
import os
import shlex
from pathlib import Path
from typing import Any

from tokenkit.bpe import DisallowedSpecialError, Tokenizer
from tokenkit.cli import page_file, serve_api
from tokenkit.common import atomic
from tokenkit.common.messages import one_line
from tokenkit.pipeline import checkpoint, views

HEIGHT = 720  # the frame's height in pixels: the page's header, text and a view's first screen
MAX_HEIGHT = 10_000
TOKENIZER_VIEWS = ["tokens", "bpe"]  # what a tokenizer's page holds
IN_MEMORY = Path(os.devnull)  # a model in memory's path: no run directory, so no Training view


class Shown:
    """One page, as a notebook shows it: `html` the whole page (a str), `_repr_html_()` the frame
    holding it, `save(path)` the file."""

    def __init__(self, page_html: str, *, views: list[str], view: str, height: int) -> None:
        self.html = page_html
        self.views = views  # the views the page holds (its tabs that are on)
        self.view = view  # the view it opens in
        self.height = height

    def _repr_html_(self) -> str:
        # sandbox: scripts run, in an opaque origin (no cookies, storage or parent of the notebook's);
        # no forms, popups or navigation of the notebook
        return (
            f'<iframe class="tokenkit-show" sandbox="allow-scripts" title="tokenkit: the {self.view} view" '
            f'style="width: 100%; height: {self.height}px; border: 1px solid #ddd; border-radius: 4px" '
            f'srcdoc="{html.escape(self.html, quote=True)}"></iframe>'
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write the page to `path` atomically (a device, FIFO or socket there is refused first);
        the file opens in any browser, offline. Returns the path."""
        atomic.check_output(path)
        atomic.write_atomic(path, self.html.encode("utf-8"))
        return Path(path)

    def __repr__(self) -> str:
        return f"<tokenkit page: the {self.view} view of {', '.join(self.views)}; {len(self.html) / 1000:,.0f} KB>"


def show(
    source: Any,
    text: str,
    *,
    view: str | None = None,
    tokenizer: Tokenizer | None = None,
    layer: int = 0,
    head: int = 0,
    specials: str = "refuse",
    height: int = HEIGHT,
) -> Shown:
    """`tk serve`'s page for `text`, shown inline in a notebook (see the module's docstring).

    `view`: the view it opens in (default: tokens for a tokenizer, attention for a model), one of
    the page's; `layer`, `head`: the head it opens at; `specials`: the special-token policy,
    "refuse" (special tokens in the text are an error), "allow" or "text" (as `tk explain`'s
    --allow-special and --specials-as-text); `tokenizer`: a GPT's (a model file's own otherwise);
    `height`: the frame's, in pixels. Bad arguments raise ValueError (TypeError for a source of
    another kind); a file that does not load, PipelineError."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if len(text) > views.TEXT_CHARS:
        raise ValueError(f"the text is {len(text):,} characters; a page holds at most {views.TEXT_CHARS:,}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text is not valid UTF-8 (it holds a lone surrogate); a page holds Unicode text") from None
    if specials not in views.SPECIALS:
        raise ValueError(f"specials must be one of {', '.join(map(repr, views.SPECIALS))}, got {specials!r}")
    if isinstance(height, bool) or not isinstance(height, int) or not 1 <= height <= MAX_HEIGHT:
        raise ValueError(f"height must be a whole number of pixels from 1 to {MAX_HEIGHT:,}, got {height!r}")
    model, tok, name, path = _source(source, tokenizer)
    _check_specials(tok, text, specials)
    policy = "" if specials == "refuse" else specials
    if model is None:
        page = _tokenizer_page(tok, text, name, _view(view, TOKENIZER_VIEWS, "tokens"), policy)
    else:
        chosen = _view(view, page_file.model_views(path), "attention")
        _check_head(model, layer, head)
        page = page_file.model_page(
            model, tok, text, name=name, path=path, layer=layer, head=head, specials=specials, view=chosen
        )  # fmt: skip
        serve = f"run `tk serve {shlex.quote(name)}`"
        page.note = f"This page holds one text; call tokenkit.show again for another, or {serve} to explore others."
        if path == IN_MEMORY:  # no `tk serve NAME` to suggest: the model is in this process
            page.note = "This page holds one text; call tokenkit.show again for another."
            page.missing = {k: v.replace(serve, "run `tk serve` on the saved model") for k, v in page.missing.items()}
    doc = page_file.page_html(page)
    if len(doc) > page_file.MAX_BYTES:
        raise ValueError(
            f"the page would be {len(doc) / 1e6:,.1f} MB, more than the {page_file.MAX_BYTES / 1e6:.0f} MB a page "
            "may hold; give a shorter text"
        )
    return Shown(doc.decode("utf-8"), views=page.views, view=page.defaults["view"], height=height)


def _source(source: Any, tokenizer: Tokenizer | None) -> tuple[Any, Tokenizer, str, Path]:
    """(model or None, tokenizer, name, path) of what `show` was given."""
    from tokenkit.transformer.model import GPT  # here: a tokenizer's page needs no model code

    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a tokenkit Tokenizer, got {type(tokenizer).__name__}")
    if isinstance(source, Tokenizer):
        if tokenizer is not None:
            raise ValueError("give tokenizer= with a model only; show(tokenizer, text) shows that tokenizer")
        return None, source, "tokenizer", IN_MEMORY
    if isinstance(source, GPT):
        if tokenizer is None:
            raise ValueError("a GPT holds no tokenizer; give it: show(model, text, tokenizer=tok)")
        if tokenizer.vocab_size > source.config.vocab_size:
            raise ValueError(
                f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary "
                f"{source.config.vocab_size}; give the tokenizer the model was made for"
            )
        return source, tokenizer, "model", IN_MEMORY
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"show takes a Tokenizer, a GPT or a path, got {type(source).__name__}")
    path = Path(source)
    if not path.is_dir() and (
        not os.path.lexists(path) or checkpoint.read_header(path, "file").get("format") != checkpoint.MODEL_FORMAT
    ):
        if tokenizer is not None:
            raise ValueError(f"{path} is no model file or run directory; give tokenizer= with a model only")
        return None, checkpoint.load_tokenizer(path), str(path), IN_MEMORY  # a missing file: its one line
    loaded = checkpoint.load_model(path, tokenizer_required=tokenizer is None)
    return loaded.model, checkpoint.paired_tokenizer(loaded, tokenizer, path), str(path), path


def _view(view: str | None, held: list[str], default: str) -> str:
    if view is None:
        return default
    if view not in views.VIEWS:
        raise ValueError(f"unknown view {view!r}; this page's views are {', '.join(held)}")
    if view not in held:
        why = " (a run directory with its log.jsonl has it)" if view == "training" else " (a model's page has it)"
        raise ValueError(f"this page has no {view} view{why}; its views are {', '.join(held)}")
    return view


def _check_head(model, layer: int, head: int) -> None:
    for name, value, count in (("layer", layer, model.config.n_layers), ("head", head, model.config.n_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
            raise ValueError(f"{name} must be from 0 to {count - 1} (the model has {count}), got {value!r}")


def _check_specials(tok: Tokenizer, text: str, specials: str) -> None:
    """The text's special tokens under the policy: refused here in Python's words, not the page's flags."""
    try:
        tok.encode(text, **views.SPECIALS[specials])
    except DisallowedSpecialError as err:
        raise ValueError(one_line(err.advise('specials="allow"', 'specials="text"'))) from None


def _tokenizer_page(tok: Tokenizer, text: str, name: str, view: str, policy: str) -> page_file.Page:
    """The page of a tokenizer alone: /api/info and the Tokens and BPE views' answers."""
    held = serve_api.Holdings(tokenizer=tok, tokenizer_name=name)
    page = page_file.Page(
        title=f"tokenkit: {text if len(text) <= 60 else text[:57] + '...'}",
        note="This page holds one text; call tokenkit.show again for another, or run `tk serve -t TOKENIZER`.",
        defaults={"view": view},
        fixed={"text": text, "specials": policy},
    )
    page.views = list(TOKENIZER_VIEWS)
    page.ask(held, "/api/info")["views"] = page.views  # the tabs of the views it holds
    for path in ("/api/tokens", "/api/bpe"):
        page.ask(held, path, {"text": text, "specials": policy})
    return page
