"""Numeric flags: every one parsed by `Number`, which refuses NaN, infinities and values out of
its `transformer.config.Range` before the command does any work, in the words `TrainConfig` uses
for a settings file ("--lr must be a finite number, got inf").

What it deliberately does not do: know what a flag means; the ranges come from TrainConfig's
field metadata (training flags) or are given where a command declares its flag.
"""

from __future__ import annotations

import click

from tokenkit.transformer.config import Range


class Number(click.ParamType):
    """An int or a float flag within `allowed`.

    >>> Number(float, Range(0, 1, low_open=True)).convert("0.5", None, None)
    0.5
    """

    def __init__(self, kind: type, allowed: Range) -> None:
        self.kind = kind
        self.allowed = allowed
        self.name = "integer" if kind is int else "float"

    def convert(self, value, param, ctx):
        if isinstance(value, self.kind) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = self.kind(value)  # int("1e5") fails: a count is written out
            except (ValueError, OverflowError):
                kind = "a whole number" if self.kind is int else "a number"
                self.fail(f"{_shown(value)} is not {kind}", param, ctx)
        problem = self.allowed.problem(number)
        if problem is not None:
            flag = max(param.opts, key=len) if param is not None else "the value"
            # UsageError, not BadParameter: the line reads as TrainConfig's ("--lr must be ...")
            raise click.UsageError(f"{flag} {problem}, got {_shown(value)}", ctx)
        return number


def _shown(value) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:30] + "..."


def count(low: int = 0, high: int | None = None) -> Number:
    """A whole-number flag from `low` to `high`."""
    return Number(int, Range(low, high))


def real(low: float | None = None, high: float | None = None, **ends: bool) -> Number:
    """A finite float flag from `low` to `high` (`low_open`, `high_open` exclude an end)."""
    return Number(float, Range(low, high, **ends))
