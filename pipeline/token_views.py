"""The tokenizer's views of `tk serve`'s page, and how the pipeline shows one token.

- `tokens_view`, `compare_view`: a text cut into tokens, by one tokenizer or two side by side.
- `bpe_view`: the text from bytes to tokens, merge by merge (`Tokenizer.replay`).
- How the page shows a token, in bpe/show.py's one spelling: `piece` (the page's chips: hex,
  text, and whether the bytes are part of a character), `token_pieces` (the page's next-token
  lists), `vocab_labels` (every id of a model's vocabulary quoted, padding included).

Each view returns plain JSON-ready dicts, as pipeline/views.py describes. What it deliberately
does not do: run a model (pipeline/forward_views.py and views.py do), read request parameters or
print. It keeps one thing between calls, per tokenizer and dropped with it: the vocabulary's labels.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from tokenkit.bpe.show import token_str
from tokenkit.pipeline import names
from tokenkit.pipeline.run import pad_label, token_text

FIRST_MERGES = 50  # merges listed by bpe_view

# The special-token policies by name (docs/serve.md's `specials`), as a run's corpus has them
# (`names.SPECIALS`: keyword arguments of `Tokenizer.encode`, as cli/specials.py's flags give them).
SPECIALS: dict[str, dict[str, Any]] = names.SPECIALS
REFUSE = SPECIALS["refuse"]

# ----------------------------------------------------------------------------- how a token is shown


def piece(raw: bytes) -> dict[str, Any]:
    """A token's bytes as the page shows them: hex, text, and whether they are part of a
    character (`partial`: not UTF-8 alone; the text then writes those bytes as \\xNN).

    >>> piece(b"\\xc3"), piece(b"hi")
    ({'bytes': 'c3', 'text': '\\\\xc3', 'partial': True}, {'bytes': '6869', 'text': 'hi', 'partial': False})
    """
    text = token_str(raw)
    return {"bytes": raw.hex(), "text": text, "partial": text.encode("utf-8") != raw}


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each model id's text on its own (`Tokenizer.token_pieces`: part of a character as \\xNN);
    an id of a padded vocabulary with no token as `pad_label` (`<pad id N>`)."""
    return [tokenizer.token_pieces([i])[0] if i < tokenizer.vocab_size else pad_label(i) for i in ids]


_LABELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> vocab_labels


def vocab_labels(tokenizer, n: int) -> list[str]:
    """`run.token_text` of ids 0..n-1, made once per tokenizer: explain's logits step labels every id
    of the vocabulary, 47 ms of each explain of GPT-2's (a server answers many)."""
    labels = _LABELS.get(tokenizer)
    if labels is None or len(labels) != n:
        labels = _LABELS[tokenizer] = [token_text(tokenizer, i) for i in range(n)]
    return labels


def token_entries(tokenizer, ids: Sequence[int]) -> list[dict[str, Any]]:
    """Each token of `ids` with its byte span in the text they decode to (start, end)."""
    specials = set(tokenizer.special_tokens.values())
    out, start = [], 0
    for i in ids:
        raw = tokenizer.decode_bytes([i])
        shown = piece(raw)
        end = start + len(raw)
        out.append({"id": int(i), "bytes": shown["bytes"], "text": shown["text"], "start": start, "end": end})
        out[-1].update(special=i in specials, partial=shown["partial"])
        start = end
    return out


# ----------------------------------------------------------------------------- the views


def tokens_view(tokenizer, text: str, *, name: str, policy: Mapping[str, Any] = REFUSE) -> dict[str, Any]:
    """/api/tokens: `text` cut into tokens; `ids` is what `tk encode -t TOKENIZER TEXT --json`
    prints with the same special-token policy (`policy`: one of SPECIALS)."""
    ids = tokenizer.encode(text, **policy)
    tokens = token_entries(tokenizer, ids)
    n_bytes = tokens[-1]["end"] if tokens else 0
    return {
        "tokenizer": name,
        "ids": ids,
        "tokens": tokens,
        "n_bytes": n_bytes,
        "n_tokens": len(ids),
        "bytes_per_token": n_bytes / len(ids) if ids else None,
    }


def differ_spans(a: Sequence[Mapping[str, int]], b: Sequence[Mapping[str, int]]) -> list[list[int]]:
    """The byte spans two tokenizations of one text do not cut the same way: between each two
    neighbouring cut points they share, the span where either cuts in between.

    >>> differ_spans([{"start": 0, "end": 2}, {"start": 2, "end": 5}], [{"start": 0, "end": 5}])
    [[0, 5]]
    >>> differ_spans([{"start": 0, "end": 2}, {"start": 2, "end": 4}], [{"start": 0, "end": 2}, {"start": 2, "end": 3},
    ...               {"start": 3, "end": 4}])
    [[2, 4]]
    """
    cuts_a = {0} | {t["end"] for t in a}
    cuts_b = {0} | {t["end"] for t in b}
    shared = sorted(cuts_a & cuts_b)
    whole = {(t["start"], t["end"]) for t in a} & {(t["start"], t["end"]) for t in b}  # one token in both
    return [[s, e] for s, e in zip(shared, shared[1:], strict=False) if (s, e) not in whole]


def compare_view(
    main, compare, text: str, *, names: tuple[str, str], policy: Mapping[str, Any] = REFUSE
) -> dict[str, Any]:
    """/api/compare: `text` by both tokenizers, and the spans they cut differently."""
    a = tokens_view(main, text, name=names[0], policy=policy)
    b = tokens_view(compare, text, name=names[1], policy=policy)
    return {"main": a, "compare": b, "differ": differ_spans(a["tokens"], b["tokens"])}


def merge_counts(tokenizer) -> list[int] | None:
    """The pair count of each merge as the tokenizer recorded them when it learned them, or None
    when it did not (imported, or made before tk recorded them)."""
    counts = tokenizer.training.get("merge_counts")
    ok = isinstance(counts, list) and all(type(c) is int for c in counts)
    return counts if ok else None


def bpe_view(
    tokenizer, text: str, *, name: str, policy: Mapping[str, Any] = REFUSE, first: int = FIRST_MERGES
) -> dict[str, Any]:
    """/api/bpe: the text from bytes to tokens, merge by merge (`Tokenizer.replay`), the pieces
    of every id it shows (the first merges' pairs and new ids too, whether in the text or not),
    and the tokenizer's `first` merges with the pair counts it recorded when it learned them
    (None when it did not: imported, or made before tk recorded them)."""
    replay = tokenizer.replay(text, **policy)
    counts = merge_counts(tokenizer) or []
    first_merges = []
    for rank, (a, b) in enumerate(tokenizer.merges[:first]):
        new_id = tokenizer.merged_id(rank)
        made = piece(tokenizer.decode_bytes([new_id]))["text"]
        count = counts[rank] if rank < len(counts) else None
        first_merges.append({"rank": rank, "pair": [a, b], "new_id": new_id, "text": made, "count": count})
    # every id the page labels: the text's, and the first merges' parts (most are not in the text)
    shown = set(replay.initial) | {s.new_id for s in replay.steps}
    shown |= {i for m in first_merges for i in (*m["pair"], m["new_id"])}
    return {
        "tokenizer": name,
        "initial": replay.initial,
        "chunks": [list(c) for c in replay.chunks],
        "steps": [{"rank": s.rank, "pair": list(s.pair), "new_id": s.new_id, "at": s.at} for s in replay.steps],
        "pieces": {str(i): piece(tokenizer.decode_bytes([i])) for i in sorted(shown)},
        "ids": replay.ids,
        "first_merges": first_merges,
    }
