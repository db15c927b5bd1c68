"""`tk predict-next` and `tk generate`: a trained model run on a user's text.

Each loads the model (a run directory or a model file) with its tokenizer, calls
`pipeline.run` and prints: the table of likely next tokens, or the continuation as it comes.
`stream_text` is the streaming echo, which `tk pipeline`'s final sample prints with too.
With `--ablate SPEC` each runs the model with those heads and MLPs knocked out
(transformer/ablation.py); `ablation_flags` and `ablation_for` turn the flags into the ablation
for `tk explain` too, and predict-next shows the distribution before beside after.

What it deliberately does not do: train, or say anything about the model's files (`tk info`).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from tokenkit.cli.notes import note
from tokenkit.cli.options import (
    ablation_options,
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
@json_option(
    'print {"top": [{"id", "token", "p"}, ...], "prompt_ids": [...]} instead ("cut": N more, of a text longer than'
    ' the context); with --ablate also "ablation", "kl", "before" (the top unablated) and "moved"'
    ' [{"id", "token", "before", "after"}]'
)
@ablation_options
@special_options
@device_option
def predict_next_command(
    model_path, tokenizer_path, text, top_k, as_json, ablate, ablate_mode, ablate_text, ablate_file, special_policy,
    device,
) -> int:  # fmt: skip
    """The most likely token after TEXT (argmax), then the top K with their probabilities.

    With --ablate, the distribution with those heads and MLPs knocked out, each token's
    probability before beside it, and the KL divergence from the unablated distribution.

    \b
    Example:
      tk predict-next -m runs/demo "Once upon a time, there was a"
      tk predict-next -m runs/demo "Once upon a time" --top-k 3 --json
      tk predict-next -m runs/demo "The end.<|endoftext|>" --allow-special
      tk predict-next -m runs/demo "Once upon a time" --ablate 1.1,1.3
      tk predict-next -m runs/demo "Once upon a time" --ablate 0.mlp --ablate-mode mean --ablate-file tales.txt
    """
    from tokenkit.pipeline import views
    from tokenkit.pipeline.ablation_views import ablated_next_view
    from tokenkit.pipeline.run import load_model_and_tokenizer, predict_next, token_text
    from tokenkit.transformer.ablation import ablated, shift

    check_device(device)
    flags = ablation_flags(ablate, ablate_mode, ablate_text, ablate_file)  # before the model loads
    model, tok = load_model_and_tokenizer(model_path, tokenizer_path, device=device)
    knocked = ablation_for(model, tok, flags, special_policy)
    if as_json:  # tk serve's /api/next; a token that is part of a character shows its bytes escaped, e.g. "\\xc3"
        if knocked is None:
            doc = views.next_view(model, tok, text, top_k=top_k, policy=special_policy, say=note)
        else:  # tk serve's /api/next?ablate=SPEC
            doc = ablated_next_view(model, tok, text, knocked, top_k=top_k, policy=special_policy, say=note)
        click.echo(json.dumps(doc, ensure_ascii=False))
        return 0
    with ablated(model, knocked):
        pred = predict_next(model, tok, text, top_k=top_k, say=note, **special_policy)
    best_id, best_p = pred.top[0]
    moved = None if knocked is None else shift(model, pred.prompt_ids, knocked)
    if moved is not None:
        click.echo(f"ablated: {knocked}; KL divergence from the unablated distribution: {moved.kl:.4f} nats")
    click.echo(f"next token: {token_text(tok, best_id)} (id {best_id}, p = {best_p:.4f})")
    click.echo("")
    before = "" if moved is None else f"  {'unablated':>11}"
    click.echo(f"{'rank':>4}  {'id':>6}  {'probability':>11}{before}  text")
    for rank, (token_id, p) in enumerate(pred.top, 1):
        before = "" if moved is None else f"  {moved.before[token_id]:>11.4f}"
        click.echo(f"{rank:>4}  {token_id:>6}  {p:>11.4f}{before}  {token_text(tok, token_id)}")
    return 0


MAX_REFERENCE_BYTES = 1 << 20  # --ablate-file: a mean over a megabyte of text is far past settled


def ablation_flags(spec: str | None, mode: str, text: str | None, file: Path | None):
    """The --ablate flags checked before the model loads -> (parts, mode, reference text or None),
    or None without --ablate. The reference file is read here (a regular UTF-8 file, bounded)."""
    from tokenkit.common import readfile
    from tokenkit.transformer.ablation import parse

    given = [flag for flag, value in (("--ablate-text", text), ("--ablate-file", file)) if value is not None]
    if spec is None:
        if given or mode != "zero":
            raise click.UsageError(f"{(given or ['--ablate-mode'])[0]} goes with --ablate SPEC, the parts to knock out")
        return None
    if mode == "zero" and given:
        raise click.UsageError(f"{given[0]} is the reference of --ablate-mode mean; zero ablation has none")
    if mode == "mean" and len(given) != 1:
        raise click.UsageError("--ablate-mode mean needs its reference: give --ablate-text TEXT or --ablate-file FILE")
    parts = parse(spec)
    if text == "":
        raise click.UsageError("--ablate-text is empty; give the reference text of --ablate-mode mean")
    if file is not None:
        with readfile.open_regular(file, None, "a UTF-8 text file") as (f, size):
            if size > MAX_REFERENCE_BYTES:  # a real text, only longer than a mean needs: said as such
                raise click.ClickException(
                    f"{file} is {size:,} bytes; a reference text for --ablate-mode mean is at most 1 MiB:"
                    " give part of it"
                )
            data = f.read(size)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise click.ClickException(f"{file} is not UTF-8 text (byte {err.start}); give a UTF-8 file") from None
        if not text:
            raise click.ClickException(f"{file} is empty; give the reference text of --ablate-mode mean")
    return parts, mode, text


def ablation_for(model, tok, flags, special_policy):
    """`ablation_flags`' result -> the model's Ablation (its parts checked against the model; the
    reference text encoded as the command's text is), or None."""
    from tokenkit.transformer.ablation import check, mean_ablation, zero_ablation

    if flags is None:
        return None
    parts, mode, text = flags
    check(parts, model.config)  # before a reference text is encoded and run
    if mode == "zero":
        return zero_ablation(model, parts)
    return mean_ablation(model, parts, tok.encode_for_model(text, **special_policy))


@click.command("generate")
@model_option()
@tokenizer_option()
@click.argument("prompt")
@max_new_tokens_option("tokens to generate", default=100)
@sampling_options
@ablation_options
@special_options
@device_option
def generate_command(
    model_path, tokenizer_path, prompt, max_new_tokens, temperature, top_k, top_p, seed, ablate, ablate_mode,
    ablate_text, ablate_file, special_policy, device,
) -> int:  # fmt: skip
    """Continue PROMPT, streaming the text as it is generated (KV-cached decoding).

    \b
    Example:
      tk generate -m runs/demo "Once upon a time" -n 60 --temperature 0.8 --seed 1
      tk generate -m runs/demo "The end.<|endoftext|>" --allow-special -n 60
      tk generate -m runs/demo "Once upon a time" -n 60 --temperature 0 --ablate 1.1,1.3
    """
    from tokenkit.pipeline.run import generate, load_model_and_tokenizer
    from tokenkit.transformer.ablation import ablated

    check_device(device)
    flags = ablation_flags(ablate, ablate_mode, ablate_text, ablate_file)
    model, tok = load_model_and_tokenizer(model_path, tokenizer_path, device=device)
    knocked = ablation_for(model, tok, flags, special_policy)
    with ablated(model, knocked):  # around the whole stream: generation runs as the text is printed
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
