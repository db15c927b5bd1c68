"""Train a tokenizer on a whole corpus: count its chunks, learn the merges, report what happened.

What it does: the body of `Tokenizer.train`. The corpus's pre-token chunks are counted
(`bpe.pretokenize.count_chunks`, in worker processes, or over MPI ranks by `bpe.distributed`),
the merges are learnt from the counts (`bpe.trainer.train_merges`), and the tokenizer is built
with the class it is given, its file recording the settings, the stop reason and the first
MERGE_COUNTS merges' pair counts; `TrainReport` says how training went. With `verbose`, each
merge is printed as it is made (`describe_merge`), for learners watching training.

What it deliberately does not do: read the corpus (bpe/corpus.py), split it (bpe/pretokenize.py),
choose merges (bpe/trainer.py), or encode (the tokenizer counts the corpus's tokens, on first use).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tokenkit.bpe.corpus import Corpus, Source, as_corpus
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.patterns import resolve_pattern
from tokenkit.bpe.pretokenize import count_chunks
from tokenkit.bpe.show import token_repr
from tokenkit.bpe.trainer import train_merges
from tokenkit.common import progress

__all__ = ["MERGE_COUNTS", "TrainReport", "describe_merge", "train"]

MERGE_COUNTS = 1024  # merges whose pair count the tokenizer file records (a few KB; the rest are small)
T = TypeVar("T")  # the tokenizer class `train` builds (`bpe.tokenizer.Tokenizer`)


@dataclass
class TrainReport:
    """What happened during `Tokenizer.train`.

    merges_learned: number of merges; stop_reason: why training stopped (the trainer's words:
    "vocab_size", "min_frequency" or "no_pairs"); seconds: wall time of counting + merging;
    counts: the pair count of each merge, in rank order; unique_chunks: distinct pre-token
    chunks in the corpus; corpus_bytes: size of the corpus; corpus_tokens: its length in tokens
    under the new tokenizer, specials read as plain text (the trainer's final state: no
    encoding pass).
    """

    merges_learned: int
    stop_reason: str
    seconds: float
    counts: list[int] = field(repr=False)
    unique_chunks: int
    corpus_bytes: int
    corpus_tokens: int

    @property
    def bytes_per_token(self) -> float:
        return self.corpus_bytes / max(self.corpus_tokens, 1)


def describe_merge(vocab: Sequence[bytes], rank: int, pair: tuple[int, int], count: int) -> str:
    """One readable line per merge, for learners watching training.

    >>> describe_merge([bytes([i]) for i in range(256)], 0, (116, 104), 1234)
    "merge 0: 't' + 'h' -> 'th'  (id 256, count 1234)"
    """
    a, b = pair
    merged = f"{token_repr(vocab[a])} + {token_repr(vocab[b])} -> {token_repr(vocab[a] + vocab[b])}"
    return f"merge {rank}: {merged}  (id {256 + rank}, count {count})"


def train(
    cls: type[T],
    sources: Corpus | Source | Iterable[Source],
    *,
    vocab_size: int | None = None,
    min_frequency: int | None = 2,
    pattern: str = "gpt2",
    special_tokens: Iterable[str] = (),
    workers: int | None = None,
    verbose: bool = False,
    quiet: bool = False,
    on_merge: Callable[[int, tuple[int, int], int], None] | None = None,
    count: Callable[..., dict[bytes, int]] = count_chunks,
) -> T:
    """`Tokenizer.train`: merges learnt from a corpus, as a tokenizer of class `cls` carrying its
    `train_report`.

    sources: a `bpe.corpus.Corpus` (compressed files, JSONL, stdin, ...), or file paths,
    directories and texts (bytes), or one of them alone; merges never cross two documents
    (files, texts, JSONL records). vocab_size counts everything: 256 bytes + merges + special
    tokens. Training stops at vocab_size or when the best pair occurs fewer than min_frequency
    times, whichever comes first. on_merge(rank, pair, count) is called after each merge;
    verbose=True prints each merge to stderr instead. count(corpus, regex, workers=, quiet=)
    counts the chunks; `bpe.distributed` passes one that counts over MPI ranks.
    """
    specials = list(special_tokens)
    if vocab_size is not None and vocab_size < 256 + len(specials):
        need = f"256 byte tokens + {len(specials)} special tokens" if specials else "256 byte tokens"
        raise TokenizerError(f"vocab size {vocab_size} is too small: the {need} need at least {256 + len(specials)}")
    if min_frequency is not None and min_frequency < 1:
        raise TokenizerError(f"--min-frequency must be at least 1, got {min_frequency}")
    corpus = as_corpus(sources)
    regex_ = resolve_pattern(pattern)
    start = time.perf_counter()
    counts = count(corpus, regex_, workers=workers, quiet=quiet)
    if not counts:
        raise TokenizerError("the corpus is empty; give a file with some text")
    if verbose and on_merge is None:
        vocab = [bytes([i]) for i in range(256)]

        def on_merge(rank, pair, count):
            vocab.append(vocab[pair[0]] + vocab[pair[1]])
            progress.print_line(describe_merge(vocab, rank, pair, count))

    result = train_merges(
        counts,
        vocab_size=None if vocab_size is None else vocab_size - len(specials),
        min_frequency=min_frequency,
        quiet=quiet,
        on_merge=on_merge,
    )
    seconds = time.perf_counter() - start
    training = {
        "vocab_size": vocab_size,
        "min_frequency": min_frequency,
        "pattern": pattern,
        "special_tokens": specials,
        "merges_learned": len(result.merges),
        "stop_reason": result.stop_reason,
        "merge_counts": list(result.counts[:MERGE_COUNTS]),  # shown beside the first merges (tk serve)
    }
    tok = cls(result.merges, special_tokens=specials, pattern=pattern, training=training)
    tok.train_report = TrainReport(
        merges_learned=len(result.merges),
        stop_reason=result.stop_reason,
        seconds=seconds,
        counts=list(result.counts),
        unique_chunks=len(counts),
        corpus_bytes=sum(len(chunk) * n for chunk, n in counts.items()),
        corpus_tokens=result.tokens,
    )
    return tok
