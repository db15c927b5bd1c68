"""A conversation with a model in its chat template, turn by turn, over a KV cache kept between turns.

    session = ChatSession(model, tok, temperature=0)
    for event in session.reply("Who found the ball?"):   # Token ..., then the Reply
        ...

What it does: holds the conversation (an optional system message, then the user's and the
assistant's turns, `bpe.chat_template`'s ids) and the model's K/V caches (1, Hkv, T_max, hd) per
layer. `reply(text)` renders the user's turn (`<|user|>TEXT<|end|><|assistant|>`) and generates
the assistant's, one `Token` event per token as it comes, then a `Reply` event with the whole
answer. Earlier turns are not recomputed: the caches hold every position already fed (`_fed`,
their ids), and each step computes only the positions after the longest prefix of the
conversation they still match, so a new turn costs its own tokens, `reset()` keeps the system
message's positions, and `set_system` recomputes what follows the change.

When it stops: at `<|end|>`; at the model's end token (`pipeline.run.eos_id`) or a role's token,
where the model has ended its turn in another way (the turn is closed with `<|end|>` as the
template closes every turn); after `max_new_tokens`; or when the turn alone fills the context.

When the context fills (the conversation would pass `context_length` positions), the oldest
turns are dropped, after the system message, until it holds at most `context_length - slack`
(a quarter of the context, so that the caches are not rebuilt at every next token), a `Dropped`
event says so, and the caches are refilled from what remains (every kept position moved). A user
message that does not fit beside the system message is refused before anything changes.

The template is tk's, or the model's own Jinja template when its tokenizer keeps one (imported
with it: bpe/jinja_template.py). Then each step renders the whole conversation (the answers so
far as their decoded text, the generation prompt after the user's last turn) and encodes it as
transformers does (bpe/template_ids.py), and the caches keep the longest prefix that still
matches, as above: a template that writes more after an answer than its end token (ChatML's
newline) or tokenizes an answer's text otherwise than it was generated costs those positions
again at the next turn, never a wrong cache. Generation stops at the template's end of turn
(`template_ids.end_of_turn`), the model's end token, or the template's `eos_token`.

What it deliberately does not do: read or print anything (`cli.chat_commands` does), load a model
(`pipeline.run.load_model_and_tokenizer`), teach a model the template (fine-tuning does), or
render tools or documents. It runs one conversation: no batching of several.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from tokenkit.bpe.chat_template import CHAT_TOKENS, END, ROLE_TOKENS, missing
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.jinja_template import template_of
from tokenkit.bpe.template_ids import encode_rendered, end_of_turn
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.names import MAX_NEW_TOKENS
from tokenkit.pipeline.run import eos_id
from tokenkit.transformer.backends import as_host
from tokenkit.transformer.generation import captured_step
from tokenkit.transformer.sampling import check_sampling, mask_from, sample_next

__all__ = ["MAX_MESSAGE_CHARS", "ChatSession", "Dropped", "Reply", "Token", "Turn", "not_for_chat"]

MAX_MESSAGE_CHARS = 1 << 20  # a message's text, before it is encoded: far beyond any context
_AS_TEXT = {"allowed_special": (), "disallowed_special": ()}  # a message's special-looking text stays text


@dataclass(frozen=True)
class Token:
    """One generated token: `id`, and `text` the characters it completes ('' when it ends in the
    middle of a UTF-8 character, whose bytes come with a later token's text)."""

    id: int
    text: str


@dataclass(frozen=True)
class Dropped:
    """The oldest `turns` turns (`tokens` positions) were dropped for room in the context."""

    turns: int
    tokens: int
    context: int

    def message(self) -> str:
        which = "its oldest turn" if self.turns == 1 else f"its {self.turns} oldest turns"
        return (
            f"note: the conversation filled the model's context ({self.context} tokens); dropped {which} "
            f"({self.tokens} tokens), the system message kept"
        )


@dataclass(frozen=True)
class Reply:
    """The assistant's answer: its `ids` (without the closing `<|end|>`), `content` their text,
    and `stop`: "end" (`<|end|>`, or the model's own template's end of turn), "turn" (the
    model's end token or a role's), "length" (max_new_tokens), "context" (the turn alone filled
    the context) or "interrupted"; the Token events' texts and then `rest` make up `content`."""

    ids: tuple[int, ...]
    content: str
    stop: str
    rest: str = ""  # what the Token events' texts lack: a character the answer cut short, as U+FFFD

    def as_json(self) -> dict:
        return {"role": "assistant", "content": self.content, "ids": list(self.ids), "stop": self.stop}


@dataclass
class Turn:
    """A user's message and the assistant's answer: `user_ids` its rendering up to the assistant's
    opening (`<|user|>TEXT<|end|><|assistant|>`), `reply_ids` the answer's tokens; in the
    conversation the turn is user_ids + reply_ids + `<|end|>`."""

    user: str
    user_ids: list[int]
    reply_ids: list[int] = field(default_factory=list)
    stop: str = ""

    def __len__(self) -> int:
        return len(self.user_ids) + len(self.reply_ids) + 1


def not_for_chat(tok, where: str = "the model") -> str | None:
    """The one line saying why `tok` cannot chat (it keeps no template of its own and lacks tk's
    template's tokens), or None."""
    if template_of(tok) is not None:
        return None
    lacks = missing(tok)
    if not lacks:
        return None
    return (
        f"{where} was not fine-tuned for chat: its tokenizer lacks the chat template's tokens "
        f"{', '.join(lacks)}; a model learns them by fine-tuning on conversations: "
        "tk train-model --chat DATA.jsonl --init-from MODEL -o RUN (or tk pipeline --chat)"
    )


class ChatSession:
    """One conversation with `model` (a transformer GPT) in `tok`'s chat template (see the module
    docstring). Sampling as `GPT.generate`: temperature 0 greedy, top_k, top_p, and one
    `numpy.random.Generator` seeded with `seed` for the whole session, so a seeded session
    repeats. PipelineError when `tok` lacks the template's tokens or a setting is out of range."""

    def __init__(
        self,
        model,
        tok,
        *,
        system: str | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        max_new_tokens: int = 200,
        where: str = "the model",
    ):
        reason = not_for_chat(tok, where)
        if reason:
            raise PipelineError(reason)
        check_sampling(temperature, top_k, top_p, seed)
        if isinstance(max_new_tokens, bool) or not 0 <= int(max_new_tokens) <= MAX_NEW_TOKENS:
            raise PipelineError(f"--max-new-tokens must be in [0, {MAX_NEW_TOKENS:,}], got {max_new_tokens}")
        self.model, self.tok = model, tok
        self.context = model.config.context_length
        self.slack = self.context // 4
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.max_new_tokens = int(max_new_tokens)
        self._rng = np.random.default_rng(seed)
        special = tok.special_tokens
        self.where, self.template = where, template_of(tok)
        model_end = eos_id(tok)
        if self.template is None:
            self._end = special[END]
            self._stops = {special[t] for t in CHAT_TOKENS}
        else:  # the template's end of turn, and the eos_token it names
            self._end = self._rendering(lambda: end_of_turn(tok, where))
            named = special.get(self.template.tokens.get("eos_token", ""))
            self._stops = {i for i in (self._end, named) if i is not None}
        self._stops |= {model_end} if model_end is not None else set()
        # ids past the tokenizer's (a padded vocabulary) have no token: never picked
        self._n_tokens = tok.vocab_size if tok.vocab_size < model.config.vocab_size else None
        self._prefix: list[int] = [] if tok.bos is None else [special[tok.bos]]
        self.system: str | None = None
        self.turns: list[Turn] = []
        self._k: list | None = None  # the caches, allocated at the first reply
        self._v: list | None = None
        self._fed: list[int] = []  # the ids whose keys and values the caches hold, positions 0..
        self._step = None  # the captured one-position step, where the backend has graphs
        # observe(token, logits, probs): each pick, its (V,) float64 logits (a padded vocabulary's extra
        # ids at -inf) and the distribution it was drawn from: the page's bars (pipeline/chat_views.py)
        self.observe: Callable[[int, np.ndarray, np.ndarray], None] | None = None
        if system is not None:
            self.set_system(system)

    # --- the conversation ---------------------------------------------------------------------

    @property
    def ids(self) -> list[int]:
        """The conversation as the model reads it: BOS (if the tokenizer has one), the system
        message, then each turn (the last one's answer as far as it has come); with the model's
        own template, as it renders them."""
        if self.template is not None:
            return self._template_ids(self.turns)
        ids = list(self._prefix)
        for turn in self.turns:
            ids += turn.user_ids + turn.reply_ids
            if turn.stop:  # a finished turn is closed; the one being answered is not yet
                ids.append(self._end)
        return ids

    @property
    def messages(self) -> list[dict]:
        """The conversation as HF-style messages (each answer's content its decoded text)."""
        out = [] if self.system is None else [{"role": "system", "content": self.system}]
        for turn in self.turns:
            out.append({"role": "user", "content": turn.user})
            out.append({"role": "assistant", "content": self.tok.decode(turn.reply_ids)})
        return out

    def _rendering(self, render):
        """`render()`, its TokenizerError (a template's failure) one PipelineError line."""
        try:
            return render()
        except TokenizerError as err:
            raise PipelineError(str(err)) from None

    def _template_ids(self, turns: list[Turn], system: str | None | bool = False) -> list[int]:
        """The model's own template's ids of the system message (`system`, else the session's) and
        `turns`: each finished answer as its text, the last turn's answer so far after the
        generation prompt when it is not finished."""
        system = self.system if system is False else system
        messages = [] if system is None else [{"role": "system", "content": system}]
        for turn in turns:
            messages.append({"role": "user", "content": turn.user})
            if turn.stop:
                messages.append({"role": "assistant", "content": self.tok.decode(turn.reply_ids)})
        if not messages:
            return []
        going = bool(turns) and not turns[-1].stop
        text = self._rendering(lambda: self.template.render_text(messages, generation_prompt=going, where=self.where))
        return encode_rendered(self.tok, text) + (turns[-1].reply_ids if going else [])

    def _text_ids(self, text, what: str) -> list[int]:
        if not isinstance(text, str):
            raise PipelineError(f"the {what} must be text, got {type(text).__name__}")
        if len(text) > MAX_MESSAGE_CHARS:
            raise PipelineError(
                f"the {what} is {len(text):,} characters, more than the {MAX_MESSAGE_CHARS:,} a message may hold"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise PipelineError(f"the {what} holds a lone surrogate, which is not Unicode text") from err
        return self.tok.encode(text, **_AS_TEXT)

    def _turn_ids(self, role: str, text: str) -> list[int]:
        """`<|ROLE|>TEXT<|end|>`: one message as tk's template renders it (bpe/chat_template.py)."""
        special = self.tok.special_tokens
        return [special[ROLE_TOKENS[role]], *self._text_ids(text, f"{role} message"), self._end]

    def set_system(self, text: str | None) -> list[int]:
        """Make `text` the system message (None: none); returns its ids. The turns stay (the oldest
        dropped if they no longer fit); the caches are recomputed from the change at the next
        reply. PipelineError, the session unchanged, when it takes more than half the context."""
        prefix = [] if self.tok.bos is None or self.template else [self.tok.special_tokens[self.tok.bos]]
        if self.template is None:
            ids = [] if text is None else self._turn_ids("system", text)
        else:
            if text is not None:
                self._text_ids(text, "system message")  # checked: text, of a bounded length
            ids = [] if text is None else self._template_ids([], text)
        if len(prefix) + len(ids) > self.context // 2:
            raise PipelineError(
                f"the system message is {len(ids):,} tokens; the model's context holds {self.context}, at most "
                f"half of it for the system message: shorten it"
            )
        self.system, self._prefix = text, prefix + ids
        return ids

    def add_turn(self, text: str, reply_ids) -> None:
        """Append a finished turn given whole, not generated: the user's `text` and the assistant's
        answer `reply_ids` as a client kept them (the server, which keeps no session, replays a
        conversation so). The oldest turns go at the next reply when they no longer fit. PipelineError,
        the session unchanged, when the text is not a message or an id is none of the tokenizer's or
        one that ends a turn (an answer never holds one)."""
        reply = list(reply_ids)
        for i in reply:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise PipelineError(f"an assistant's answer holds a {type(i).__name__}, where token ids go")
            if not 0 <= i < self.tok.vocab_size:
                raise PipelineError(
                    f"an assistant's answer holds id {i}, not one of the tokenizer's (0 to {self.tok.vocab_size - 1})"
                )
            if i in self._stops:
                raise PipelineError(f"an assistant's answer holds id {i}, which ends a turn: an answer never holds it")
        if self.template is None:
            user_ids = self._turn_ids("user", text) + [self.tok.special_tokens[ROLE_TOKENS["assistant"]]]
        else:
            self._text_ids(text, "user message")
            user_ids = []  # the template renders the whole conversation (`ids`)
        if self.turns and not self.turns[-1].stop:  # an earlier reply never consumed: close it
            self.turns[-1].stop = "interrupted"
        self.turns.append(Turn(text, user_ids, [int(i) for i in reply], stop="end"))

    def reset(self) -> None:
        """Forget the turns; the system message stays, and so do its cached positions."""
        self.turns = []

    # --- the caches -----------------------------------------------------------------------------

    def _feed(self, new: list[int]):
        """Feed `new` after the cached positions; the next-token logits (V,) on the host."""
        model = self.model
        if self._k is None:
            cfg = model.config
            shape = (1, cfg.kv_heads, cfg.context_length, cfg.head_dim)
            dtype = model.params["wte.weight"].dtype
            self._k = [model.xp.empty(shape, dtype=dtype) for _ in range(cfg.n_layers)]
            self._v = [model.xp.empty(shape, dtype=dtype) for _ in range(cfg.n_layers)]
        start = len(self._fed)
        ids = np.asarray([new], dtype=np.int64)  # (1, n)
        if len(new) == 1 and self._step is None:
            self._step = captured_step(model, 1, self._k, self._v) or False
        if len(new) == 1 and self._step:
            logits = self._step(ids, start)
        else:
            logits = model.forward_cached(model.backend.to_device(ids), start, self._k, self._v)
        self._fed += new
        return np.array(as_host(logits[0]))  # a copy: held across a yield, past the model's next call

    def _sync(self, ids: list[int]):
        """The next-token logits after `ids` (at most `context` of them): the cached positions
        that match ids' prefix are kept, the rest fed (at least the last position)."""
        fed = self._fed
        keep = 0
        limit = min(len(fed), len(ids) - 1)
        while keep < limit and fed[keep] == ids[keep]:
            keep += 1
        del fed[keep:]
        return self._feed(ids[keep:])

    def _make_room(self) -> Dropped | None:
        """Drop the oldest finished turns when the conversation passes the context, until it holds
        at most `context - slack` (or only the turn being answered is left); None when nothing went."""
        total = len(self.ids)
        if total <= self.context:
            return None
        turns = tokens = 0
        while total > self.context - self.slack and len(self.turns) > 1:
            self.turns.pop(0)
            left = len(self.ids)  # a template may render what remains otherwise: counted again
            turns, tokens, total = turns + 1, tokens + total - left, left
        return Dropped(turns, tokens, self.context) if turns else None

    # --- a reply --------------------------------------------------------------------------------

    def _pick(self, logits) -> int:
        choose = logits if self._n_tokens is None else mask_from(logits, self._n_tokens)
        drawn_from: list[np.ndarray] = []
        sampling = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        token = sample_next(choose, self._rng, **sampling, observe=None if self.observe is None else drawn_from.append)
        if self.observe is not None:
            self.observe(token, np.asarray(choose, dtype=np.float64), drawn_from[0])
        return token

    def reply(self, text: str) -> Iterator[Token | Dropped | Reply]:
        """The assistant's answer to the user's `text`: Token events as they come, a Dropped event
        when old turns make room, and last the Reply. The message is checked first (PipelineError
        when it is not text, or does not fit in the context beside the system message: the
        session unchanged). A reply closed early (the consumer stops) keeps what came, its turn
        closed, stop "interrupted"."""
        if self.template is not None:
            return self._template_reply(text)
        user_ids = self._turn_ids("user", text) + [self.tok.special_tokens[ROLE_TOKENS["assistant"]]]
        room = self.context - len(self._prefix)
        if len(user_ids) > room:
            raise PipelineError(
                f"the message takes {len(user_ids):,} tokens in its turn; the model's context holds {self.context}"
                + (f", {len(self._prefix)} of them the system message" if self.system is not None else "")
                + ": shorten it"
            )
        if self.turns and not self.turns[-1].stop:  # an earlier reply never consumed: close it
            self.turns[-1].stop = "interrupted"
        turn = Turn(text, user_ids)
        self.turns.append(turn)
        return self._answer(turn)

    def _template_reply(self, text: str) -> Iterator[Token | Dropped | Reply]:
        """`reply` in the model's own template: the turn rendered alone beside the system message
        must fit, and the whole conversation with it must render, before anything changes."""
        self._text_ids(text, "user message")
        alone = self._template_ids([Turn(text, [])])
        if len(alone) > self.context:
            raise PipelineError(
                f"the message takes {len(alone):,} tokens as the template renders it"
                + (" beside the system message" if self.system is not None else "")
                + f"; the model's context holds {self.context}: shorten it"
            )
        closed = self.turns[-1] if self.turns and not self.turns[-1].stop else None
        if closed:  # an earlier reply never consumed: close it
            closed.stop = "interrupted"
        turn = Turn(text, alone)
        self.turns.append(turn)
        try:
            self.ids  # noqa: B018 - the template may refuse the conversation as a whole
        except PipelineError:
            self.turns.pop()
            if closed:
                closed.stop = ""
            raise
        return self._answer(turn)

    def _answer(self, turn: Turn) -> Iterator[Token | Dropped | Reply]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            dropped = self._make_room()
            if dropped:
                yield dropped
            logits = self._sync(self.ids)
            for n in range(self.max_new_tokens + 1):
                if n == self.max_new_tokens:
                    turn.stop = "length"
                    break
                token = self._pick(logits)
                if token in self._stops:
                    turn.stop = "end" if token == self._end else "turn"
                    break
                turn.reply_ids.append(token)
                yield Token(token, decoder.decode(self.tok.decode_bytes([token])))
                if n + 1 == self.max_new_tokens:
                    continue  # the last token is not fed: nothing follows it in this turn
                if len(self._fed) < self.context:
                    logits = self._feed([token])
                    continue
                dropped = self._make_room()
                if dropped:
                    yield dropped
                if len(self.ids) > self.context:  # the turn alone fills the context
                    turn.stop = "context"
                    break
                logits = self._sync(self.ids)
            rest = decoder.decode(b"", final=True)
            yield Reply(tuple(turn.reply_ids), self.tok.decode(turn.reply_ids), turn.stop, rest)
        finally:
            if not turn.stop:
                turn.stop = "interrupted"

    def close(self) -> None:
        """Give back the captured step's memory (a GPU graph); the session stays usable."""
        if self._step:
            self._step.close()
        self._step = None
