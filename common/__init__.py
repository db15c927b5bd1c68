"""What `bpe/`, `transformer/` and `pipeline/` share without importing each other: file safety
(one atomic writer, bounded readers), process hygiene (children that die with their parent) and
the garbage collector paused while a file's many small objects are built (`gcpause`).

What it deliberately does not do: any tokenizer or model math, or decide what a file holds.
"""

from tokenkit.common.errors import FileError

__all__ = ["FileError"]
