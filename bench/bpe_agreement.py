"""Where tk's trainer and rustbpe's learn different merges, and why.

    python bench/bpe_agreement.py [--corpus ../shared/data/gutenberg/train.txt] [--vocab 8192]

Both learn byte-level BPE with GPT-2's split pattern on the same chunks (the text goes to rustbpe
in ~1 MB pieces cut where tk cuts, before a space after printable ASCII). The script prints how
many merged tokens the two vocabularies share, the first rank where the merge sequences part, and
for the first few parting ranks both picks with their counts at that moment (every chunk encoded
with the merges both made so far, then every adjacent pair counted, overlaps included as both
trainers count them): equal counts mean a tie, broken differently. Needs `pip install rustbpe`.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bpe_large import gpt2_pieces  # noqa: E402

from tokenkit.bpe import Tokenizer  # noqa: E402
from tokenkit.bpe.patterns import GPT2_PATTERN  # noqa: E402
from tokenkit.bpe.pretokenize import count_chunks  # noqa: E402


def rustbpe_tokens(text: str, vocab: int) -> list[bytes]:
    """rustbpe's merged tokens (ids 256 on), in rank order."""
    import rustbpe

    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(gpt2_pieces(text), vocab, pattern=GPT2_PATTERN)
    ranked = sorted(tok.get_mergeable_ranks(), key=lambda item: item[1])
    return [bytes(token) for token, rank in ranked if rank >= 256]


def pair_counts_after(counts: dict[bytes, int], merges: list[tuple[int, int]]) -> tuple[Counter, list[bytes]]:
    """Every adjacent pair's count once `merges` are made, and the vocabulary's bytes."""
    tok = Tokenizer(merges)
    vocab = tok.layout.id_bytes
    pairs: Counter = Counter()
    for chunk, n in counts.items():
        ids = tok.encode(chunk.decode("utf-8", "surrogateescape"))
        for a, b in zip(ids, ids[1:], strict=False):
            pairs[vocab[a] + b"|" + vocab[b]] += n
    return pairs, vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "gutenberg" / "train.txt")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--show", type=int, default=5, help="parting ranks to explain")
    args = parser.parse_args()
    text = args.corpus.read_text(encoding="utf-8", errors="replace")
    counts = count_chunks([text.encode("utf-8", "surrogateescape")], "gpt2", quiet=True)
    ours = Tokenizer.train([text.encode("utf-8", "surrogateescape")], vocab_size=args.vocab, quiet=True)
    our_tokens = [ours.layout.id_bytes[256 + r] for r in range(len(ours.merges))]
    theirs = rustbpe_tokens(text, args.vocab)
    shared = len(set(our_tokens) & set(theirs))
    print(f"{args.corpus.name}, vocab {args.vocab}: tk {len(our_tokens)} merged tokens, rustbpe {len(theirs)}; "
          f"{shared} in both")  # fmt: skip
    parting = [r for r, (a, b) in enumerate(zip(our_tokens, theirs, strict=False)) if a != b]
    if not parting:
        print("the two merge sequences are identical")
        return
    print(f"first parting rank: {parting[0]} ({len(parting)} ranks differ in all)")
    for r in parting[: args.show]:
        pairs, vocab = pair_counts_after(counts, ours.merges[:r])
        mine = ours.merges[r]
        our_pick = vocab[mine[0]] + b"|" + vocab[mine[1]]
        their_pick = next((p for p in pairs if p.replace(b"|", b"", 1) == theirs[r] and pairs[p]), None)
        theirs_count = pairs[their_pick] if their_pick else "not a pair here (an earlier parting)"
        print(f"  rank {r}: tk {our_pick!r} count {pairs[our_pick]}; rustbpe {theirs[r]!r} count {theirs_count}")


if __name__ == "__main__":
    main()
