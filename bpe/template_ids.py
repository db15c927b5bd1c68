"""A conversation's ids in the template a tokenizer chats in: its own Jinja template when it keeps one, else tk's.

What it does: `render(tok, conversation)` is `bpe.chat_template.render` for a tokenizer without a
Jinja template (bpe/jinja_template.py), and for one with it does what transformers'
`apply_chat_template(messages, tokenize=True)` does: renders the text, then encodes it whole with
every special token in it read as its token (transformers' added tokens), no BOS added (a template
writes its own `{{ bos_token }}`). So content holding a special token's text is read as that
token here, as transformers reads it, unlike in tk's template.

The mask of an imported template (the tokens fine-tuning learns): for each assistant turn, the
text the template adds when the turn is appended (the conversation up to it rendered with the
generation prompt, then with the turn), from the end of the generation prompt to the end of the
turn's end token (`end_of_turn`) when the turn holds it, else to the end of the added text; a
token counts when any of its bytes fall inside. Limits: a template that renders an earlier turn
differently once later turns follow (one that drops an earlier answer's reasoning, or dates the
conversation at its end) is refused in one line, since no span is the turn's alone; a token that
straddles an edge (a content that begins with what the header ends with, when they merge) counts
whole; each turn costs two more renderings. `{% generation %}` blocks are not used for it.

`end_of_turn(tok)`: the special token that closes the assistant's turn, read off a probe rendering
(the first special token right after an answer's text: ChatML's `<|im_end|>`, Llama 3's
`<|eot_id|>`, tk's `<|end|>`); generation stops there.

What it deliberately does not do: read conversations (bpe/conversations.py), render Jinja itself
(bpe/jinja_template.py), or cut conversations to a model's context.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence

import numpy as np

from tokenkit.bpe.chat_template import END, Rendered, missing
from tokenkit.bpe.chat_template import render as render_tk
from tokenkit.bpe.conversations import Conversation, Message
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.jinja_template import ChatTemplate, template_of
from tokenkit.bpe.tokenizer import Tokenizer

__all__ = ["PROBE", "encode_rendered", "end_of_turn", "messages_of", "render", "template_name"]

PROBE = "tk-probe-answer"  # an answer's text in the probe rendering: no space to trim, no token's text


def template_name(tok: Tokenizer) -> str | None:
    """Which template `tok` chats in: "jinja" (its own, imported), "tk" (tk's tokens), or None."""
    if template_of(tok) is not None:
        return "jinja"
    return "tk" if not missing(tok) else None


def messages_of(conversation: Conversation | Sequence[Mapping | Message]) -> list[dict]:
    """HF-style message dicts of a conversation (or of messages)."""
    items = conversation.messages if isinstance(conversation, Conversation) else conversation
    pairs = [(m.role, m.content) if isinstance(m, Message) else (m["role"], m["content"]) for m in items]
    return [{"role": role, "content": content} for role, content in pairs]


def encode_rendered(tok: Tokenizer, text: str) -> list[int]:
    """A rendered template's ids: every special token in it read as its token, as transformers reads it."""
    return tok.encode(text, allowed_special="all")


def render(
    tok: Tokenizer,
    conversation: Conversation | Sequence[Mapping | Message],
    *,
    generation_prompt: bool = False,
    where: str = "the tokenizer",
) -> Rendered:
    """The conversation's ids and mask in `tok`'s template (see the module docstring); the
    messages are checked first (`Conversation.of`). TokenizerError naming `where` on a failure."""
    template = template_of(tok)
    if template is None:
        return render_tk(tok, conversation, generation_prompt=generation_prompt)
    if not isinstance(conversation, Conversation):
        conversation = Conversation.of(conversation, prompt=generation_prompt)
    messages = messages_of(conversation)
    full = template.render_text(messages, generation_prompt=generation_prompt, where=where)
    ids = encode_rendered(tok, full)
    mask = np.zeros(len(ids), dtype=bool)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if turns:
        normal = (lambda s: unicodedata.normalize("NFC", s)) if tok.normalizer == "nfc" else (lambda s: s)
        ends = np.cumsum([len(tok.decode_bytes([i])) for i in ids])
        starts = ends - np.fromiter((len(tok.decode_bytes([i])) for i in ids), dtype=np.int64, count=len(ids))
        if len(ids) and int(ends[-1]) != len(normal(full).encode("utf-8")):
            raise TokenizerError(f"{where}: the rendered conversation's tokens do not spell its text; cannot mark them")
        end = _end_text(tok, template, where)
        for i in turns:
            before = template.render_text(messages[:i], generation_prompt=True, where=where)
            after = template.render_text(messages[: i + 1], where=where)
            if not (after.startswith(before) and full.startswith(after)):
                raise TokenizerError(
                    f"{where}'s chat template renders an earlier turn differently once later turns follow "
                    f"(message {i + 1}'s text is not a prefix of the whole), so tk cannot mark the assistant's "
                    "tokens; render the conversation a turn at a time"
                )
            added = after[len(before) :]
            stop = added.rfind(end) + len(end) if end and end in added else len(added)
            lo = len(normal(before).encode("utf-8"))
            hi = len(normal(before + added[:stop]).encode("utf-8"))
            mask |= (starts < hi) & (ends > lo)
    return Rendered(np.array(ids, dtype=tok.ids_dtype), mask, conversation.line)


def _end_text(tok: Tokenizer, template: ChatTemplate, where: str) -> str | None:
    probe = [{"role": "user", "content": "1"}, {"role": "assistant", "content": PROBE}]
    text = template.render_text(probe, where=where)
    at = text.rfind(PROBE)
    if at < 0:
        return None
    rest = text[at + len(PROBE) :]
    found = [name for name in tok.special_tokens if rest.startswith(name)]
    return max(found, key=len) if found else None


def end_of_turn(tok: Tokenizer, where: str = "the tokenizer") -> int | None:
    """The id of the special token that closes the assistant's turn in `tok`'s template (see the
    module docstring), or None when the template closes it with none."""
    template = template_of(tok)
    if template is None:
        return tok.special_tokens.get(END)
    name = _end_text(tok, template, where)
    return None if name is None else tok.special_tokens[name]
