"""Building many small objects at once without CPython's cyclic garbage collector running meanwhile.

Reading a tokenizer.json of 280k merges makes hundreds of thousands of lists and tuples. CPython
(3.11) runs its collector every 700 new containers and, as they pile up, full collections over
every live object again and again; they find nothing, since parsed JSON and tuples of ids hold
no cycles. `paused()` turns the collector off for such a block and back on after it.

What it deliberately does not do: turn the collector on where the caller had turned it off, or
keep it off after the block (its next run collects whatever the block left).

>>> import gc
>>> with paused():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block, then as it was."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


__all__ = ["paused"]
