"""Text and image rendering of a `transformer.explain.Explanation` for `tk explain`.

Tables are labelled with the actual tokens; a matrix larger than the corner limit prints as its
shape plus its top-left corner unless `full` is asked. Attention-weight tables get a row-sum
column (each row sums to 1). A worked example's row that the example printed is followed by what it
printed: "example: same" when that is the exact value rounded, the example's text otherwise.

What this module does not do: compute anything (transformer.explain does) or parse arguments.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import click
import numpy as np

from tokenkit.pipeline.checkpoint import atomic_path
from tokenkit.transformer.explanation import ROUNDING, Explanation, Step

CORNER = 8  # rows and columns shown of a large matrix without --full
LABEL_WIDTH = 16  # longest column label shown before it is cut


def _num(v: float, precision: int) -> str:
    if math.isinf(v):
        return "-inf" if v < 0 else "inf"
    text = f"{v:.{precision}f}"
    return "0." + "0" * precision if text == "-0." + "0" * precision else text  # no "-0.000"


def _cut(label: str, width: int = LABEL_WIDTH) -> str:
    return label if len(label) <= width else label[: width - 2] + ".."


def _table(row_labels: list[str], col_labels: list[str], cells: list[list[str]], notes: list[str]) -> list[str]:
    """Right-aligned columns under their labels; notes[i] is appended to row i."""
    lw = max((len(r) for r in row_labels), default=0)
    widths = [max([len(c)] + [len(row[j]) for row in cells]) for j, c in enumerate(col_labels)]
    lines = [" " * lw + "  " + "  ".join(c.rjust(w) for c, w in zip(col_labels, widths, strict=True))]
    for label, row, note in zip(row_labels, cells, notes, strict=True):
        lines.append(label.ljust(lw) + "  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + note)
    return lines


def render_step(step: Step, *, precision: int, full: bool) -> list[str]:
    v = np.asarray(step.value, dtype=np.float64)
    shape = " x ".join(map(str, v.shape)) or "scalar"
    lines = [f"-- {step.title}  [{shape}]"]
    if step.note:
        lines.append(f"   {step.note}")
    if v.ndim == 0:
        return lines + [_num(float(v), precision)]
    m = v[None, :] if v.ndim == 1 else v
    rows = step.rows if (v.ndim == 2 and step.rows) else [""] * m.shape[0]
    cols = step.cols or [str(j) for j in range(m.shape[1])]
    n_rows = m.shape[0] if full else min(m.shape[0], CORNER)
    n_cols = m.shape[1] if full else min(m.shape[1], CORNER)
    col_labels = [_cut(c) for c in cols[:n_cols]]
    cells = [[_num(float(x), precision) for x in m[i, :n_cols]] for i in range(n_rows)]
    if n_cols < m.shape[1]:
        col_labels.append("...")
        for row in cells:
            row.append("...")
    if step.key.endswith("weights"):  # the attention table: show that rows sum to 1 (over all columns)
        col_labels.append("row sum")
        for i, row in enumerate(cells):
            row.append(_num(float(m[i].sum()), precision))
    notes = []
    for i in range(n_rows):
        p = step.seed.get(None if v.ndim == 1 else i)
        if p is None or p.agrees:
            notes.append("" if p is None else "   example: same")
        else:  # a slip of rounding is not an error of the example's arithmetic (Printed.verdict)
            how = "rounded differently" if p.verdict == ROUNDING else "differs"
            notes.append(f"   example printed {p.text} ({how}; exact at left)")
    lines += _table(rows[:n_rows], col_labels, cells, notes)
    if n_rows < m.shape[0] or n_cols < m.shape[1]:
        lines.append(f"   (showing {n_rows} of {m.shape[0]} rows, {n_cols} of {m.shape[1]} columns; --full for all)")
    return lines


def render(expl: Explanation, *, precision: int, full: bool) -> str:
    """The whole explanation as text, step by step."""
    lines = [f"== {expl.title} =="]
    lines += [f"   {note}" for note in expl.notes]
    for step in expl.steps:
        lines.append("")
        lines += render_step(step, precision=precision, full=full)
    if expl.top:
        lines += ["", f"-- top {len(expl.top)} next-token candidates after {expl.tokens[-1]}"]
        cells = [[str(i), t, _num(p, precision), _num(z, precision)] for i, t, p, z in expl.top]
        lines += _table(
            [str(r + 1) for r in range(len(cells))], ["id", "token", "probability", "logit"], cells, [""] * len(cells)
        )
    return "\n".join(lines) + "\n"


def render_tokens(ids: Sequence[int], shown: Sequence[str], raw: Sequence[bytes]) -> str:
    """The tokenization: position, id, text and bytes (hex) of each token."""
    cells = [[str(i), p, b.hex(" ")] for i, p, b in zip(ids, shown, raw, strict=True)]
    lines = [f"-- tokens  [{len(cells)}]"]
    lines += _table([str(t) for t in range(len(cells))], ["id", "text", "bytes"], cells, [""] * len(cells))
    return "\n".join(lines) + "\n"


def plot_attention(
    weights: np.ndarray, rows: Sequence[str], cols: Sequence[str], path: str | os.PathLike, title: str
) -> int:
    """Heatmaps of weights (H, Tq, Tk), one panel per head in one row, token labels on both axes;
    written to `path` (PNG) atomically. Returns the number of panels.

    matplotlib is optional (the `plot` extra); without it this is a one-line ClickException.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        raise click.ClickException("--plot needs matplotlib: pip install 'tokenkit[plot]'") from None
    H, Tq, Tk = weights.shape
    size = max(2.5, 0.35 * max(Tq, Tk) + 1.5)
    fig, axes = plt.subplots(1, H, figsize=(size * H, size + 0.6), squeeze=False)
    try:
        for h, ax in enumerate(axes[0]):
            # fixed 0..1 colour scale, so panels (and plots) compare; no colour bar (see suptitle)
            ax.imshow(weights[h], vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
            ax.set_title(f"head {h}", fontsize=9)
            ax.set_xticks(range(Tk), [_cut(c, 12) for c in cols], rotation=90, fontsize=7)
            ax.set_yticks(range(Tq), [_cut(r, 12) for r in rows], fontsize=7)
            ax.set_xlabel("key", fontsize=8)
        axes[0][0].set_ylabel("query", fontsize=8)
        fig.suptitle(f"{title}  (colour: weight 0 dark .. 1 bright)", fontsize=9)
        fig.tight_layout()
        path = Path(path)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    return H
