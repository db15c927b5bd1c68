"""What `tk explain` shows, as data: an `Explanation` is an ordered list of `Step`s, each one
intermediate of a forward pass with its labels and a note, JSON-ready through `to_dict`.

A step of a worked example may carry what the example printed (`Printed`) and whether that is the
exact value rounded to the printed digits, a slip of rounding, or wrong (`Printed.verdict`).

What it deliberately does not do: run anything (transformer/explain.py reads a model's trace,
transformer/explain_examples.py runs the worked examples), or print (cli/explain_render.py does).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenkit.transformer.errors import ModelError

# How a printed row compares with the exact one (`Printed.verdict`).
AGREES, ROUNDING, DIFFERS = "agrees", "rounding", "differs"
SLIP_UNITS = 1.5  # a rounding slip: the exact value rounded to the printed digits, off by one in the last
SLIP_SHARE = 0.01  # ... and by under 1% of the value (-0.1 printed for -0.2 is one unit, but wrong)


@dataclass(frozen=True)
class Printed:
    """A value as a seed document printed it, e.g. "[0.291, 0.454, 0.199, 0.056]".

    `verdict`, for the row's every number p against the exact x, in units u of p's last digit:
    - AGREES: |p - x| <= u/2, p is x rounded to the digits printed (the example's arithmetic holds
      at its own precision);
    - ROUNDING ("rounded differently"): not that, but every |p - x| <= 1.5 u (x rounded to the
      printed digits is p or one unit off) and <= 1% of |x|: a slip of rounding (the example
      rounded a step before and carried it on), the number right to its precision but one;
    - DIFFERS: any number further: the example's arithmetic went wrong.
    """

    text: str
    verdict: str

    @property
    def agrees(self) -> bool:
        return self.verdict == AGREES


_NUMBER = re.compile(r"-?\d+(?:\.(\d+))?")


def parse_printed(text: str) -> list[tuple[float, int]]:
    """The numbers of a seed's printed vector with their decimal places.

    >>> parse_printed("[−0.1, 0.40, 2]")
    [(-0.1, 1), (0.4, 2), (2.0, 0)]
    """
    return [(float(m.group(0)), len(m.group(1) or "")) for m in _NUMBER.finditer(text.replace("−", "-"))]


def printed(text: str, exact: np.ndarray) -> Printed:
    """Compare a seed's printed vector with the exact one (same length)."""
    numbers = parse_printed(text)
    exact = np.asarray(exact, dtype=np.float64).reshape(-1)
    if len(numbers) != exact.size:
        raise ValueError(f"printed {text!r} has {len(numbers)} numbers, the value has {exact.size}")
    # 1e-9 absorbs float64 noise on values that sit exactly on a rounding boundary
    pairs = [(abs(p - x), 10.0**-d, abs(x)) for (p, d), x in zip(numbers, exact, strict=True)]
    if all(off <= 0.5 * unit + 1e-9 for off, unit, _ in pairs):
        return Printed(text, AGREES)
    if all(off <= SLIP_UNITS * unit + 1e-9 and off <= SLIP_SHARE * size for off, unit, size in pairs):
        return Printed(text, ROUNDING)
    return Printed(text, DIFFERS)


@dataclass
class Step:
    """One intermediate of a forward pass.

    value: 0-, 1- or 2-D float64 array; -inf marks a masked attention score.
    rows / cols: labels of the axes (tokens, positions or dimension indices), None when unlabelled.
    note: what the step computes, in one or two sentences.
    seed: for a seed example, what the worked example printed: {row index: Printed} for a 2-D value (rows it
      did not print are absent), {None: Printed} for a 1-D value.
    """

    key: str
    title: str
    value: np.ndarray
    rows: list[str] | None = None
    cols: list[str] | None = None
    note: str = ""
    seed: dict[int | None, Printed] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready: arrays as nested lists, -inf / nan as null (JSON has no infinities)."""
        v = np.asarray(self.value, dtype=np.float64)
        out = {
            "key": self.key,
            "title": self.title,
            "note": self.note,
            "shape": list(v.shape),
            "rows": self.rows,
            "cols": self.cols,
            "value": json_array(v),
        }
        if self.seed:
            out["example_printed"] = [
                {"row": row, "text": p.text, "agrees": p.agrees, "verdict": p.verdict}
                for row, p in sorted(self.seed.items(), key=_row_key)
            ]
        return out


def _row_key(item):
    return -1 if item[0] is None else item[0]


def json_array(v: np.ndarray):
    """An array as nested lists of floats, -inf / inf / nan as None (JSON has no infinities).

    `tolist` builds the lists in C; only an array holding a non-finite value goes through an
    object array, where those cells become None (a GPT-2-sized explain is millions of numbers).

    >>> json_array(np.array([[1.0, -np.inf], [0.5, 2.0]]))
    [[1.0, None], [0.5, 2.0]]
    """
    v = np.asarray(v, dtype=np.float64)
    finite = np.isfinite(v)
    if finite.all():
        return v.tolist()
    cells = v.astype(object)
    cells[~finite] = None
    return cells.tolist()


@dataclass
class Explanation:
    """The steps of one forward pass, plus what the CLI needs around them.

    tokens: each position's text. attention: (H, T, T) weights of every head of the explained
    layer (for one heatmap panel per head). top: the last position's most likely next tokens as
    (id, label, probability, logit), best first (real models only). inside: the logit lens and
    direct logit attribution of a real model's pass (transformer/explain.py's `Inside`), computed
    when `to_dict` asks its `to_json()` for them (the keys `lens` and `attribution`; not with a
    `query`, which is one query's arithmetic).
    """

    title: str
    steps: list[Step]
    tokens: list[str]
    notes: list[str] = field(default_factory=list)
    layer: int = 0
    head: int = 0
    attention: np.ndarray | None = None
    top: list[tuple[int, str, float, float]] = field(default_factory=list)
    inside: Any = None

    def step(self, key: str) -> Step:
        for s in self.steps:
            if s.key == key:
                return s
        raise KeyError(key)

    def to_dict(self, query: int | None = None) -> dict:
        """JSON-ready. With `query` (a position), the steps with one row per token keep that row
        only, the others null (same shapes, a fiftieth of the text for 64 tokens): what one
        query's arithmetic reads. Keys and values stay whole: every query reads all of them."""
        doc = {
            "title": self.title,
            "notes": self.notes,
            "tokens": self.tokens,
            "layer": self.layer,
            "head": self.head,
            "steps": [s.to_dict() for s in self.steps],
            "attention_all_heads": None if self.attention is None else json_array(self.attention),
            "top": [{"id": i, "token": t, "probability": p, "logit": z} for i, t, p, z in self.top],
        }
        if query is None:
            return doc | ({} if self.inside is None else self.inside.to_json())
        T = len(self.tokens)
        if not 0 <= query < T:
            raise ModelError(f"query {query} is not a position of this text: it has {T} token(s), 0..{T - 1}")
        doc["query"] = query
        for step in doc["steps"]:
            whole = step["key"].endswith((".attn.k", ".attn.v", ".attn.k_pre")) or step["key"] == "rope_angle"
            if len(step["shape"]) == 2 and step["shape"][0] == T and not whole:
                step["value"] = [row if t == query else None for t, row in enumerate(step["value"])]
        if doc["attention_all_heads"] is not None:
            doc["attention_all_heads"] = [
                [row if t == query else None for t, row in enumerate(head)] for head in doc["attention_all_heads"]
            ]
        return doc


def token_labels(shown: Sequence[str]) -> list[str]:
    """Row/column labels that stay distinct when a token repeats: "0 'The'", "1 ' cat'" from
    each token as shown ("'The'", "' cat'")."""
    return [f"{i} {p}" for i, p in enumerate(shown)]


def dim_labels(n: int, prefix: str = "") -> list[str]:
    """Labels of n dimensions: "0", "1", ... (or "h0", "h1", ... with a prefix)."""
    return [f"{prefix}{j}" for j in range(n)]
