"""tk's chat template: a conversation rendered to token ids, with the mask of the tokens that count.

What it does: renders a `bpe.conversations.Conversation` as

    <|system|>CONTENT<|end|><|user|>CONTENT<|end|><|assistant|>CONTENT<|end|>...

each role's token and END as special-token ids, each CONTENT encoded as plain text (the generation
prompt adds a last `<|assistant|>`, for the model to answer after). The mask marks what supervised
fine-tuning learns: the assistant turns' content tokens and their END, never a header (the model
is not taught to say who speaks next: the template says it). A tokenizer with a BOS (Llama 3's)
begins with it, unmasked, as its models expect. `add_chat_tokens` gives a tokenizer the four
tokens, their ids appended after its last, the others' ids unchanged.

Why these tokens, and no text around them (ChatML writes `<|im_start|>assistant\\n` and a "\\n"
after each `<|im_end|>`): every boundary of the template is a special token, so each content is
encoded alone, as transformers encodes the text between two added tokens. So (1) the mask's
boundaries fall between tokens (ChatML's header text "assistant\\n" would merge with a content
that starts with "\\n"), and (2) the Jinja template an export writes (`bpe.jinja_template.tk_template`),
`{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}`
(then `<|assistant|>` for the generation prompt), gives transformers' apply_chat_template these
exact ids for any content without special-token text, whatever the split pattern. Phi-3 names
its role and end tokens the same; its template differs (a newline after each), so an imported
Phi-3 keeps its own.

Content is always text: `<|end|>` typed by a user is encoded as the bytes "<|end|>", never as the
token, so no message can close its turn or open another's (`Tokenizer.encode` with
`disallowed_special=()`: a tokenizer's text tokens, HF's added tokens that are not special, are
still read as their token, as transformers reads them). transformers' rendered string would read
such text as the token: the one place where its ids and tk's differ, on purpose.

What it deliberately does not do: render a tokenizer's own Jinja template, imported with it
(bpe/template_ids.py chooses), read conversation files (bpe/conversations.py), cut or pack
conversations into a model's context, or grow a model to a grown tokenizer (transformer/vocab.py).

>>> from tokenkit.bpe.tokenizer import Tokenizer
>>> tok = add_chat_tokens(Tokenizer([]))
>>> r = render(tok, Conversation.of([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]))
>>> r.ids.tolist(), r.mask.astype(int).tolist()
([257, 72, 105, 259, 258, 89, 111, 259], [0, 0, 0, 0, 0, 1, 1, 1])
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tokenkit.bpe.conversations import Conversation, Message
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.jinja_template import with_template
from tokenkit.bpe.show import token_repr
from tokenkit.bpe.tokenizer import Tokenizer

__all__ = ["ASSISTANT", "CHAT_TOKENS", "END", "ROLE_TOKENS", "Rendered", "add_chat_tokens", "missing", "render"]

ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
ASSISTANT = ROLE_TOKENS["assistant"]
END = "<|end|>"  # the end of every turn; generation stops at it
CHAT_TOKENS = (*ROLE_TOKENS.values(), END)  # the order `add_chat_tokens` appends them in
_AS_TEXT = {"allowed_special": (), "disallowed_special": ()}  # content's special-looking text stays text


@dataclass(frozen=True)
class Rendered:
    """A conversation as the template renders it: `ids` (N,) in the tokenizer's ids_dtype, `mask`
    (N,) bool, True where a token counts for fine-tuning; `line`: the conversation's line."""

    ids: np.ndarray
    mask: np.ndarray
    line: int = 0

    def as_json(self) -> dict:
        """What `tk encode --chat --json` prints for it: line, ids and the mask as 0/1."""
        return {"line": self.line, "ids": self.ids.tolist(), "mask": self.mask.astype(int).tolist()}

    def shown(self, tok: Tokenizer, end_of_turn: int | None = None) -> list[str]:
        """The rendering for people: a line per turn (with another template's `end_of_turn`, each
        line ends after it and the whitespace that follows it), text tokens quoted
        (`bpe.show.token_repr`), special tokens bare, and a * before each token that counts."""
        specials = {i: name for name, i in tok.special_tokens.items()}
        heads = set() if end_of_turn is not None else {tok.special_tokens[t] for t in CHAT_TOKENS if t != END}
        lines: list[list[str]] = [[]]
        after = False
        for i, counted in zip(self.ids.tolist(), self.mask.tolist(), strict=True):
            blank = i not in specials and not tok.decode_bytes([i]).strip()
            if (i in heads or (after and not blank)) and lines[-1]:
                lines.append([])
            after = i == end_of_turn or (after and blank)
            piece = specials.get(i) or token_repr(tok.decode_bytes([i]))
            lines[-1].append("*" * counted + piece)
        return ["  " + " ".join(line) for line in lines]


def missing(tok: Tokenizer) -> list[str]:
    """The template's special tokens `tok` lacks, in CHAT_TOKENS order; TokenizerError when it
    reads one of them as text (a text token: a user's content could then make it)."""
    text = sorted(set(CHAT_TOKENS) & tok.text_tokens)
    if text:
        raise TokenizerError(
            f"the tokenizer reads {text[0]!r} as text (an added token that is not special); "
            "the chat template needs it special, so that no content can make it"
        )
    return [t for t in CHAT_TOKENS if t not in tok.special_tokens]


def add_chat_tokens(tok: Tokenizer) -> Tokenizer:
    """`tok` with the template's special tokens it lacks appended (ids vocab_size, vocab_size + 1,
    ... in CHAT_TOKENS order); every other id, merge and option unchanged, and a Jinja template it
    kept (bpe/jinja_template.py) dropped: a model of the grown tokenizer learns tk's template.
    `tok` itself when it has them all (Phi-3's names: it keeps its own template until fine-tuned
    on tk's: pipeline/chat_start.py)."""
    new = missing(tok)
    if not new:
        return tok
    tensors, metadata = tok.to_tensors()  # the file's form: specials are a {name: id} JSON object
    specials = tok.special_tokens
    specials.update({name: tok.vocab_size + k for k, name in enumerate(new)})
    if tok.listed:  # a listed vocabulary gives each id its bytes, a special token's none
        offsets = tensors["vocab_offsets"]
        tensors = {**tensors, "vocab_offsets": np.concatenate([offsets, np.full(len(new), offsets[-1])])}
    metadata = {**metadata, "special_tokens": json.dumps(specials, sort_keys=True)}
    return with_template(Tokenizer.from_tensors(tensors, metadata), None)


def render(
    tok: Tokenizer, conversation: Conversation | Sequence[Mapping | Message], *, generation_prompt: bool = False
) -> Rendered:
    """The conversation's ids and mask (see the module docstring); messages are checked first
    (`Conversation.of`, a prompt with `generation_prompt`). `generation_prompt`: end with
    `<|assistant|>`, after the user's last turn. TokenizerError when `tok` lacks the template's
    tokens (`add_chat_tokens` adds them)."""
    if not isinstance(conversation, Conversation):
        conversation = Conversation.of(conversation, prompt=generation_prompt)
    if generation_prompt and conversation.roles[-1] == "assistant":
        raise TokenizerError(
            "the conversation ends with the assistant's answer; the generation prompt opens the assistant's "
            "turn after the user's"
        )
    lacks = missing(tok)
    if lacks:
        raise TokenizerError(
            f"the tokenizer lacks the chat template's special tokens {', '.join(lacks)}; add them with add_chat_tokens"
        )
    special = tok.special_tokens
    ids: list[int] = [] if tok.bos is None else [special[tok.bos]]
    mask: list[bool] = [False] * len(ids)
    for m in conversation.messages:
        counts = m.role == "assistant"
        text = tok.encode(m.content, **_AS_TEXT)
        ids += [special[ROLE_TOKENS[m.role]], *text, special[END]]
        mask += [False] + [counts] * (len(text) + 1)
    if generation_prompt:
        ids.append(special[ASSISTANT])
        mask.append(False)
    return Rendered(np.array(ids, dtype=tok.ids_dtype), np.array(mask, dtype=bool), conversation.line)
