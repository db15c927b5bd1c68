"""Tokenizers side by side on a corpus (`tk eval -t`): how much text each token carries.

Per tokenizer, over the documents given (and per group of them: a language, say):
- bytes per token: the documents' UTF-8 bytes over their tokens. More bytes per token is fewer
  tokens for the same text: more text in a model's context, less compute per byte;
- tokens per word: tokens over whitespace-separated words (`str.split()`, Unicode whitespace).
  Scripts written without spaces (Chinese, Japanese) have few such words, so there the figure
  compares tokenizers and nothing else;
- vocabulary used: the share of the tokenizer's ordinary tokens (ids that stand for bytes, special
  tokens aside) that appear at least once;
- single-byte share: the share of the bytes left as tokens of one byte, the text no merge reached
  (a script a byte-level BPE tokenizer never learned falls apart into its bytes);
- the longest token seen (the lowest id among equally long ones), and encode speed: the
  documents' bytes over the seconds `Tokenizer.encode_raw` took on them (MB = 10^6 bytes): its
  tables built beforehand (`Tokenizer.warm_up`, once per tokenizer), its cache of chunks cold at
  the start as in a fresh process.

Each document is encoded once by each tokenizer as `Tokenizer.encode` encodes it: the text's own
ids (no BOS), under one special-token policy. A special token in the ids counts as a token and
toward nothing else.

>>> tok = Tokenizer([(97, 97)])                          # "aa" -> 256
>>> figures = compare([tok], [(None, b"aaa ab")]).total[0]
>>> figures.tokens, figures.words, figures.single_byte, figures.distinct, figures.longest
(5, 2, 4, 4, b'aa')

What it does not do: read files or load tokenizers (cli/eval_commands.py does), or print.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.show import token_str
from tokenkit.bpe.tokenizer import Tokenizer

__all__ = ["Comparison", "Figures", "compare", "token_lengths"]


def token_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """(vocab_size,) int64: the bytes each id stands for; 0 for a special token (a marker, not
    text) and for an id a listed vocabulary leaves without bytes.

    >>> token_lengths(Tokenizer([(104, 105)], special_tokens={"<|eot|>": 257}))[[104, 256, 257]].tolist()
    [1, 2, 0]
    """
    lengths = np.array([len(b) for b in tokenizer.layout.id_bytes], dtype=np.int64)
    lengths[list(tokenizer.special_tokens.values())] = 0
    return lengths


@dataclass
class Figures:
    """One tokenizer's counts over some documents, and the figures made of them (None where the
    denominator is 0: no words, no time measured)."""

    vocabulary: int  # ordinary tokens: ids that stand for bytes, special tokens aside
    documents: int = 0
    bytes: int = 0
    words: int = 0
    tokens: int = 0
    single_byte: int = 0  # tokens of one byte
    distinct: int = 0  # ordinary tokens seen at least once
    longest: bytes | None = None  # the longest ordinary token seen
    longest_id: int | None = None
    seconds: float = 0.0  # spent encoding

    @property
    def bytes_per_token(self) -> float | None:
        return self.bytes / self.tokens if self.tokens else None

    @property
    def tokens_per_word(self) -> float | None:
        return self.tokens / self.words if self.words else None

    @property
    def vocab_used(self) -> float | None:
        return self.distinct / self.vocabulary if self.vocabulary else None

    @property
    def single_byte_share(self) -> float | None:
        return self.single_byte / self.bytes if self.bytes else None

    @property
    def mb_per_s(self) -> float | None:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else None

    def to_dict(self) -> dict:
        """The counts and figures as JSON values (the longest token's text in `token_str`'s spelling)."""
        return {
            "tokens": self.tokens,
            "bytes": self.bytes,
            "words": self.words,
            "documents": self.documents,
            "bytes_per_token": self.bytes_per_token,
            "tokens_per_word": self.tokens_per_word,
            "vocabulary": self.vocabulary,
            "distinct_tokens": self.distinct,
            "vocab_used": self.vocab_used,
            "single_byte_tokens": self.single_byte,
            "single_byte_share": self.single_byte_share,
            "longest_token": None if self.longest is None else token_str(self.longest),
            "longest_token_bytes": None if self.longest is None else len(self.longest),
            "longest_token_id": self.longest_id,
            "seconds": self.seconds,
            "mb_per_s": self.mb_per_s,
        }


class _Tally:
    """The running counts of one tokenizer over one set of documents."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths  # per id: its bytes' length; 0 for a special token or an id with no bytes
        self.seen = np.zeros(len(lengths), dtype=bool)
        self.figures = Figures(vocabulary=int(np.count_nonzero(lengths)))

    def add(self, ids: np.ndarray, n_bytes: int, n_words: int, seconds: float) -> None:
        f = self.figures
        f.documents += 1
        f.bytes += n_bytes
        f.words += n_words
        f.tokens += len(ids)
        f.single_byte += int(np.count_nonzero(self.lengths[ids] == 1))
        f.seconds += seconds
        self.seen[ids] = True

    def finish(self, id_bytes: Sequence[bytes]) -> Figures:
        f = self.figures
        ordinary = self.seen & (self.lengths > 0)
        f.distinct = int(np.count_nonzero(ordinary))
        if f.distinct:
            longest = int(self.lengths[ordinary].max())
            f.longest_id = int(np.flatnonzero(ordinary & (self.lengths == longest))[0])
            f.longest = id_bytes[f.longest_id]
        return f


@dataclass
class Comparison:
    """`compare`'s answer: per tokenizer (in the order given), its figures over every document
    (`total`) and over each group's (`groups`, in the order the groups first appear)."""

    total: list[Figures]
    groups: dict[str, list[Figures]] = field(default_factory=dict)


def compare(
    tokenizers: Sequence[Tokenizer],
    documents: Iterable[tuple[str | None, bytes]],
    policy: Mapping = {},  # noqa: B006 (read, never changed)
    progress: Callable[[int], None] = lambda n: None,
) -> Comparison:
    """Encode each (group, UTF-8 bytes) document with every tokenizer and count (see the module's
    docstring); group None: the document counts in the total only. `policy`: `Tokenizer.encode`'s
    allowed_special and disallowed_special ("all" or none; text that looks like a special token is
    refused by default). `progress(n)` is told each document's bytes once all have encoded it.
    An empty corpus is a TokenizerError."""
    if not tokenizers:
        raise TokenizerError("no tokenizer to compare; give at least one")
    policies = [tok.special_policy(**policy) for tok in tokenizers]
    for tok in tokenizers:
        tok.warm_up()  # its tables, built once: not part of the encode speed
    lengths = [token_lengths(tok) for tok in tokenizers]
    total = [_Tally(n) for n in lengths]
    groups: dict[str, list[_Tally]] = {}
    for group, doc in documents:
        if not doc:
            continue  # as a Corpus skips an empty document
        text = doc.decode("utf-8", errors="surrogateescape")  # as `Tokenizer.encode` reads bytes
        words = len(text.split())
        tallies = [total] if group is None else [total, groups.setdefault(group, [_Tally(n) for n in lengths])]
        for i, (tok, tok_policy) in enumerate(zip(tokenizers, policies, strict=True)):
            start = time.perf_counter()
            raw = tok.encode_raw(text, tok_policy)
            seconds = time.perf_counter() - start
            ids = np.frombuffer(raw, dtype=tok.ids_dtype)
            for tally in tallies:
                tally[i].add(ids, len(doc), words, seconds)
        progress(len(doc))
    if total[0].figures.documents == 0:
        raise TokenizerError("the corpus is empty; give at least one file or text with some content")
    return Comparison(
        [t.finish(tok.layout.id_bytes) for t, tok in zip(total, tokenizers, strict=True)],
        {
            g: [t.finish(tok.layout.id_bytes) for t, tok in zip(tallies, tokenizers, strict=True)]
            for g, tallies in groups.items()
        },
    )
