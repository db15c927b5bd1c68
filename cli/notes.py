"""What a command says on stderr besides its results: notes and warnings.

Results (tables, ids, generated text, summaries) go to stdout, so that a pipe gets only them;
what a user should know while they come goes here. `note` is a line as the packages word it,
`warn` a line about an input that may not be what was meant (shown even with --quiet), and
`notes(quiet)` the `say` callback the pipeline's functions take.

What it deliberately does not do: errors (`cli.commands` turns each into one line) or progress
bars (the packages draw them).
"""

from __future__ import annotations

from collections.abc import Callable

import click


def note(line: str) -> None:
    """`line` on stderr, as it is."""
    click.echo(line, err=True)


def warn(message: str) -> None:
    """`message` on stderr after "warning: "."""
    click.echo(f"warning: {message}", err=True)


def notes(quiet: bool) -> Callable[[str], None]:
    """`note`, or nothing with --quiet."""
    return (lambda line: None) if quiet else note


def once(say: Callable[[str], None]) -> Callable[[str], None]:
    """`say`, each distinct line said once: for commands whose steps read the same input (the
    pipeline's sample predicts, then generates, from one prompt)."""
    said: set[str] = set()

    def say_once(line: str) -> None:
        if line not in said:
            said.add(line)
            say(line)

    return say_once
