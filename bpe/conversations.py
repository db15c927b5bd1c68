"""Conversations as data: JSON Lines of `{"messages": [{"role": ..., "content": ...}, ...]}`.

What it does: reads and checks conversations in the convention of Hugging Face datasets and of
transformers' `apply_chat_template`. Each line of a file is one conversation, a JSON object whose
"messages" is a list of objects with a "role" ("system", "user" or "assistant") and a "content"
(a string); other keys, of the line or of a message, are ignored (UltraChat's "prompt_id", a
message's "name"). Blank lines are skipped; a byte order mark before the first line is too.

The order of the turns: an optional system message first, then the user and the assistant in
turns, the user first. A conversation to train on ends with the assistant's answer (so it holds
at least one); a prompt (`prompt=True`: rendered with the generation prompt, for the assistant to
answer) ends with the user's turn. Anything else is **refused, never skipped**: a line out of
order, an empty conversation or one without the answer it should end with is an error naming its
line, as a broken line is. Skipping would train on a different dataset than the one given, and
silently; the fix (drop or repair the line) is the user's, and the message says which line.

Bounds, checked before each step allocates: the file is a regular file of at most
MAX_FILE_BYTES (`common.readfile.open_regular`; a compressed file is refused by its first bytes,
`bpe.streams.codec_of`), a line at most MAX_LINE_BYTES, read a line at a time, its parse at most
MAX_JSON_VALUES values (`common.jsonsafe.loads`, which also bounds the nesting), and a
conversation at most MAX_MESSAGES messages. Every mistake is one TokenizerError (a FileError for
the file itself) naming the file and line.

What it deliberately does not do: render conversations to ids (bpe/chat_template.py), read
streams or compressed files (decompress them first), or read corpora (bpe/corpus.py).

>>> Conversation.of([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]).roles
('user', 'assistant')
>>> check_order(("user", "user"), prompt=False)
"message 2 is the user's, where the assistant's turn comes (user and assistant take turns, the user first)"
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.streams import codec_of
from tokenkit.common import jsonsafe, readfile
from tokenkit.common.errors import FileError
from tokenkit.common.messages import short

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_MESSAGES",
    "ROLES",
    "Conversation",
    "Message",
    "check_order",
    "iter_conversations",
    "read_conversations",
]

ROLES = ("system", "user", "assistant")
MAX_FILE_BYTES = 4 * readfile.GIB  # UltraChat's 200k conversations are 1.4 GB; read a line at a time
MAX_LINE_BYTES = 64 * readfile.MIB  # one conversation: far beyond any context a model reads
MAX_MESSAGES = 10_000  # turns in one conversation
# A message costs two JSON values (role, content) and its object one more; a few extra keys each:
MAX_JSON_VALUES = 8 * MAX_MESSAGES
WHAT = "a JSONL file of conversations"


@dataclass(frozen=True)
class Message:
    """One turn: `role` is one of ROLES, `content` its text."""

    role: str
    content: str


@dataclass(frozen=True)
class Conversation:
    """Checked messages in order (see the module docstring); `line`: the line of the file it was
    read from (0 when it was made in code)."""

    messages: tuple[Message, ...]
    line: int = 0

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(m.role for m in self.messages)

    @classmethod
    def of(cls, messages: Sequence[Mapping | Message], *, prompt: bool = False, line: int = 0) -> Conversation:
        """A conversation from HF-style message dicts (or Messages), checked; TokenizerError
        saying what is wrong otherwise (`prompt`: it must end with the user's turn)."""
        problem, parsed = _parse_messages(messages)
        problem = problem or check_order(tuple(m.role for m in parsed), prompt=prompt)
        if problem:
            raise TokenizerError(f"the conversation's {problem}")
        return cls(tuple(parsed), line)


def check_order(roles: Sequence[str], *, prompt: bool) -> str | None:
    """What is wrong with the order of `roles` (each one of ROLES), or None: system first if
    at all, then user and assistant in turns, the user first; ending with the assistant's answer,
    or with the user's turn for a `prompt`."""
    if not roles:
        return "messages are empty; a conversation holds at least a user turn" + (
            "" if prompt else " and the assistant's answer"
        )
    start = 1 if roles[0] == "system" else 0
    for i, role in enumerate(roles[start:], start):
        expected = "user" if (i - start) % 2 == 0 else "assistant"
        if role != expected:
            if role == "system":
                return f"message {i + 1} is a system message; only the first message may be the system's"
            after = "after the system message, " if start else ""
            return (
                f"message {i + 1} is the {role}'s, where the {expected}'s turn comes "
                f"({after}user and assistant take turns, the user first)"
            )
    last = roles[-1]
    if prompt and last != "user":
        whose = "the system message" if last == "system" else "the assistant's answer"
        return (
            f"last message is {whose}; a prompt ends with the user's turn, for the assistant to answer "
            "(without the generation prompt, a conversation ends with the answer)"
        )
    if not prompt and last != "assistant":
        whose = "the system message" if last == "system" else "the user's turn"
        return (
            f"last message is {whose}; a conversation ends with the assistant's answer "
            "(a prompt that ends with the user's turn is rendered with the generation prompt)"
        )
    return None


def _json_type(value) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _parse_messages(messages) -> tuple[str | None, list[Message]]:
    """(what is wrong, or None; the messages read so far) of a "messages" value."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        return f'"messages" is {_json_type(messages)}, not a list of messages', []
    if len(messages) > MAX_MESSAGES:
        return f"{len(messages):,} messages are more than the {MAX_MESSAGES:,} a conversation may hold", []
    parsed = []
    for i, m in enumerate(messages, 1):
        if isinstance(m, Message):
            role, content = m.role, m.content
        elif isinstance(m, Mapping):
            if "role" not in m or "content" not in m:
                lacks = " and ".join(repr(k) for k in ("role", "content") if k not in m)
                return f'message {i} has no {lacks}; each message is {{"role": ..., "content": ...}}', parsed
            role, content = m["role"], m["content"]
        else:
            return f"message {i} is {_json_type(m)}, not an object with a role and a content", parsed
        if role not in ROLES:
            shown = short(role) if isinstance(role, str) else _json_type(role)
            return f"message {i} has the role {shown}; the roles are {', '.join(ROLES)}", parsed
        if not isinstance(content, str):
            return f"message {i}'s content is {_json_type(content)}, not a string", parsed
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as err:
            return (
                f"message {i}'s content holds a lone surrogate (\\u{ord(content[err.start]):04x}), "
                "which is not Unicode text"
            ), parsed
        parsed.append(Message(role, content))
    return None, parsed


def iter_conversations(path: str | os.PathLike, *, prompt: bool = False) -> Iterator[Conversation]:
    """Each conversation of a JSONL file, in order, checked as it is read (see the module
    docstring); the first mistake is a TokenizerError naming `path` and its line, and ends the
    reading. Memory: one line at a time."""
    with readfile.open_regular(path, MAX_FILE_BYTES, WHAT) as (f, _):
        codec = codec_of(f.read(8))
        if codec is not None:
            raise TokenizerError(
                f"{path} is {codec}-compressed; decompress it first: conversations are read from plain JSONL"
            )
        f.seek(0)
        lineno = 0
        while raw := f.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            where = f"{path}:{lineno}"
            body = raw[:-1] if raw.endswith(b"\n") else raw
            if len(body) > MAX_LINE_BYTES:
                raise TokenizerError(
                    f"{where}: a line longer than {MAX_LINE_BYTES >> 20} MiB; each line holds one conversation"
                )
            if lineno == 1 and body.startswith(b"\xef\xbb\xbf"):  # a byte order mark
                body = body[3:]
            if not body.strip():
                continue
            yield _conversation(body, where, lineno, prompt)


def read_conversations(path: str | os.PathLike, *, prompt: bool = False) -> list[Conversation]:
    """Every conversation of a JSONL file (`iter_conversations`), all checked before any is
    returned."""
    return list(iter_conversations(path, prompt=prompt))


def _conversation(body: bytes, where: str, lineno: int, prompt: bool) -> Conversation:
    """One line's conversation; TokenizerError naming `where` otherwise."""
    try:
        record = jsonsafe.loads(body, where, max_items=MAX_JSON_VALUES)
    except FileError as err:
        raise TokenizerError(f'{err}; give one JSON object per line, {{"messages": [...]}}') from None
    if not isinstance(record, dict):
        raise TokenizerError(f'{where}: {_json_type(record)}, not an object with "messages"')
    if "messages" not in record:
        fields = ", ".join(short(k) for k in list(record)[:8]) + (", ..." if len(record) > 8 else "") or "none"
        raise TokenizerError(f'{where}: no "messages" (its fields: {fields}); each line is {{"messages": [...]}}')
    problem, parsed = _parse_messages(record["messages"])
    problem = problem or check_order(tuple(m.role for m in parsed), prompt=prompt)
    if problem:
        raise TokenizerError(f"{where}: {problem}")
    return Conversation(tuple(parsed), lineno)
