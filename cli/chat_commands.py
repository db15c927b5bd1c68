"""`tk chat`: a conversation with a model fine-tuned for chat, at a terminal or line by line for scripts.

Each stdin line is a user's message; the answer streams to stdout as it is generated
(`pipeline.chat_session.ChatSession`, which keeps the KV cache between turns). A line that starts
with / is a command: /reset, /system TEXT, /quit (// starts a message with one /). With --json,
each line is a message as text or as a JSON object (`{"role": "user"|"system", "content": ...}`)
and each answer one JSON line. Notes (old turns dropped, an answer cut at --max-new-tokens, a
line refused) go to stderr at a terminal; in --json mode a refused line's answer is
`{"error": ..., "line": N}`, so that a script reading an answer per message stays in step, and
the exit status is 1 when any line was refused.

Bounds: a line is read up to MAX_LINE_BYTES (the rest of a longer one is skipped, and the line
refused), a JSON line's parse at most MAX_JSON_VALUES values (`common.jsonsafe.loads`).

What it deliberately does not do: line editing or history (the terminal's own), or save the
conversation anywhere.
"""

from __future__ import annotations

import json
import sys

import click

from tokenkit.cli.notes import note
from tokenkit.cli.options import (
    check_device,
    device_option,
    json_option,
    max_new_tokens_option,
    model_option,
    sampling_options,
    tokenizer_option,
)

MAX_LINE_BYTES = 1 << 20  # one message: far beyond the context of any model tk runs on a CPU
MAX_JSON_VALUES = 64  # a message object: role, content and a few more keys
COMMANDS_HELP = "/reset, /system TEXT, /quit"


@click.command("chat")
@model_option()
@tokenizer_option()
@max_new_tokens_option("most tokens in one answer", default=200)
@sampling_options
@click.option("--system", "system", metavar="TEXT", help="the system message the conversation starts with")
@json_option(
    'for scripts: each stdin line is a message (text, or {"role": "user"|"system", "content": ...}); '
    'each answer one JSON line {"role", "content", "ids", "stop", "dropped_turns"}'
)
@device_option
def chat_command(
    model_path, tokenizer_path, max_new_tokens, temperature, top_k, top_p, seed, system, as_json, device
) -> int:
    """Talk with a model fine-tuned for chat: each line a message, the answer streaming as it comes.

    Earlier turns are not recomputed (the KV cache is kept between turns); when the context
    fills, the oldest turns are dropped, after the system message, and a note says so. Commands:
    /reset (forget the turns), /system TEXT (the system message; /system alone removes it),
    /quit (or Ctrl-D). A message that starts with / is typed //.

    \b
    Example:
      tk chat -m runs/chat
      tk chat -m runs/chat --temperature 0 --system "Answer in one word."
      printf '%s\\n' 'Who found the ball?' | tk chat -m runs/chat --json
    """
    from tokenkit.pipeline.chat_session import ChatSession, not_for_chat
    from tokenkit.pipeline.errors import PipelineError
    from tokenkit.pipeline.run import load_model_and_tokenizer

    check_device(device)
    model, tok = load_model_and_tokenizer(model_path, tokenizer_path, device=device)
    reason = not_for_chat(tok, str(model_path))
    if reason:
        raise PipelineError(reason)
    session = ChatSession(
        model,
        tok,
        system=system,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        max_new_tokens=max_new_tokens,
        where=str(model_path),
    )
    try:
        with _signal_reader(sys.stdin.buffer) as stdin:
            if as_json:
                return _json_session(session, stdin)
            at_terminal = stdin.isatty()
            if at_terminal:
                where = f"{model_path} (a context of {session.context} tokens)"
                note(f"chatting with {where}; {COMMANDS_HELP}, Ctrl-D ends")
            _text_session(session, stdin, at_terminal)
            return 0
    finally:
        session.close()


def _signal_reader(stream):
    """`stream` read so that Ctrl-C always interrupts the wait for a line (common/signal_reads.py);
    a stream without a descriptor (a test's bytes) as it is."""
    import contextlib
    import io

    from tokenkit.common.signal_reads import SignalReader

    try:
        stream.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return contextlib.nullcontext(stream)
    return SignalReader(stream)


def read_lines(stream, limit: int = MAX_LINE_BYTES):
    """(line number, text or None, what is wrong or None) for each line of the binary `stream`,
    without its end of line; a line past `limit` bytes is skipped to its end, unread."""
    lineno = 0
    while raw := stream.readline(limit + 1):
        lineno += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            while (more := stream.readline(limit)) and not more.endswith(b"\n"):
                pass
            yield lineno, None, f"a line longer than {limit >> 20} MiB; a message is at most that"
            continue
        body = raw.rstrip(b"\r\n")
        if lineno == 1 and body.startswith(b"\xef\xbb\xbf"):  # a byte order mark
            body = body[3:]
        try:
            yield lineno, body.decode("utf-8"), None
        except UnicodeDecodeError:
            yield lineno, None, "not UTF-8 text; messages are UTF-8"


def _command(session, text: str):
    """Run the slash command `text`: ("quit" | "reset" | "system", its JSON answer), or (None,
    the note saying it is unknown)."""
    name, _, rest = text.partition(" ")
    if name in ("/quit", "/exit"):
        return "quit", None
    if name == "/reset":
        session.reset()
        return "reset", {"reset": True, "system": session.system}
    if name == "/system":
        content = rest.strip() or None
        ids = session.set_system(content)
        return "system", {"role": "system", "content": content, "ids": ids}
    return None, f"unknown command {name}; the commands are {COMMANDS_HELP} (a message that starts with / is typed //)"


def _text_session(session, stdin, at_terminal: bool) -> None:
    """The conversation at a terminal (or from a pipe of plain lines): answers stream to stdout."""
    from tokenkit.pipeline.errors import PipelineError

    def prompt():
        if at_terminal:
            click.echo("> ", nl=False)

    prompt()
    for lineno, text, problem in read_lines(stdin):
        where = "" if at_terminal else f"line {lineno}: "
        if problem or not text.strip():
            if problem:
                note(f"error: {where}{problem}")
            prompt()
            continue
        if text.startswith("/") and not text.startswith("//"):
            try:
                done, said = _command(session, text)
            except PipelineError as err:
                done, said = "", f"error: {where}{err}"
            if done == "quit":
                return
            if done == "reset":
                note("the conversation was reset" + (" (the system message stays)" if session.system else ""))
            elif done == "system":
                note("the system message is removed" if said["content"] is None else "the system message is set")
            else:
                note(said if said.startswith("error") else f"{where}{said}")
            prompt()
            continue
        try:
            _stream(session, text[1:] if text.startswith("//") else text)
        except PipelineError as err:
            note(f"error: {where}{err}")
        prompt()


def _stream(session, text: str) -> None:
    """One answer, streamed; the notes it brings after its line."""
    from tokenkit.pipeline.chat_session import Dropped, Reply, Token

    later = []
    started = False
    for event in session.reply(text):
        if isinstance(event, Token):
            if event.text:
                click.echo(event.text, nl=False)
                started = True
        elif isinstance(event, Dropped):
            if started:  # mid-answer: said after its line
                later.append(event.message())
            else:
                note(event.message())
        elif isinstance(event, Reply):
            click.echo(event.rest)
            if event.stop == "length":
                later.append(f"note: the answer reached --max-new-tokens ({session.max_new_tokens})")
            elif event.stop == "context":
                later.append(f"note: the answer filled the model's context ({session.context} tokens)")
    for line in later:
        note(line)


def _json_message(text: str, lineno: int):
    """A JSON line's (role, content); PipelineError naming the line when it is not a message."""
    from tokenkit.common import jsonsafe
    from tokenkit.common.errors import FileError
    from tokenkit.pipeline.errors import PipelineError

    what = f"line {lineno}"
    try:
        value = jsonsafe.loads(text, what, max_items=MAX_JSON_VALUES)
    except FileError as err:
        raise PipelineError(f'{err}; a JSON line is {{"role": "user", "content": ...}}') from None
    if not isinstance(value, dict) or "role" not in value or "content" not in value:
        raise PipelineError(f'{what}: not a message; a JSON line is {{"role": "user"|"system", "content": ...}}')
    role, content = value["role"], value["content"]
    if role not in ("user", "system"):
        shown = json.dumps(role, ensure_ascii=False)[:40]
        raise PipelineError(
            f"{what}: the role {shown}; a line gives the user's message or the system's "
            "(the assistant's are the model's)"
        )
    if not isinstance(content, str) and not (role == "system" and content is None):
        raise PipelineError(f"{what}: the content is not a string")
    return role, content


def _json_session(session, stdin) -> int:
    """--json: an answer line per message line; 1 when any line was refused."""
    from tokenkit.pipeline.chat_session import Dropped, Reply
    from tokenkit.pipeline.errors import PipelineError

    def say(doc: dict) -> None:
        click.echo(json.dumps(doc, ensure_ascii=False))

    refused = 0
    for lineno, text, problem in read_lines(stdin):
        if text is not None and not text.strip():
            continue
        try:
            if problem:
                raise PipelineError(f"line {lineno}: {problem}")
            if text.lstrip().startswith("{"):
                role, content = _json_message(text, lineno)
            elif text.startswith("/") and not text.startswith("//"):
                done, answer = _command(session, text)
                if done == "quit":
                    break
                if done is None:
                    raise PipelineError(f"line {lineno}: {answer}")
                say(answer)
                continue
            else:
                role, content = "user", text[1:] if text.startswith("//") else text
            if role == "system":
                say({"role": "system", "content": content, "ids": session.set_system(content)})
                continue
            dropped = 0
            for event in session.reply(content):
                if isinstance(event, Dropped):
                    dropped += event.turns
                elif isinstance(event, Reply):
                    say({**event.as_json(), "dropped_turns": dropped})
        except PipelineError as err:
            refused += 1
            message = str(err) if str(err).startswith(f"line {lineno}") else f"line {lineno}: {err}"
            say({"error": message, "line": lineno})
    sys.stdout.flush()
    if refused:
        note(f"error: {refused} line{'s' if refused > 1 else ''} refused (each answer says why)")
        return 1
    return 0


COMMANDS = (chat_command,)
