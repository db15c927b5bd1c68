"""Conversations as data (bpe/conversations.py): JSONL lines of {"messages": [...]}, read bounded.

The order rule is checked against a plain regular expression over every sequence of roles up to
length six; every class of bad line is one error naming its line, through the Python API and
through `tk encode --chat` (exit 1, one line, no traceback), wherever the line sits in the file.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
from pathlib import Path

import pytest

from tokenkit.bpe import Tokenizer, TokenizerError, conversations
from tokenkit.bpe.chat_template import add_chat_tokens
from tokenkit.bpe.conversations import ROLES, Conversation, Message, check_order, read_conversations
from tokenkit.cli.main import main
from tokenkit.common.errors import FileError

GOOD = {"messages": [{"role": "user", "content": "Who is the hero?"}, {"role": "assistant", "content": "Tom."}]}


def line(messages) -> str:
    return json.dumps({"messages": messages})


def msg(role, content="x") -> dict:
    return {"role": role, "content": content}


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------ the order


def reference_ok(roles: tuple[str, ...], prompt: bool) -> bool:
    """The order rule, plainly: an optional system message, then user/assistant pairs; a prompt
    has one more user turn, a conversation to train on at least one pair."""
    letters = "".join({"system": "s", "user": "u", "assistant": "a"}[r] for r in roles)
    return re.fullmatch(r"s?(ua)*u" if prompt else r"s?(ua)+", letters) is not None


@pytest.mark.parametrize("prompt", [False, True])
def test_order_rule_matches_the_reference_on_every_short_sequence(prompt):
    seen = {True: 0, False: 0}
    for n in range(7):
        for roles in itertools.product(ROLES, repeat=n):
            problem = check_order(roles, prompt=prompt)
            assert (problem is None) == reference_ok(roles, prompt), (roles, problem)
            seen[problem is None] += 1
            if problem is not None:
                assert "\n" not in problem and problem
    assert seen[True] >= 5 and seen[False] > 100  # both kinds, many times


def test_conversation_of_checks_and_keeps_messages():
    c = Conversation.of([msg("system", "be brief"), msg("user", "hi"), msg("assistant", "hello")])
    assert c.messages == (Message("system", "be brief"), Message("user", "hi"), Message("assistant", "hello"))
    assert Conversation.of([Message("user", "hi")], prompt=True).roles == ("user",)
    with pytest.raises(TokenizerError, match="ends with the assistant's answer"):
        Conversation.of([msg("user")])
    with pytest.raises(TokenizerError, match="role 'tool'"):
        Conversation.of([msg("user"), msg("tool")])


# ------------------------------------------------------------------------------------ reading


def test_a_file_reads_in_order_with_line_numbers(tmp_path):
    extra = {"prompt_id": "7", "messages": [msg("user", "a"), {**msg("assistant", "b"), "name": "bot"}]}
    lines = [
        json.dumps(GOOD),
        "",
        "   ",
        json.dumps(extra),
        line([msg("system", "s"), msg("user", "é 🙂"), msg("assistant", "")]),
    ]
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode("utf-8"))  # a BOM, and no final newline
    got = read_conversations(path)
    assert [c.line for c in got] == [1, 4, 5]
    assert got[0].messages == (Message("user", "Who is the hero?"), Message("assistant", "Tom."))
    assert got[1].messages == (Message("user", "a"), Message("assistant", "b"))  # other keys ignored
    assert got[2].messages[1].content == "é 🙂" and got[2].messages[2].content == ""


def test_crlf_lines_read_as_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\r\n".join([json.dumps(GOOD).encode(), b"", json.dumps(GOOD).encode(), b""]))
    assert [c.line for c in read_conversations(path)] == [1, 3]


def test_prompts_end_with_the_user(tmp_path):
    path = write(
        tmp_path / "p.jsonl",
        [line([msg("user", "q")]), line([msg("system"), msg("user"), msg("assistant"), msg("user")])],
    )
    assert [c.roles for c in read_conversations(path, prompt=True)] == [
        ("user",),
        ("system", "user", "assistant", "user"),
    ]
    with pytest.raises(TokenizerError, match=r"p\.jsonl:1: last message is the user's turn"):
        read_conversations(path)


# Every class of bad line: (the line, what its one-line error says).
BAD_LINES = {
    "not JSON": ('{"messages": [', "is not valid JSON"),
    "not UTF-8": (b'{"messages": "\xff"}', "is not UTF-8 text"),
    "an array": ("[1, 2]", "an array, not an object"),
    "no messages": ('{"conversation": []}', "no \"messages\" (its fields: 'conversation')"),
    "messages not a list": ('{"messages": {"role": "user"}}', '"messages" is an object, not a list'),
    "a message not an object": (line(["hi"]), "message 1 is a string, not an object"),
    "no role": (line([{"content": "x"}]), "message 1 has no 'role'"),
    "no content": (line([{"role": "user"}]), "message 1 has no 'content'"),
    "unknown role": (line([msg("user"), msg("tool")]), "message 2 has the role 'tool'; the roles are"),
    "a role not a string": (line([{"role": 3, "content": "x"}]), "message 1 has the role a number"),
    "content a number": (line([msg("user", 5)]), "message 1's content is a number, not a string"),
    "content null": (line([msg("user"), msg("assistant", None)]), "message 2's content is null"),
    "content a list": (line([msg("user", [{"type": "text"}])]), "message 1's content is an array"),
    "a lone surrogate": ('{"messages": [{"role": "user", "content": "\\ud800"}]}', "lone surrogate (\\ud800)"),
    "empty": (line([]), "messages are empty"),
    "system later": (line([msg("user"), msg("assistant"), msg("system")]), "message 3 is a system message"),
    "assistant first": (line([msg("assistant"), msg("user")]), "message 1 is the assistant's, where the user's"),
    "user twice": (line([msg("user"), msg("user"), msg("assistant")]), "message 2 is the user's"),
    "no assistant": (line([msg("user")]), "last message is the user's turn"),
    "system only": (line([msg("system")]), "last message is the system message"),
    "nested deep": ('{"messages": ' + "[" * 100 + "]" * 100 + "}", "nested deeper than"),
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
@pytest.mark.parametrize("at", [1, 4])
def test_every_bad_line_is_one_error_naming_its_line(tmp_path, kind, at):
    bad, says = BAD_LINES[kind]
    good = json.dumps(GOOD).encode()
    lines = [good, b"", good, good]
    lines.insert(at - 1, bad if isinstance(bad, bytes) else bad.encode())
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TokenizerError) as err:
        read_conversations(path)
    message = str(err.value)
    assert message.startswith(f"{path}:{at}"), message
    assert says in message and "\n" not in message


def test_a_prompt_that_ends_with_the_answer_is_refused(tmp_path):
    path = write(tmp_path / "c.jsonl", [json.dumps(GOOD)])
    with pytest.raises(TokenizerError, match=r":1: last message is the assistant's answer; a prompt ends"):
        read_conversations(path, prompt=True)


def test_bounds_are_checked_before_reading(tmp_path, monkeypatch):
    path = write(tmp_path / "c.jsonl", [json.dumps(GOOD), line([msg("user", "y" * 200), msg("assistant")])])
    monkeypatch.setattr(conversations, "MAX_LINE_BYTES", 150)
    with pytest.raises(TokenizerError, match=r"c\.jsonl:2: a line longer than"):
        read_conversations(path)
    monkeypatch.undo()
    many = [msg("user"), msg("assistant")] * 3
    write(path, [json.dumps(GOOD), line(many)])
    monkeypatch.setattr(conversations, "MAX_MESSAGES", 5)
    with pytest.raises(TokenizerError, match=r"c\.jsonl:2: 6 messages are more than the 5"):
        read_conversations(path)
    monkeypatch.setattr(conversations, "MAX_JSON_VALUES", 6)
    with pytest.raises(TokenizerError, match=r"c\.jsonl:2 holds .* JSON values or more"):
        read_conversations(path)
    monkeypatch.setattr(conversations, "MAX_FILE_BYTES", 10)
    with pytest.raises(FileError, match="more than a JSONL file of conversations can be"):
        read_conversations(path)


def test_what_is_not_a_plain_file_is_refused(tmp_path):
    with pytest.raises(FileError, match="is a directory, not a regular file"):
        read_conversations(tmp_path)
    with pytest.raises(FileError, match="no such file"):
        read_conversations(tmp_path / "missing.jsonl")
    packed = tmp_path / "c.jsonl.gz"
    packed.write_bytes(gzip.compress(json.dumps(GOOD).encode()))
    with pytest.raises(TokenizerError, match="is gzip-compressed; decompress it first"):
        read_conversations(packed)


# ------------------------------------------------------------------------------------ the CLI


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory) -> Path:
    tok = Tokenizer.train([b"who is the hero? the hero is tom. " * 50], vocab_size=300, quiet=True)
    path = tmp_path_factory.mktemp("tok") / "chat.safetensors"
    add_chat_tokens(tok).save(path)
    return path


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_the_cli_says_a_bad_line_in_one_line(tmp_path, capsys, chat_tok, kind):
    bad, says = BAD_LINES[kind]
    path = tmp_path / "c.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + (bad if isinstance(bad, bytes) else bad.encode()) + b"\n")
    code = main(["encode", "-t", str(chat_tok), "--chat", str(path), "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""  # nothing printed before every line was checked
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:2") and says in lines[0], err
    assert "Traceback" not in err
