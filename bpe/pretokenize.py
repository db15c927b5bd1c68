"""Pre-tokenization: split text into chunks, and count the distinct chunks of a whole corpus.

A split pattern cuts text into chunks ("Hello", " world", "!"); BPE merges never cross a chunk
boundary. Patterns, by name (bpe/patterns.py holds them; their names are re-exported here):

- "gpt2": GPT-2's pattern (the default).
- "gpt4": GPT-4's (tiktoken's cl100k_base) pattern; "cl100k" is an alias.
- "none": no splitting. Each document (each file, text or JSONL record) is one chunk, so merges
  may span spaces and newlines — only the boundary between two documents is never crossed. Nothing repeats
  to be counted, so memory follows the corpus size; the trainer still only touches the merge
  sites of each merge, never the whole chunk.
- anything else: a custom regex for the `regex` module. Text it does not match is kept as
  chunks of its own (the gaps between matches), so no byte is ever dropped.

`count_chunks` reads the corpus through `bpe.corpus` in pieces of about a megabyte and counts
them in worker processes. A piece ends only where the built-in patterns always end a chunk
(`find_cut` of bpe/cut.py: the one rule for where text may be cut, here and wherever a file is
cut for parallel or MPI work), so the counts equal those of splitting each document at once
(tested). Custom patterns and "none" cannot promise such places: there each document is one piece.

Bytes, not text: input is decoded as UTF-8 with errors="surrogateescape" and every chunk is
encoded back the same way, so invalid UTF-8 is split and counted as its exact bytes.

What this module deliberately does not do: learn merges (bpe/trainer.py), encode to ids, or
read files other than through `bpe.corpus`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator

from tokenkit.bpe.corpus import as_corpus
from tokenkit.bpe.cut import find_cut
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.patterns import BUILTIN, GPT2_PATTERN, GPT4_PATTERN, PATTERNS, compile_pattern, resolve_pattern
from tokenkit.bpe.words import GPT2_ASCII, regular_word, split_words
from tokenkit.common import pool, processes, progress
from tokenkit.common.messages import one_line

# The pattern names and find_cut are re-exported: callers have always found them here.
__all__ = [
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "PATTERNS",
    "count_chunks",
    "custom_pattern_timeout",
    "find_cut",
    "resolve_pattern",
    "split_text",
]

_PIECE_BYTES = 1 << 20  # ~1 MiB per piece: enough to amortise a worker round trip, small enough to balance


def split_text(text: str, pattern: str | None) -> list[str]:
    """Cut `text` into chunks with `pattern` (a name or a regex, see `resolve_pattern`).

    The chunks always join back to `text`.

    >>> split_text("Hello world, it's 2024!", "gpt2")
    ['Hello', ' world', ',', ' it', "'s", ' 2024', '!']
    >>> split_text("a b", "none")
    ['a b']
    """
    pattern = resolve_pattern(pattern)
    if pattern is None:
        return [text] if text else []
    rx = compile_pattern(pattern)
    if pattern in BUILTIN:  # they match every character, so the matches are the whole split
        return rx.findall(text)
    # A custom pattern is data (it may come from a tokenizer file): it runs with a time limit, so
    # that a catastrophically backtracking regex is an error instead of a hang.
    limit = custom_pattern_timeout(len(text))
    chunks = []
    done = 0
    try:
        for m in rx.finditer(text, timeout=limit):
            start, end = m.span()
            if start == end:
                continue
            if start > done:
                chunks.append(text[done:start])
            chunks.append(text[start:end])
            done = end
    except TimeoutError:
        shown = repr(pattern) if len(pattern) <= 60 else repr(pattern[:50]) + "..."
        raise TokenizerError(
            f"the split pattern {shown} takes too long on this text (over {limit:.0f} s for {len(text):,} "
            "characters: catastrophic backtracking, e.g. nested quantifiers like (a|aa)+); simplify the "
            "regex or use gpt2, gpt4 or none"
        ) from None
    if done < len(text):
        chunks.append(text[done:])
    return chunks


# Time limit of a custom pattern on a text: 1 s, plus 4 s per million characters, ten times what
# sane patterns need (BENCHMARKS.md); a catastrophically backtracking one (exponential) hits it.
_TIMEOUT_BASE_S = 1.0
_TIMEOUT_PER_CHAR_S = 4e-6


def custom_pattern_timeout(n_chars: int) -> float:
    """Seconds a custom split pattern may take on a text of n_chars characters.

    >>> custom_pattern_timeout(0), custom_pattern_timeout(1_000_000)
    (1.0, 5.0)
    """
    return _TIMEOUT_BASE_S + _TIMEOUT_PER_CHAR_S * n_chars


def count_chunks(
    sources,
    pattern: str | None,
    *,
    workers: int | None = None,
    quiet: bool = False,
) -> dict[bytes, int]:
    """Count every distinct chunk of the corpus: {chunk bytes: occurrences}.

    sources: a `bpe.corpus.Corpus`, or what one is made of (file paths, directories, "-", texts
    as bytes; one or a list). Each document (file, text, JSONL record) is split on its own, as
    if it ended the text. `pattern` is a name or a regex (see `resolve_pattern`). workers:
    processes that split and count (default: all cores; 1 counts in this process). A progress
    bar follows the bytes read.

    Raises TokenizerError for a missing file, a device, or a corpus without a single byte.

    >>> count_chunks([b"to be or not to be"], "gpt2", workers=1)
    {b' be': 2, b' not': 1, b' or': 1, b' to': 1, b'to': 1}
    """
    corpus = as_corpus(sources)
    pattern = resolve_pattern(pattern)
    size = corpus.size  # None: not known before reading (streams, compressed files, JSONL)
    if size == 0:
        raise TokenizerError("the corpus is empty; give at least one file or text with some content")
    workers = processes.default_workers() if workers is None else workers
    if (wrong := processes.bad_worker_count(workers)) is not None:
        raise TokenizerError(wrong)
    piece_bytes = _PIECE_BYTES if pattern in BUILTIN else None
    if pattern is None:  # nothing to split: a worker would only copy each document twice
        workers = 1
    if size is not None:
        # More workers than pieces would only idle (and --workers 1000000 must not fork a million).
        workers = min(workers, 1 + size // (piece_bytes or max(size, 1)))

    pieces = (p.data for p in corpus.pieces(piece_bytes))
    batches = _batches(pieces, piece_bytes or _PIECE_BYTES)
    first = next(batches, None)
    second = next(batches, None)
    batches = _chain(first, second, batches)
    if workers == 1 or second is None:  # one batch: a worker would only add start-up time
        totals: Counter[str] = Counter()
        chunks: Counter[str] = Counter()
        with _bar(size, quiet) as bar:
            for batch in batches:
                for piece in batch:
                    _count_into(totals, piece, pattern)
                    bar.update(len(piece))
                _split_when_full(totals, chunks, pattern)
        chunks.update(_as_chunks(totals, pattern))
        totals = chunks
    else:
        totals = _count_in_workers(batches, pattern, workers, size, quiet)
    if not totals:
        raise TokenizerError("the corpus is empty; give at least one file or text with some content")
    # Sorted, so that the result does not depend on which worker finished first.
    return {chunk.encode("utf-8", "surrogateescape"): totals[chunk] for chunk in sorted(totals)}


def _batches(pieces: Iterator[bytes], batch_bytes: int) -> Iterator[list[bytes]]:
    """Pieces gathered into lists of about `batch_bytes`: many small documents (JSONL records)
    travel to a worker together."""
    batch: list[bytes] = []
    n = 0
    for piece in pieces:
        batch.append(piece)
        n += len(piece)
        if n >= batch_bytes:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


def _count_in_workers(
    batches: Iterator[list[bytes]], pattern: str | None, workers: int, total: int | None, quiet: bool
) -> Counter:
    """Hand batches of pieces to `workers` processes; each counts all its pieces into one Counter.

    One Counter per worker, sent back once at the end, instead of one per piece: merging
    Counters is a Python loop over their keys, and it would run in this (serial) process. The
    workers are common.pool's: an error, Ctrl-C or SIGTERM stops them at once.
    """
    try:
        # started before the progress bar, whose monitor thread a fork should not copy
        with pool.TaskPool(workers, _count_batch, init=_count_init, init_args=(pattern,), done=_counted) as p:
            with _bar(total, quiet) as bar:
                sizes: deque[int] = deque()  # of the batches handed out, in order

                def todo() -> Iterator[list[bytes]]:
                    for batch in batches:
                        sizes.append(sum(map(len, batch)))
                        yield batch

                for _ in p.map(todo(), window=2 * workers):
                    bar.update(sizes.popleft())
                parts = p.finish()
    except pool.PoolError as err:
        raise TokenizerError(f"a counting worker failed: {err}; try --workers 1") from None
    totals: Counter[str] = Counter()
    for part in parts:
        totals.update(part)
    return totals


# A counting worker's state: the pattern, and the counts of every batch it was handed (`_count_into`).
_worker_pattern: str | None = None
_worker_totals: Counter = Counter()
_worker_chunks: Counter = Counter()  # GPT-2's words already split (`_split_when_full`)


def _count_init(pattern: str | None) -> None:
    global _worker_pattern, _worker_totals, _worker_chunks
    _worker_pattern, _worker_totals, _worker_chunks = pattern, Counter(), Counter()


def _count_batch(batch: list[bytes]) -> None:
    """Count a batch in a worker; a failure goes back to the parent as one-line TokenizerError
    (a custom pattern over its time limit is one already)."""
    try:
        for piece in batch:
            _count_into(_worker_totals, piece, _worker_pattern)
        _split_when_full(_worker_totals, _worker_chunks, _worker_pattern)
    except TokenizerError:
        raise
    except Exception as err:
        raise TokenizerError(f"a counting worker failed: {one_line(err, named=True)}; try --workers 1") from None


def _counted() -> Counter:
    _worker_chunks.update(_as_chunks(_worker_totals, _worker_pattern))
    return _worker_chunks


# Distinct GPT-2 words a counter holds before they are split into chunks and dropped: prose
# repeats its words (10.8 MB of books: ~150k distinct), source code far less (its identifiers),
# and held whole, 200 MB of Python's words took 1.2 GB where its chunks take 350 MB.
_WORDS_HELD = 1 << 18


def _split_when_full(words: Counter, chunks: Counter, pattern: str | None) -> None:
    """Move what `_count_into` counted into `chunks` (split) once it holds _WORDS_HELD words."""
    if pattern == GPT2_PATTERN and len(words) > _WORDS_HELD:
        chunks.update(_as_chunks(words, pattern))
        words.clear()


def _bar(total: int | None, quiet: bool):
    return progress.bar(total=total, desc="counting", quiet=quiet)


def _chain(first, second, rest: Iterator) -> Iterator:
    for piece in (first, second):
        if piece is not None:
            yield piece
    yield from rest


def _count_into(totals: Counter, piece: bytes, pattern: str | None) -> None:
    """Split one piece and add its units to `totals` (keys stay str until the very end): its
    chunks, or for GPT-2's pattern its words, which `_as_chunks` splits once at the end."""
    text = piece.decode("utf-8", "surrogateescape")
    if pattern is None:
        totals[text] += 1
    elif pattern == GPT2_PATTERN:
        totals.update(split_words(text))  # a list: counted in C
    elif pattern in BUILTIN:
        totals.update(compile_pattern(pattern).findall(text))
    else:
        totals.update(split_text(text, pattern))


def _as_chunks(totals: Counter, pattern: str | None) -> Counter:
    """What `_count_into` counted, as chunk counts: GPT-2's words (`bpe.words`) split into their
    chunks, each distinct word once, in groups of words of the same count joined (regular words
    joined split into their own chunks), the ASCII ones by the stdlib's `re`. The words repeat
    far more than the text does (1 MB of English: 185k words, 25k distinct), so the split
    pattern, the costly part, runs over a fraction of the text (BENCHMARKS.md)."""
    if pattern != GPT2_PATTERN:
        return totals
    chunks: Counter[str] = Counter()
    by_count: dict[int, list[str]] = {}
    for word, n in totals.items():
        if regular_word(word):
            by_count.setdefault(n, []).append(word)
        else:  # a piece's first word, or its trailing whitespace: split alone
            for chunk in split_text(word, GPT2_PATTERN):
                chunks[chunk] += n
    split = compile_pattern(GPT2_PATTERN).findall
    for n, words in by_count.items():
        ascii_words = [w for w in words if w.isascii()]
        found = GPT2_ASCII.findall("".join(ascii_words))
        if len(ascii_words) < len(words):
            found += split("".join(w for w in words if not w.isascii()))
        if n == 1:
            chunks.update(found)
        else:
            for chunk, m in Counter(found).items():
                chunks[chunk] += m * n
    return chunks
