"""Which bytes each id stands for, which id each merge makes, and where the special tokens are.

What it does: builds and checks a tokenizer's `Layout` from one of two descriptions.
- canonical (tk's own tokenizers, GPT-2's, tiktoken's): ids 0-255 are the 256 bytes (in
  `byte_order`), merge r makes id 256 + r, special tokens follow the merges. A merge's rank is
  the id it makes, and the vocabulary is derived from the merges.
- listed (tokenizer.json files that do not fit that): every id's bytes are given, and merge r
  makes the id whose bytes are its pair's bytes together. Llama 3's file has 280k merges for
  128k tokens (it was converted from tiktoken's ranks: every split of a token into two tokens
  is a merge), and SmolLM's puts its special tokens before the bytes.
A listed vocabulary that fits the canonical layout becomes canonical: one tokenizer, one form.

Merging picks the pair with the lowest rank, leftmost first (`bpe.merge.merge_chunk`). When
every merge only uses tokens that earlier merges make (`monotone`, always true of the canonical
layout), a merge never creates a pair that outranks it, so all places of one pair can merge at
once (`bpe.encoder.merge_batch`, `bpe.replay`); otherwise they merge one at a time.

What it deliberately does not do: encode (bpe/tokenizer.py, bpe/encoder.py) or read files.

>>> layout = listed([b"a", b"ab", b"b"] + [bytes([i]) for i in range(256) if i not in b"ab"], [(0, 2)])
>>> layout.made, layout.byte_ids[97], layout.canonical
([1], 0, False)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from tokenkit.bpe.errors import TokenizerError


@dataclass(frozen=True)
class Layout:
    """id_bytes[i]: the bytes of id i (a special token's as its UTF-8 text); specials: name -> id;
    byte_ids[b]: the id of byte b; merges: pairs of ids in rank order; made[r]: the id merge r
    makes, None for the canonical 256 + r; monotone: no merge uses a token a later merge makes."""

    id_bytes: list[bytes]
    specials: dict[str, int]
    byte_ids: list[int]
    merges: list[tuple[int, int]]
    made: list[int] | None
    monotone: bool

    @property
    def canonical(self) -> bool:
        return self.made is None

    def merged_id(self, rank: int) -> int:
        return 256 + rank if self.made is None else self.made[rank]

    @property
    def regular_ids(self) -> list[int]:
        """The ids that are not special tokens, ascending."""
        special = set(self.specials.values())
        return [i for i in range(len(self.id_bytes)) if i not in special]

    @property
    def merged_tokens(self) -> list[int]:
        """The ids of the tokens of two bytes or more, ascending (special tokens aside)."""
        return [i for i in self.regular_ids if len(self.id_bytes[i]) > 1]

    @cached_property
    def pair_id(self) -> dict[tuple[int, int], int]:
        """Pair -> its rank key, 256 + rank, as `bpe.merge` takes the merges: in the canonical
        layout that is also the id it makes. Built on first use: one chunk at a time and replays
        read it, the batch encoder does not."""
        return {pair: 256 + r for r, pair in enumerate(self.merges)}


def _special_names(special_tokens: Iterable | Mapping) -> list[str]:
    names = list(special_tokens)
    for s in names:
        if not isinstance(s, str) or not s:
            raise TokenizerError(f"special tokens must be non-empty strings, got {s!r}")
    if len(set(names)) != len(names):
        raise TokenizerError("special tokens must be distinct")
    return names


def canonical(
    merges: Sequence[tuple[int, int]], byte_order: Sequence[int] | None, special_tokens: Iterable | Mapping = ()
) -> Layout:
    """The canonical layout: bytes in `byte_order` (default 0..255), merge r -> id 256 + r, then
    the special tokens (a dict's ids are only their order)."""
    order = list(range(256)) if byte_order is None else [int(b) for b in byte_order]
    if sorted(order) != list(range(256)):
        raise TokenizerError("byte_order must be a permutation of 0..255")
    vocab = [bytes([b]) for b in order]
    for r, (a, b) in enumerate(merges):
        if not (0 <= a < 256 + r and 0 <= b < 256 + r):
            raise TokenizerError(f"merge {r} ({a}, {b}) uses an id that does not exist yet")
        vocab.append(vocab[a] + vocab[b])
    if len(set(merges)) != len(merges):
        raise TokenizerError("the same pair is merged twice")
    names = _special_names(special_tokens)
    if isinstance(special_tokens, Mapping):
        names = sorted(special_tokens, key=special_tokens.__getitem__)
    specials = {s: len(vocab) + k for k, s in enumerate(names)}
    byte_ids = [0] * 256
    for i, b in enumerate(order):
        byte_ids[b] = i
    return Layout(vocab + [s.encode("utf-8") for s in names], specials, byte_ids, list(merges), None, True)


def canonical_checked(
    id_bytes: list[bytes], byte_order: list[int], merges: list[tuple[int, int]], specials: Mapping[str, int]
) -> Layout:
    """`canonical`'s layout from parts a tokenizer file's reader checked already (`bpe.io.unpack`,
    vectorised): `id_bytes` the 256 + M tokens' bytes, each merged token its pair's bytes
    together; `specials` the ids after them. Nothing is rebuilt or checked again: loading GPT-2's
    50k merges cost twice what encoding needs otherwise."""
    names = sorted(specials, key=specials.__getitem__)
    byte_ids = [0] * 256
    for i, b in enumerate(byte_order):
        byte_ids[b] = i
    return Layout(id_bytes + [s.encode("utf-8") for s in names], dict(specials), byte_ids, merges, None, True)


def listed(
    tokens: Sequence[bytes | None], merges: Sequence[tuple[int, int]], special_tokens: Mapping[str, int] = {}
) -> Layout:
    """The layout of a vocabulary given id by id: tokens[i] is the bytes of id i (None where a
    special token has that id); merge r makes the id of its pair's bytes together. Canonical when
    it fits that layout.

    Refused in one line: two ids with the same bytes (which would a merge make?), a byte without
    an id, a merge whose bytes are no token, a pair merged twice, special ids that are not the
    holes of `tokens` (or ids past its end, without gaps).
    """
    names = _special_names(special_tokens)
    if any(type(i) is not int or not 0 <= i < len(tokens) + len(names) for i in special_tokens.values()):
        raise TokenizerError(
            f"special token ids must be from 0 to {len(tokens) + len(names) - 1} (the vocabulary's gaps and the ids "
            "after it)"
        )  # checked first: an id of 10**12 would make a set of that many holes
    n = max([len(tokens), *(i + 1 for i in special_tokens.values())])
    holes = {i for i, t in enumerate(tokens) if t is None} | set(range(len(tokens), n))
    if sorted(special_tokens.values()) != sorted(holes) or len(set(special_tokens.values())) != len(names):
        raise TokenizerError(
            "special tokens must have exactly the ids that hold no bytes (the vocabulary's gaps and the ids after it)"
        )
    id_of: dict[bytes, int] = {}
    for i, t in enumerate(tokens):
        if t is None:
            continue
        if not isinstance(t, bytes) or not t:
            raise TokenizerError(f"token {i} must be non-empty bytes, got {t!r:.40}")
        if id_of.setdefault(t, i) != i:
            raise TokenizerError(f"ids {id_of[t]} and {i} have the same bytes {t!r}; a merge of them would make either")
    missing = [b for b in range(256) if bytes([b]) not in id_of]
    if missing:
        raise TokenizerError(f"byte {missing[0]:#04x} has no id; a byte-level vocabulary holds all 256 bytes")
    made = []
    for r, (a, b) in enumerate(merges):
        if not (0 <= a < len(tokens) and 0 <= b < len(tokens)) or tokens[a] is None or tokens[b] is None:
            raise TokenizerError(f"merge {r} ({a}, {b}) uses an id that is no token")
        new = id_of.get(tokens[a] + tokens[b])
        if new is None:
            raise TokenizerError(f"merge {r} makes {tokens[a] + tokens[b]!r:.40}, which is no token")
        made.append(new)
    if len(set(merges)) != len(merges):
        raise TokenizerError("the same pair is merged twice")
    byte_ids = [id_of[bytes([b])] for b in range(256)]
    if _fits_canonical(tokens, made, byte_ids, special_tokens):
        byte_order = [tokens[i][0] for i in range(256)]
        return canonical(merges, byte_order, special_tokens)
    id_bytes = [t if t is not None else b"" for t in tokens] + [b""] * (n - len(tokens))
    for s, i in special_tokens.items():
        id_bytes[i] = s.encode("utf-8")
    return Layout(id_bytes, dict(special_tokens), byte_ids, list(merges), made, _monotone(merges, made))


def _fits_canonical(tokens, made: list[int], byte_ids: list[int], special_tokens: Mapping[str, int]) -> bool:
    n_regular = 256 + len(made)
    return (
        sorted(byte_ids) == list(range(256))
        and made == list(range(256, n_regular))
        and all(t is None for t in tokens[n_regular:])  # the special tokens' ids, after the merges
        and sorted(special_tokens.values()) == list(range(n_regular, n_regular + len(special_tokens)))
    )


def _monotone(merges: Sequence[tuple[int, int]], made: Sequence[int]) -> bool:
    """Whether every merge uses only bytes and tokens that earlier merges make (then a merge never
    creates a pair of lower rank than its own)."""
    last: dict[int, int] = {}  # id -> the last rank that makes it
    for r, new in enumerate(made):
        last[new] = r
    return all(last.get(a, -1) < r and last.get(b, -1) < r for r, (a, b) in enumerate(merges))


__all__ = ["Layout", "canonical", "listed"]
