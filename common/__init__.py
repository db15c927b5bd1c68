"""What `bpe/`, `transformer/` and `pipeline/` share without importing each other: file safety
(one atomic writer, bounded readers) and process hygiene (children that die with their parent).

What it deliberately does not do: any tokenizer or model math, or decide what a file holds.
"""

from tokenkit.common.errors import FileError

__all__ = ["FileError"]
