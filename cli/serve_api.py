"""`tk serve`'s JSON endpoints: what the server holds, each endpoint's query read and bounded,
and the view (pipeline/views.py) it answers with. docs/serve.md is the contract.

`Holdings` is what the server was started with: a tokenizer, a second one to compare, a model
followed on disk (`pipeline.live.LiveModel`) and a run's training log. `answer(holdings, path,
query)` runs one endpoint: a bad query raises `Refused` (400, or 404 for what the server was not
given) before any work; the views' own one-line errors (a special token the policy refuses, a
text longer than a view's limit) pass up to the server, which answers them with 400 too. A text
longer than the model's context is no error: every view reads its last tokens and says how many
it dropped (`cut`, pipeline/run.py's `fit_context`), as the commands do.

What it deliberately does not do: speak HTTP, check hosts or serve files (cli/serve.py does), or
compute what a view shows (pipeline/views.py does).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from tokenkit.bpe import Tokenizer
from tokenkit.common import jsonsafe
from tokenkit.common.errors import FileError
from tokenkit.common.messages import short
from tokenkit.pipeline import PipelineError, chat_views, checkpoint, views
from tokenkit.pipeline.ablation_views import ablated_next_view, zero_parts
from tokenkit.pipeline.checkpoint import load_tokenizer
from tokenkit.pipeline.config import Range
from tokenkit.pipeline.live import LiveModel, Loaded, TrainingLog
from tokenkit.transformer.ablation import Ablation, ablated
from tokenkit.transformer.errors import ModelError
from tokenkit.transformer.explain_examples import EXAMPLES

MAX_FIELDS = 16  # query parameters in one request; every endpoint takes fewer
ABLATE_PARTS = 1024  # parts one `ablate` SPEC names at most: a 32-layer model of 31 heads has that many
ABLATE_CHARS = 8 * ABLATE_PARTS  # its characters at most ("31.31," is 6)
_INTEGER = re.compile(r"-?[0-9]{1,20}")
_REAL = re.compile(r"-?([0-9]{1,20}(\.[0-9]{0,20})?|\.[0-9]{1,20})([eE][-+]?[0-9]{1,3})?")  # no nan, inf, 1_0


class Refused(Exception):
    """A request the server does not answer: `status` (400 a bad query, 404 a view of something
    the server was not given) and one line saying why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# ----------------------------------------------------------------------------- what is served


@dataclass
class Holdings:
    """What `tk serve` was given. The model is followed on disk (`live`); until a run has one,
    the tokenizer is the run's tokenizer.safetensors (or -t's); once it has, the model's own."""

    tokenizer: Tokenizer | None = None
    tokenizer_name: str | None = None
    compare: Tokenizer | None = None
    compare_name: str | None = None
    live: LiveModel | None = None
    model_name: str | None = None
    run_dir: Path | None = None
    training: TrainingLog | None = None

    def loaded(self) -> Loaded | None:
        return None if self.live is None else self.live.get()

    def need_model(self) -> Loaded:
        loaded = self.loaded()
        if loaded is None:
            if self.live is not None:
                raise Refused(f"{self.live.path} is not there yet (training writes it at its first evaluation)", 404)
            raise Refused("no model was given; start tk serve with a run directory or a model file", 404)
        return loaded

    def main_tokenizer(self) -> tuple[Tokenizer, str]:
        loaded = self.loaded()
        if loaded is not None:
            return loaded.tokenizer, self.model_name or ""
        if self.tokenizer is None:
            raise Refused("no tokenizer was given; start tk serve with a run, a model or -t TOKENIZER", 404)
        return self.tokenizer, self.tokenizer_name or ""

    def compare_tokenizer(self) -> tuple[Tokenizer, str]:
        if self.compare is None:
            raise Refused("no second tokenizer was given; start tk serve with -c TOKENIZER", 404)
        return self.compare, self.compare_name or ""


def open_holdings(
    source: Path | None, tokenizer: Path | None = None, compare: Path | None = None, device: str = "cpu"
) -> Holdings:
    """Load what `tk serve [SOURCE] [-t TOKENIZER] [-c COMPARE]` names; a file that does not load
    is a one-line error here, before the server starts."""
    held = Holdings()
    if tokenizer is not None:
        held.tokenizer, held.tokenizer_name = load_tokenizer(tokenizer), str(tokenizer)
    if compare is not None:
        held.compare, held.compare_name = load_tokenizer(compare), str(compare)
    if source is None:
        return held
    source = Path(source)
    model_path = source
    if source.is_dir():
        names = (checkpoint.MODEL_FILE, checkpoint.TOKENIZER_FILE, checkpoint.LOG_FILE, checkpoint.STATE_FILE)
        if not any((source / name).exists() for name in names):
            raise PipelineError(f"{source} is not a run directory (no {', '.join(names)}); give a run or a model file")
        held.run_dir, held.training = source, TrainingLog(source / checkpoint.LOG_FILE)
        model_path = source / checkpoint.MODEL_FILE
        if tokenizer is None and (source / checkpoint.TOKENIZER_FILE).exists():
            held.tokenizer, held.tokenizer_name = Tokenizer.load(source / checkpoint.TOKENIZER_FILE), str(source)
    elif not source.exists():
        raise PipelineError(f"{source}: no such run directory or model file")
    held.live, held.model_name = LiveModel(model_path, tokenizer, device), str(source)
    if held.live.get() is None and (held.live.error is not None or held.run_dir is None):
        raise PipelineError(held.live.error or f"model file not found: {model_path}")
    return held


# ----------------------------------------------------------------------------- the query


class Query:
    """A request's query string, each parameter at most once and known to the endpoint
    (`allowed`); the getters check each value's range before any work."""

    def __init__(self, raw: str, allowed: tuple[str, ...]) -> None:
        try:
            pairs = parse_qsl(raw, keep_blank_values=True, errors="strict", max_num_fields=MAX_FIELDS)
        except UnicodeDecodeError:
            raise Refused("the query is not UTF-8 once %-decoded") from None
        except ValueError:
            raise Refused(f"more than {MAX_FIELDS} query parameters") from None
        self._values: dict[str, str] = {}
        for key, value in pairs:
            if key not in allowed:
                takes = ", ".join(allowed) or "no parameters"
                raise Refused(f"unknown parameter {short(key, quoted=False)!r}; this endpoint takes {takes}")
            if key in self._values:
                raise Refused(f"parameter {key} is given twice")
            self._values[key] = value

    def text(self, limit: int = views.TEXT_CHARS) -> str:
        text = self._values.get("text")
        if text is None:
            raise Refused("give the text: ?text=...")
        if len(text) > limit:
            raise Refused(f"text is {len(text):,} characters; at most {limit:,}")
        return text

    def optional(self, name: str) -> str | None:
        """A string parameter as given, or None when absent (the caller bounds it)."""
        return self._values.get(name)

    def integer(self, name: str, allowed: Range, default: int | None) -> int | None:
        value = self._values.get(name)
        if value is None:
            return default
        if not _INTEGER.fullmatch(value):
            raise Refused(f"{name} must be a whole number, got {short(value, quoted=False)!r}")
        return _checked(name, int(value), allowed)

    def real(self, name: str, allowed: Range, default: float | None) -> float | None:
        value = self._values.get(name)
        if value is None:
            return default
        if not _REAL.fullmatch(value):
            raise Refused(f"{name} must be a number, got {short(value, quoted=False)!r}")
        return _checked(name, float(value), allowed)

    def json(self, name: str, limit: int) -> Any:
        """The JSON value of parameter `name` (None when absent): at most `limit` characters, so
        at most as many values, and nested no deeper than `common.jsonsafe` allows."""
        value = self._values.get(name)
        if value is None:
            return None
        if len(value) > limit:
            raise Refused(f"{name} is {len(value):,} characters; at most {limit:,}")
        try:
            return jsonsafe.loads(value, name, max_items=limit)
        except FileError as err:
            raise Refused(str(err)) from None

    def choice(self, name: str, options, default: str) -> str:
        value = self._values.get(name, default)
        if value not in options:
            raise Refused(f"{name} must be one of {', '.join(options)}, got {short(value, quoted=False)!r}")
        return value

    def policy(self) -> dict[str, Any]:
        """The special-token policy (`specials`: refuse, allow or text)."""
        return views.SPECIALS[self.choice("specials", tuple(views.SPECIALS), "refuse")]


def _checked(name: str, number, allowed: Range):
    problem = allowed.problem(number)
    if problem is not None or (isinstance(number, float) and not math.isfinite(number)):
        raise Refused(f"{name} {problem or 'must be a finite number'}, got {number}")
    return number


# ----------------------------------------------------------------------------- the endpoints


def _info(held: Holdings, q: Query) -> dict[str, Any]:
    loaded = held.loaded()
    tok, name = (loaded.tokenizer, held.model_name) if loaded is not None else (held.tokenizer, held.tokenizer_name)
    return views.info_view(
        tokenizer=tok,
        tokenizer_name=name,
        compare=held.compare,
        compare_name=held.compare_name,
        model=None if loaded is None else loaded.model,
        model_name=held.model_name,
        run=None if held.run_dir is None else str(held.run_dir),
    )


def _which(held: Holdings, q: Query) -> tuple[Tokenizer, str]:
    which = q.choice("which", ("main", "compare"), "main")
    return held.main_tokenizer() if which == "main" else held.compare_tokenizer()


def _tokens(held: Holdings, q: Query) -> dict[str, Any]:
    tok, name = _which(held, q)
    return views.tokens_view(tok, q.text(), name=name, policy=q.policy())


def _compare(held: Holdings, q: Query) -> dict[str, Any]:
    (other, other_name), (main, main_name) = held.compare_tokenizer(), held.main_tokenizer()
    return views.compare_view(main, other, q.text(), names=(main_name, other_name), policy=q.policy())


def _bpe(held: Holdings, q: Query) -> dict[str, Any]:
    tok, name = _which(held, q)
    return views.bpe_view(tok, q.text(), name=name, policy=q.policy())


def _layer_head(q: Query, cfg) -> dict[str, int]:
    """The address's `layer` and `head`, within the model (default 0 and 0)."""
    return {
        "layer": q.integer("layer", Range(0, cfg.n_layers - 1), 0),
        "head": q.integer("head", Range(0, cfg.n_heads - 1), 0),
    }


def _attention(held: Holdings, q: Query) -> dict[str, Any]:
    loaded = held.need_model()
    cfg = loaded.model.config
    return views.attention_view(loaded.model, loaded.tokenizer, q.text(), **_layer_head(q, cfg), policy=q.policy())


def _thumbnails(held: Holdings, q: Query) -> dict[str, Any]:
    loaded = held.need_model()
    return views.thumbnails_view(loaded.model, loaded.tokenizer, q.text(), policy=q.policy())


def _explain(held: Holdings, q: Query) -> dict[str, Any]:
    loaded = held.need_model()
    cfg = loaded.model.config
    return views.explain_doc(
        loaded.model,
        loaded.tokenizer,
        q.text(),
        **_layer_head(q, cfg),
        top_k=q.integer("top_k", Range(1, views.TOP_K_MAX), 5),
        policy=q.policy(),
        model_name=held.model_name or "",
        limit=views.explain_tokens(cfg),
        query=q.integer("query", Range(0, cfg.context_length - 1), None),  # within the text: to_dict checks
    )


def _lens(held: Holdings, q: Query) -> dict[str, Any]:
    loaded = held.need_model()
    top_k = q.integer("top_k", Range(1, views.LENS_TOP_K_MAX), 5)
    return views.lens_view(loaded.model, loaded.tokenizer, q.text(), top_k=top_k, policy=q.policy())


def _attribution(held: Holdings, q: Query) -> dict[str, Any]:
    loaded = held.need_model()
    # within the text and the vocabulary: the view checks, saying which positions and ids there are
    at = {"position": q.integer("position", Range(0), None), "token": q.integer("token", Range(0), None)}
    return views.attribution_view(loaded.model, loaded.tokenizer, q.text(), **at, policy=q.policy())


def _example(held: Holdings, q: Query) -> dict[str, Any]:
    return views.example_doc(q.choice("name", tuple(EXAMPLES), "attention-lookup"))


def _ablation(q: Query, model) -> Ablation | None:
    """The `ablate` SPEC's parts zeroed in the model, or None when not given: bounded in length and
    in parts before it is read, and each part checked against the model (a one-line 400)."""
    spec = q.optional("ablate")
    if spec is None:
        return None
    if len(spec) > ABLATE_CHARS:
        raise Refused(f"ablate is {len(spec):,} characters; at most {ABLATE_CHARS:,}")
    if spec.count(",") >= ABLATE_PARTS:
        raise Refused(f"ablate names {spec.count(',') + 1:,} parts; at most {ABLATE_PARTS:,}")
    try:
        return zero_parts(model, spec)
    except ModelError as err:
        raise Refused(str(err)) from None


def _next(held: Holdings, q: Query) -> dict[str, Any]:
    loaded = held.need_model()
    top_k = q.integer("top_k", Range(1, views.TOP_K_MAX), 10)
    knocked = _ablation(q, loaded.model)  # before the text is encoded and run
    text, policy = q.text(), q.policy()
    if knocked is not None:
        return ablated_next_view(loaded.model, loaded.tokenizer, text, knocked, top_k=top_k, policy=policy)
    return views.next_view(loaded.model, loaded.tokenizer, text, top_k=top_k, policy=policy)


def _sampling(q: Query, *, n: int) -> dict[str, Any]:
    """The sampling settings `/api/generate` and `/api/chat` take, each bounded (`n` tokens by default)."""
    return {
        "n": q.integer("n", Range(0, views.NEW_TOKENS_MAX), n),
        "temperature": q.real("temperature", Range(0, views.TEMPERATURE_MAX), 1.0),
        "top_k": q.integer("top_k", Range(1, views.TOP_K_MAX), None),
        "top_p": q.real("top_p", Range(0, 1, low_open=True), None),
        "seed": q.integer("seed", Range(0, views.SEED_MAX), 0),
        "show": q.integer("show", Range(1, views.TOP_K_MAX), 10),
    }


def _generate(held: Holdings, q: Query) -> dict[str, Any]:
    loaded = held.need_model()
    settings = _sampling(q, n=20)
    knocked = _ablation(q, loaded.model)
    text, policy = q.text(), q.policy()
    with ablated(loaded.model, knocked):  # `tk generate --ablate SPEC`: every step ablated
        return views.generate_view(loaded.model, loaded.tokenizer, text, policy=policy, **settings)


def _chat(held: Holdings, q: Query) -> dict[str, Any]:
    """Without `messages`, whether the model can chat; with them (a JSON list, at most TEXT_CHARS
    characters), the assistant's answer, each token with its distribution (pipeline/chat_views.py):
    404 for a model without a chat template."""
    loaded = held.need_model()
    settings = _sampling(q, n=40)
    messages = q.json("messages", views.TEXT_CHARS)
    if messages is None:
        return chat_views.chat_status(loaded.model, loaded.tokenizer)
    why = chat_views.unavailable(loaded.tokenizer)
    if why:
        raise Refused(why, 404)
    return chat_views.chat_view(loaded.model, loaded.tokenizer, messages, **settings)


def _training(held: Holdings, q: Query) -> dict[str, Any]:
    if held.run_dir is None:
        raise Refused("no run directory was given; start tk serve with one to see its training", 404)
    return views.training_view(held.run_dir, name=str(held.run_dir), log=held.training)


def _model(held: Holdings, q: Query) -> dict[str, Any]:
    model = held.need_model().model
    return views.model_view(model.config, model.params)


# path -> (the endpoint, the parameters it takes)
ENDPOINTS: dict[str, tuple[Callable[[Holdings, Query], dict[str, Any]], tuple[str, ...]]] = {
    "/api/info": (_info, ()),
    "/api/tokens": (_tokens, ("text", "which", "specials")),
    "/api/compare": (_compare, ("text", "specials")),
    "/api/bpe": (_bpe, ("text", "which", "specials")),
    "/api/attention": (_attention, ("text", "layer", "head", "specials")),
    "/api/thumbnails": (_thumbnails, ("text", "specials")),
    "/api/explain": (_explain, ("text", "layer", "head", "top_k", "query", "specials")),
    "/api/lens": (_lens, ("text", "top_k", "specials")),
    "/api/attribution": (_attribution, ("text", "position", "token", "specials")),
    "/api/example": (_example, ("name",)),
    "/api/next": (_next, ("text", "top_k", "ablate", "specials")),
    "/api/generate": (_generate, ("text", "n", "temperature", "top_k", "top_p", "seed", "show", "ablate", "specials")),
    "/api/chat": (_chat, ("messages", "n", "temperature", "top_k", "top_p", "seed", "show")),
    "/api/training": (_training, ()),
    "/api/model": (_model, ()),
}
_VIEW_PATH = re.compile(r"/api/[a-z_]{1,32}")


def answer(held: Holdings, path: str, query: str) -> dict[str, Any]:
    """The JSON of endpoint `path` (as the request wrote it, not decoded) for `query` (raw)."""
    found = ENDPOINTS.get(path)
    if found is None:
        if _VIEW_PATH.fullmatch(path):
            known = ", ".join(p.removeprefix("/api/") for p in ENDPOINTS)
            raise Refused(f"unknown view {path.removeprefix('/api/')!r}; the endpoints are {known}")
        raise Refused("not found", 404)
    endpoint, allowed = found
    return endpoint(held, Query(query, allowed))
