"""Progress bars, the one place they are made: tqdm on stderr, hidden with --quiet, when stderr is
not a terminal, or when the caller says so (an MPI rank but the first, a --json run).

tqdm is imported on the first bar, not with this module: its import costs tens of milliseconds
(its version lookup reads package metadata), and `tk encode TEXT` or any `--help` draws none.

What it does not do: decide what is long enough to deserve a bar (the callers do).
"""

from __future__ import annotations

import sys


def bar(*, desc: str, total: float | None = None, unit: str = "B", quiet: bool = False, **options):
    """A tqdm bar (a context manager with `update(n)`); bytes are shown scaled (KB, MB).
    `options` are tqdm's (initial, dynamic_ncols, ...)."""
    from tqdm import tqdm

    scaled = {"unit_scale": True} if unit == "B" else {}
    return tqdm(total=total, desc=desc, unit=unit, disable=quiet or not sys.stderr.isatty(), **scaled, **options)


def print_line(line: str) -> None:
    """One line to stderr without breaking a running bar (a bar's own tqdm.write when tqdm is loaded)."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is None:
        print(line, file=sys.stderr)
    else:
        tqdm.tqdm.write(line, file=sys.stderr)
