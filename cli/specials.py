"""`--allow-special` and `--specials-as-text`: tiktoken's special-token policy as flags, defined
once for every command that encodes a user's text (`encode`, `predict-next`, `generate`,
`explain`; `train-model` and `pipeline` for the corpus and --val, `pipeline` for --prompt too).

By default text that looks like a special token is an error (it may be injected); the first flag
reads it as the special token, the second as plain text. A command decorated with
`special_options` gets the policy as `special_policy`, the keyword arguments of `Tokenizer.encode`
(and of `predict_next` / `generate`), and its errors about such text name these flags, which it
has, instead of the Python API's arguments. `policy_name` gives the policy's name in
`pipeline.names.SPECIALS` (a run's corpus records it).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from tokenkit.bpe.errors import DisallowedSpecialError
from tokenkit.pipeline.names import SPECIALS

ALLOW = "--allow-special"
AS_TEXT = "--specials-as-text"


def special_options(command):
    """Add ALLOW and AS_TEXT to a click command; it receives `special_policy` (allowed_special and
    disallowed_special for `Tokenizer.encode`) in their place."""

    @functools.wraps(command)
    def run(*args, allow_special: bool, specials_as_text: bool, **kwargs) -> Any:
        if allow_special and specials_as_text:
            raise click.UsageError(f"{ALLOW} and {AS_TEXT} exclude each other; pick one")
        special_policy = {
            "allowed_special": "all" if allow_special else (),
            "disallowed_special": () if specials_as_text else "all",
        }
        with flags_in_errors():
            return command(*args, special_policy=special_policy, **kwargs)

    run = click.option(AS_TEXT, is_flag=True, help="Encode text that looks like a special token as plain text.")(run)
    return click.option(
        ALLOW, is_flag=True, help="Read special tokens in the text as specials (otherwise such text is an error)."
    )(run)


@contextmanager
def flags_in_errors() -> Iterator[None]:
    """Inside: an error about a special token the text may not hold advises the flags."""
    try:
        yield
    except DisallowedSpecialError as err:
        raise err.advise(ALLOW, AS_TEXT) from None


def policy_name(special_policy: dict[str, Any]) -> str:
    """The name in SPECIALS ("refuse", "allow", "text") of a policy `special_options` gave."""
    return next(name for name, policy in SPECIALS.items() if policy == special_policy)
