"""`tk predict-next` and `tk generate`: a trained model run on a user's text.

Each loads the model (a run directory or a model file) with its tokenizer, calls
`pipeline.run` and prints: the table of likely next tokens, or the continuation as it comes.
`stream_text` is the streaming echo, which `tk pipeline`'s final sample prints with too.

What it deliberately does not do: train, or say anything about the model's files (`tk info`).
"""

from __future__ import annotations

import json

import click

from tokenkit.cli.notes import note
from tokenkit.cli.options import (
    check_device,
    device_option,
    json_option,
    max_new_tokens_option,
    model_option,
    sampling_options,
    tokenizer_option,
    top_k_option,
)
from tokenkit.cli.specials import special_options


@click.command("predict-next")
@model_option()
@tokenizer_option()
@click.argument("text")
@top_k_option("rows in the table of likely tokens", default=10)
@json_option('print {"top": [{"id", "token", "p"}, ...], "prompt_ids": [...]} instead')
@special_options
@device_option
def predict_next_command(model_path, tokenizer_path, text, top_k, as_json, special_policy, device) -> int:
    """The most likely token after TEXT (argmax), then the top K with their probabilities.

    \b
    Example:
      tk predict-next -m runs/demo "Once upon a time, there was a"
      tk predict-next -m runs/demo "Once upon a time" --top-k 3 --json
      tk predict-next -m runs/demo "The end.<|endoftext|>" --allow-special
    """
    from tokenkit.pipeline import views
    from tokenkit.pipeline.run import load_model_and_tokenizer, predict_next, token_text

    check_device(device)
    model, tok = load_model_and_tokenizer(model_path, tokenizer_path, device=device)
    if as_json:  # tk serve's /api/next; a token that is part of a character shows its bytes escaped, e.g. "\\xc3"
        doc = views.next_view(model, tok, text, top_k=top_k, policy=special_policy, say=note)
        click.echo(json.dumps(doc, ensure_ascii=False))
        return 0
    pred = predict_next(model, tok, text, top_k=top_k, say=note, **special_policy)
    best_id, best_p = pred.top[0]
    click.echo(f"next token: {token_text(tok, best_id)} (id {best_id}, p = {best_p:.4f})")
    click.echo("")
    click.echo(f"{'rank':>4}  {'id':>6}  {'probability':>11}  text")
    for rank, (token_id, p) in enumerate(pred.top, 1):
        click.echo(f"{rank:>4}  {token_id:>6}  {p:>11.4f}  {token_text(tok, token_id)}")
    return 0


@click.command("generate")
@model_option()
@tokenizer_option()
@click.argument("prompt")
@max_new_tokens_option("tokens to generate", default=100)
@sampling_options
@special_options
@device_option
def generate_command(
    model_path, tokenizer_path, prompt, max_new_tokens, temperature, top_k, top_p, seed, special_policy, device
) -> int:
    """Continue PROMPT, streaming the text as it is generated (KV-cached decoding).

    \b
    Example:
      tk generate -m runs/demo "Once upon a time" -n 60 --temperature 0.8 --seed 1
      tk generate -m runs/demo "The end.<|endoftext|>" --allow-special -n 60
    """
    from tokenkit.pipeline.run import generate, load_model_and_tokenizer

    check_device(device)
    model, tok = load_model_and_tokenizer(model_path, tokenizer_path, device=device)
    pieces = generate(
        model,
        tok,
        prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        say=note,
        **special_policy,
    )
    stream_text(prompt, pieces)
    return 0


def stream_text(prompt: str, pieces) -> None:
    """Echo the prompt, then each piece as it comes (click.echo flushes)."""
    first = next(pieces, "")  # a bad prompt or flag fails, and notes are said, before any text is printed
    click.echo(prompt + first, nl=False)
    for piece in pieces:
        click.echo(piece, nl=False)
    click.echo("")


COMMANDS = (predict_next_command, generate_command)
