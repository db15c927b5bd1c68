"""The next-token distribution with heads and MLPs knocked out: `tk predict-next --ablate SPEC
--json` and `tk serve`'s `/api/next?ablate=SPEC`, one function for both.

`ablated_next_view(model, tokenizer, text, ablation, ...)` is `views.next_view` run under the
ablation (`top`: the ablated distribution, each entry with its unablated probability `before` too;
`prompt_ids`) with `transformer.ablation.shift`'s comparison added: `ablation`
(`Ablation.to_json`), `kl` (KL(unablated || ablated), in nats), `before` (the top_k most likely
tokens unablated) and `moved` (the top_k whose probability changed most), each entry with its
token's text after its id, as `top`'s entries have it.

`zero_parts(model, spec)` reads a SPEC for the page: parsed and checked against the model
(transformer/ablation.py, each a one-line ModelError), zero-ablated.

What it deliberately does not do: read request parameters or bound them (cli/serve_api.py does),
read a reference text for mean ablation (the commands' flags do: cli/model_commands.py), or
compute anything transformer/ablation.py does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tokenkit.pipeline.token_views import REFUSE, token_pieces
from tokenkit.pipeline.views import next_view
from tokenkit.transformer.ablation import Ablation, ablated, parse, shift, zero_ablation


def zero_parts(model, spec: str) -> Ablation:
    """SPEC -> its parts zeroed in `model` (ModelError, one line, for a SPEC that is not one or a
    part the model does not have)."""
    return zero_ablation(model, parse(spec))


def named(tokenizer, doc: dict) -> dict:
    """`Shift.to_json`'s entries with each id's token text after the id, as `top`'s entries have it
    (a part of a character as \\xNN, a padded id as <pad id N>)."""
    for key in ("before", "moved"):
        texts = token_pieces(tokenizer, [e["id"] for e in doc[key]])
        doc[key] = [{"id": e.pop("id"), "token": text, **e} for e, text in zip(doc[key], texts, strict=True)]
    return doc


def ablated_next_view(
    model,
    tokenizer,
    text: str,
    ablation: Ablation,
    *,
    top_k: int = 10,
    policy: Mapping[str, Any] = REFUSE,
    say: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """/api/next?ablate=SPEC and `tk predict-next --ablate SPEC --json`: `next_view`'s document of
    the ablated model, with `ablation`, `kl`, `before` and `moved` (see the module's docstring)."""
    with ablated(model, ablation):
        doc = next_view(model, tokenizer, text, top_k=top_k, policy=policy, say=say)
    found = shift(model, doc["prompt_ids"], ablation)
    for entry in doc["top"]:  # what the command's table prints beside each row: its unablated probability
        entry["before"] = float(found.before[entry["id"]])
    return doc | {"ablation": ablation.to_json(), **named(tokenizer, found.to_json(top_k))}
