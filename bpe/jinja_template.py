"""A chat template in Jinja, as transformers keeps and renders it: kept with a tokenizer, rendered in a sandbox.

What it does:
- `ChatTemplate`: a template's Jinja source and the special tokens' texts it may name (`bos_token`,
  `eos_token`, ... as transformers passes them), read from a checkpoint's tokenizer_config.json
  (`chat_template`: a string, or a list of named templates, of which "default" is taken) or from
  chat_template.jinja beside it (as transformers 5 saves it, and reads it first) by `from_hf`.
- Kept in one place: the tokenizer's `training` record (`Tokenizer.training`: what the tokenizer
  was imported from, with its template), under CHAT_TEMPLATE, so every file that holds the
  tokenizer (tokenizer.safetensors, a model file, a run fine-tuned from it) keeps it.
  `template_of(tok)` reads it (checked), `with_template(tok, template)` sets or drops it.
- `tk_template`: tk's own template (bpe/chat_template.py) in Jinja, which an export writes.
- `ChatTemplate.render_text`: the conversation as the template renders it, with jinja2's
  `ImmutableSandboxedEnvironment` set up as transformers' `_compile_jinja_template` sets it up
  (trim_blocks, lstrip_blocks, loop controls, the `raise_exception` and `strftime_now` globals,
  its `tojson` filter that does not escape HTML, `{% generation %}` blocks rendered as their body)
  and the same variables (`messages`, `add_generation_prompt`, `tools` and `documents` None, the
  special tokens' texts), so the text is transformers' text.

A template is code from the internet, so besides the sandbox (no attribute starting with _, no
mutation of the values it is given), its work is bounded: the source at MAX_TEMPLATE_CHARS, the
output at MIN_OUTPUT_CHARS plus OUTPUT_PER_INPUT times the conversation's characters (checked as
it streams, so an endless loop that prints stops there); where a value could pass that bound
before it is printed, it is refused first: `*`, `+` and `**`, a number past it given to a call or
a filter (`ljust`, `center`), a namespace's value (a string doubled in a loop); and, in the main
thread, MAX_SECONDS of wall time (SIGALRM; elsewhere none, and a loop that prints nothing runs
until the sandbox's range bound, 100,000 a loop, ends it). Not bounded: memory that one
expression takes otherwise (`~` of two strings within the bound), as in transformers. Every failure, a
syntax error, `raise_exception`, an undefined value, a bound passed, is one TokenizerError line
naming the template's owner (`where`) and what to do.

Rendering needs jinja2 (the `[chat]` extra, `pip install 'tokenkit[chat]'`), 3.1.6 or later as
transformers requires (older versions have known sandbox escapes); without it, one line says so.

What it deliberately does not do: turn the text into ids or find the tokens fine-tuning learns
(bpe/template_ids.py), render tk's own template (bpe/chat_template.py), or render tools,
documents or `continue_final_message`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from tokenkit.bpe.errors import TokenizerError

__all__ = [
    "CHAT_TEMPLATE",
    "INSTALL",
    "MAX_TEMPLATE_CHARS",
    "SPECIAL_TOKEN_NAMES",
    "TK_TOKENS",
    "ChatTemplate",
    "from_hf",
    "template_of",
    "tk_template",
    "with_template",
]

CHAT_TEMPLATE = "chat_template"  # the key in the tokenizer's training record
TK_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")  # bpe.chat_template.CHAT_TOKENS
INSTALL = "pip install 'tokenkit[chat]'"
MIN_JINJA = (3, 1, 6)  # transformers refuses older jinja2: sandbox escapes
# the longest published chat templates (tool use, reasoning) are 10-30 KB
MAX_TEMPLATE_CHARS = 512 * 1024
MAX_TOKEN_CHARS = 1024  # a special token's text
MIN_OUTPUT_CHARS = 1 << 20  # a rendering's bound: this, plus OUTPUT_PER_INPUT per character given
OUTPUT_PER_INPUT = 4
MAX_SECONDS = 10.0
# the tokens transformers passes a template by name (its SPECIAL_TOKENS_ATTRIBUTES)
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template: `source`, the special tokens' texts it may name (`tokens`, e.g.
    {"bos_token": "<|begin_of_text|>"}) and `origin`, what it was read from."""

    source: str
    tokens: Mapping[str, str] = field(default_factory=dict)
    origin: str = ""

    def record(self) -> dict:
        """What the tokenizer's training record keeps (`from_record` reads it back)."""
        return {"source": self.source, "tokens": dict(sorted(self.tokens.items())), "origin": self.origin}

    @classmethod
    def from_record(cls, value, what: str = "the tokenizer's chat template") -> ChatTemplate:
        """The template of a training record's value; TokenizerError when it is not one (a damaged file)."""
        if not isinstance(value, dict) or not isinstance(value.get("source"), str):
            raise TokenizerError(f"{what} is not a template's record (no source); the file is damaged")
        tokens = value.get("tokens", {})
        if not isinstance(tokens, dict) or not all(
            k in SPECIAL_TOKEN_NAMES and isinstance(v, str) and len(v) <= MAX_TOKEN_CHARS for k, v in tokens.items()
        ):
            raise TokenizerError(f"{what}'s tokens are not {{name: text}} of {', '.join(SPECIAL_TOKEN_NAMES)}")
        origin = value.get("origin", "")
        return cls(_checked_source(value["source"], what), tokens, origin if isinstance(origin, str) else "")

    def render_text(
        self, messages: Sequence[Mapping[str, str]], *, generation_prompt: bool = False, where: str = "the model"
    ) -> str:
        """The conversation (HF-style messages) as the template renders it, with the assistant's
        opening after it when `generation_prompt`; TokenizerError naming `where` on any failure."""
        given = sum(len(str(m.get("content", ""))) for m in messages)
        limit = MIN_OUTPUT_CHARS + OUTPUT_PER_INPUT * given
        template = _compiled(self.source, where)
        context = {
            **self.tokens,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "tools": None,
            "documents": None,
            "add_generation_prompt": bool(generation_prompt),
        }
        jinja2 = _jinja()
        pieces, size = [], 0
        try:
            with _bounded(limit), _deadline(MAX_SECONDS):
                for piece in template.generate(**context):
                    size += len(piece)
                    if size > limit:
                        raise _TooLong()
                    pieces.append(piece)
        except _TooLong:
            raise TokenizerError(
                f"{where}'s chat template makes more than {limit:,} characters for a conversation of {given:,}; "
                "it loops, or writes without end: fix the template (or use tk's: tk encode --add-chat-tokens)"
            ) from None
        except _Timeout:
            raise TokenizerError(
                f"{where}'s chat template ran longer than {MAX_SECONDS:g} s on one conversation; it loops: fix the "
                "template (or use tk's: tk encode --add-chat-tokens)"
            ) from None
        except jinja2.exceptions.UndefinedError as err:
            raise TokenizerError(
                f"{where}'s chat template uses a value it is not given ({_first_line(err)}); tk gives it messages, "
                f"add_generation_prompt and the special tokens' texts ({', '.join(self.tokens) or 'none'}): fix the "
                "template, or give the conversation what it expects"
            ) from None
        except jinja2.exceptions.SecurityError as err:
            raise TokenizerError(
                f"{where}'s chat template tried what the sandbox forbids ({_first_line(err)}); the template is not "
                "safe to run: fix it, or use tk's template (tk encode --add-chat-tokens)"
            ) from None
        except jinja2.exceptions.TemplateError as err:  # raise_exception's, among others
            raise TokenizerError(
                f"{where}'s chat template refused the conversation: {_first_line(err)}; change the conversation as it "
                "says"
            ) from None
        except (RecursionError, MemoryError, ArithmeticError, LookupError, TypeError, ValueError) as err:
            raise TokenizerError(
                f"{where}'s chat template failed on the conversation ({type(err).__name__}: {_first_line(err)}); "
                "fix the template, or the conversation it expects otherwise"
            ) from None
        return "".join(pieces)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def _checked_source(source, what: str) -> str:
    if not isinstance(source, str):
        raise TokenizerError(f"{what} is not a string of Jinja")
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TokenizerError(
            f"{what} is {len(source):,} characters, more than the {MAX_TEMPLATE_CHARS:,} a chat template may hold"
        )
    if not source.strip():
        raise TokenizerError(f"{what} is empty")
    return source


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and len(value) <= MAX_TOKEN_CHARS else None


def from_hf(config: Mapping | None, jinja_text: str | None, origin: str) -> ChatTemplate | None:
    """The chat template transformers loads from a directory: chat_template.jinja's text
    (`jinja_text`) first, else tokenizer_config.json's `chat_template` (`config`: a string, or a
    list of {"name", "template"} of which "default" is taken); None when there is none. Its
    special tokens' texts from `config` (special_tokens_map.json, which transformers 5 reads
    only where tokenizer_config.json says nothing, is never read). TokenizerError, naming
    `origin`, when the field is neither or a bound is passed."""
    config = config if isinstance(config, Mapping) else {}
    what = f"{origin}'s chat template"
    if jinja_text is not None:
        source = _checked_source(jinja_text, f"{origin}/chat_template.jinja")
    else:
        value = config.get("chat_template")
        if value is None:
            return None
        if isinstance(value, list):
            named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
            if "default" not in named:
                names = ", ".join(repr(n) for n in named if isinstance(n, str)) or "none"
                raise TokenizerError(
                    f'{origin}/tokenizer_config.json lists chat templates ({names}) but none named "default", '
                    "the one tk (and transformers) renders a conversation with"
                )
            value = named["default"]
        source = _checked_source(value, what)
    tokens = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = _token_text(config.get(name))
        if text is not None:
            tokens[name] = text
    return ChatTemplate(source, tokens, origin)


def tk_template(bos: str | None = None) -> ChatTemplate:
    """tk's template (bpe/chat_template.py) in Jinja, as an export writes it for transformers: each
    message `<|ROLE|>CONTENT<|end|>`, `<|assistant|>` for the generation prompt, after the BOS
    when the tokenizer has one (`bos`); transformers then gives tk's ids for any content without
    special-token text (tests/test_chat_templates_hf.py)."""
    source = (
        "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    if bos is None:
        return ChatTemplate(source, {}, "tk")
    return ChatTemplate("{{ bos_token }}" + source, {"bos_token": bos}, "tk")


def template_of(tok: Any) -> ChatTemplate | None:
    """The Jinja chat template the tokenizer `tok` keeps (imported with it), or None."""
    value = tok.training.get(CHAT_TEMPLATE)
    return None if value is None else ChatTemplate.from_record(value)


def with_template(tok: Any, template: ChatTemplate | None) -> Any:
    """The tokenizer `tok` keeping `template` (None: keeping none); every id and option unchanged."""
    training = tok.training
    if template is None and CHAT_TEMPLATE not in training:
        return tok
    if template is None:
        del training[CHAT_TEMPLATE]
    else:
        training[CHAT_TEMPLATE] = template.record()
    tensors, metadata = tok.to_tensors()
    return type(tok).from_tensors(tensors, {**metadata, "training": json.dumps(training, sort_keys=True)})


# --- the sandbox -------------------------------------------------------------------------------


class _TooLong(Exception):
    pass


class _Timeout(BaseException):  # not an Exception: no template code or handler may swallow it
    pass


def _jinja():
    """jinja2, or one line saying how to install it."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise TokenizerError(
            f"rendering a model's own chat template needs jinja2, which is not installed: {INSTALL}"
        ) from None
    version = tuple(int(p) if p.isdigit() else 0 for p in jinja2.__version__.split(".")[:3])
    if version < MIN_JINJA:
        raise TokenizerError(
            f"jinja2 {jinja2.__version__} has known sandbox escapes, and a chat template is code from the internet; "
            f"upgrade it: {INSTALL} (jinja2>={'.'.join(map(str, MIN_JINJA))})"
        )
    return jinja2


_limit = threading.local()  # the bound of the rendering in progress, for `*` and `**`


@contextlib.contextmanager
def _bounded(limit: int):
    _limit.value = limit
    try:
        yield
    finally:
        _limit.value = None


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise _Timeout after `seconds`, where SIGALRM is free to use (the main thread, no handler of
    its own); elsewhere no bound."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGALRM) not in (
        signal.SIG_DFL,
        None,
    ):
        yield
        return

    def expire(signum, frame):
        raise _Timeout()

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


@lru_cache(maxsize=8)
def _compiled(source: str, where: str):
    """The compiled template (cached: a conversation renders several times); TokenizerError
    naming `where` and the line of a syntax error."""
    jinja2 = _jinja()
    try:
        return _environment(jinja2).from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise TokenizerError(
            f"{where}'s chat template is not valid Jinja (line {err.lineno}: {_first_line(err)}); fix the template "
            "where it was imported from and import it again, or use tk's (tk encode --add-chat-tokens)"
        ) from None
    except jinja2.exceptions.TemplateError as err:
        raise TokenizerError(f"{where}'s chat template cannot be compiled ({_first_line(err)}); fix it") from None


@lru_cache(maxsize=1)
def _environment(jinja2):
    """transformers' environment (`_compile_jinja_template`), its namespace's rule on names too,
    with `*`, `+`, `**`, the calls' and filters' widths and a namespace's values bounded."""
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # `{% generation %}...{% endgeneration %}`: its body, as it is
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})

        def call_binop(self, context, operator, left, right):
            limit = _bound()
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if _size(seq) and isinstance(n, int) and _size(seq) * n > limit:
                        raise _TooLong()
            if operator == "+" and _size(left) + _size(right) > limit:
                raise _TooLong()
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 64:
                raise _TooLong()
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's own signature
            _check_widths(args, kwargs)  # 'x'.ljust(10**9) and the like
            return super().call(__context, __obj, *args, **kwargs)

    class BoundedNamespace(jinja2.utils.Namespace):  # transformers' rule on names, and a bound on sizes
        def __init__(*args, **kwargs):  # noqa: N805 - Namespace's own signature trick
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name, value in attrs.items():
                _check_attribute(name, value)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _check_attribute(name, value)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    def _check_attribute(name, value):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with _, got {name!r}")
        if _size(value) > _bound():  # a value doubled in a loop stops here, at twice the bound at most
            raise _TooLong()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.filters = {name: _width_checked(f) for name, f in env.filters.items()}  # center(10**9) and the like
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["namespace"] = BoundedNamespace
    return env


def _bound() -> int:
    return getattr(_limit, "value", None) or MIN_OUTPUT_CHARS


def _size(value) -> int:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else 0


def _check_widths(args, kwargs) -> None:
    """_TooLong when a call is given a number past the bound: a width, a repeat, a padding."""
    limit = _bound()
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
            raise _TooLong()


def _width_checked(f):
    @functools.wraps(f)  # keeps jinja2's pass_context/pass_environment marks
    def checked(*args, **kwargs):
        _check_widths(args, kwargs)
        return f(*args, **kwargs)

    return checked
