"""`tk eval -m MODEL FILE...`: a model's loss on held-out text, in nats per token, bits per byte
and perplexity (pipeline/evaluate.py computes them).

The corpus is read as train-model reads one (files, directories, compressed files, JSONL, stdin;
each file or JSON line a document), with the same special-token flags.

What it deliberately does not do: any scoring itself, or train.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from tokenkit.cli.notes import note, notes, warn
from tokenkit.cli.options import (
    check_device,
    corpus_options,
    device_option,
    json_option,
    model_option,
    quiet_option,
    tokenizer_option,
)
from tokenkit.cli.params import count
from tokenkit.cli.specials import special_options

# NumPy, the model and the codec are imported when the command runs, not for its --help.


@click.command("eval")
@model_option()
@tokenizer_option()
@click.argument("corpus", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--stride",
    type=count(1),
    default=None,
    help="tokens between the starts of two windows over a text longer than the context; each window scores "
    "only its new tokens (default: half the context; the context: disjoint windows, whose first tokens are "
    "not scored)",
)
@corpus_options
@json_option('print {"tokens", "bytes", "loss", "bits_per_byte", "perplexity", ...} instead')
@quiet_option("no progress bar")
@special_options
@device_option
def eval_command(
    model_path, tokenizer_path, corpus, stride, glob, text_field, binary, as_json, quiet, special_policy, device
) -> int:
    """A model's loss on held-out text: nats per token, bits per byte and perplexity.

    Bits per byte divides the summed losses (in bits) by the text's UTF-8 bytes, so that models
    with different tokenizers compare. Each file (or JSON line) is a document, scored apart.

    \b
    Examples:
      tk eval -m runs/demo corpora/tiny_tales.txt
      tk eval -m runs/demo held_out/ --glob '*.txt' --json
      tk eval -m runs/demo docs.jsonl --text-field text --stride 32
    """
    from tqdm import tqdm

    from tokenkit.bpe import Corpus
    from tokenkit.pipeline.eval_record import EvalRecord
    from tokenkit.pipeline.evaluate import score_texts
    from tokenkit.pipeline.run import load_model_and_tokenizer

    check_device(device)
    inputs = Corpus(list(corpus), glob=glob, text_field=text_field, binary=binary, warn=warn)
    model, tok = load_model_and_tokenizer(model_path, tokenizer_path, device=device)
    record = EvalRecord.open(model_path, corpus, glob, text_field, binary, special_policy, warn=warn)  # eval.json
    context = model.config.context_length
    if stride is not None and stride > context:
        raise click.UsageError(
            f"--stride {stride} is more than the model's context ({context}); give at most {context}"
        )
    hide = quiet or as_json or not sys.stderr.isatty()
    with tqdm(total=inputs.size, unit="B", unit_scale=True, desc="scoring", disable=hide) as bar:
        score = score_texts(model, tok, inputs.documents(), special_policy, stride=stride, progress=bar.update)
    stride = stride or max(1, context // 2)
    if score.skipped and not as_json:
        note(f"skipped {score.skipped:,} documents shorter than two tokens (nothing to predict in them)")
    if as_json:
        doc = {**score.to_dict(), "stride": stride, "context": context, "model": str(model_path)}
        click.echo(json.dumps(doc))
        record.write(score, stride=stride, context=context, say=notes(quiet), warn=warn)  # a run directory's eval.json
        return 0
    click.echo(f"documents:      {score.documents:,}")
    click.echo(f"tokens scored:  {score.tokens:,} (windows of {context} tokens, stride {stride})")
    click.echo(f"bytes:          {score.bytes:,}")
    click.echo(f"loss:           {score.loss:.4f} nats per token")
    click.echo(f"bits per byte:  {score.bits_per_byte:.4f}")
    click.echo(f"perplexity:     {score.perplexity:.3f}")
    record.write(score, stride=stride, context=context, say=notes(quiet), warn=warn)  # a run directory's eval.json
    return 0


COMMANDS = (eval_command,)
