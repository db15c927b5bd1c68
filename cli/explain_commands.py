"""`tk explain`: a forward pass printed step by step, for a real model or a worked example.

A thin layer: the numbers and the --json document come from pipeline.views (over
transformer.explain), the text and heatmaps from cli.explain_render, the model from
pipeline.checkpoint.load_model. Tables go to stdout.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from tokenkit.cli.explain_render import plot_attention, render, render_tokens
from tokenkit.cli.launch import check_device, device_option
from tokenkit.cli.params import count
from tokenkit.cli.specials import special_options
from tokenkit.pipeline import views
from tokenkit.pipeline.checkpoint import load_model
from tokenkit.transformer.explain import EXAMPLES, Explanation, explain_example

_EXAMPLE_LIST = "; ".join(f"{name} ({what})" for name, (what, _) in EXAMPLES.items())


@click.command("explain")
@click.argument("text", required=False)
@click.option("-m", "--model", "model_path", type=click.Path(path_type=Path), help="run directory or model.safetensors")
@click.option("--example", "example", metavar="NAME", help=f"a worked example instead of a model: {_EXAMPLE_LIST}")
# --layer and --head: their range is the model's, checked by explain_model in one line naming it
@click.option("--layer", default=0, show_default=True, type=int, help="layer to explain (0 = first)")
@click.option("--head", default=0, show_default=True, type=int, help="attention head of that layer (0 = first)")
@click.option("--top-k", default=5, show_default=True, type=count(1), help="next-token candidates listed at the end")
@click.option("--full", is_flag=True, help="print every row and column of large matrices (default: an 8 x 8 corner)")
@click.option("--precision", default=4, show_default=True, type=click.IntRange(0, 12), help="decimals printed")
@click.option("--json", "as_json", is_flag=True, help="print the trace as JSON (arrays as nested lists) instead")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path),
              help="also write heatmaps of the layer's attention weights (one panel per head) to this PNG;"
              " needs pip install 'tokenkit[plot]'")  # fmt: skip
@special_options
@device_option
def explain_command(
    text, model_path, example, layer, head, top_k, full, precision, as_json, plot_path, special_policy, device
) -> int:
    """Print a forward pass the way a textbook works an example: tokens, embeddings, Q, K, V,
    scores, attention weights, weighted sum, projection, residual, LayerNorm, MLP, logits.

    \b
    Examples:
      tk explain -m runs/tales "Once upon a time" --layer 1 --head 2
      tk explain -m runs/tales "The cat sat" --json > trace.json
      tk explain -m runs/tales "The cat sat" --plot attention.png
      tk explain -m runs/tales "The end.<|endoftext|>Once" --allow-special
      tk explain --example chai --precision 3
    \b
    Examples (--example NAME), their numbers through the library's ops:
      attention-lookup   attention as a fuzzy key/value lookup
      sitting            "The cat sat": Q = K = V = X, scaled by sqrt(4)
      chai               one encoder layer on "The chai is hot"
      one-layer          a one-layer toy with d_head = 2 and W_O
    """
    check_device(device)  # first, as in every command: a missing CuPy or GPU is the one line
    if example is not None:
        if model_path is not None or text is not None:
            raise click.UsageError("--example runs a worked example; give it without -m and TEXT")
        if device != "cpu":  # not run elsewhere quietly
            raise click.UsageError(f"the worked examples are computed with NumPy on the CPU; drop --device {device}")
        expl = explain_example(example)
        doc = views.example_doc(example)
        header = ""
    else:
        if model_path is None or text is None:
            raise click.UsageError('give -m MODEL "TEXT" to explain a model, or --example NAME for a worked example')
        model, tok, _ = load_model(model_path, device=device)
        expl, ids, raw = views.explain_run(model, tok, text, layer=layer, head=head, top_k=top_k, policy=special_policy)
        doc = views.model_doc(expl, ids, raw, tok, text, str(model_path))
        header = render_tokens(ids, [views.show_token(b) for b in raw], raw) + "\n"
    if plot_path is not None:
        title = expl.title if example is not None else f"attention weights of layer {layer}, one panel per head"
        _plot(expl, plot_path, title)
    if as_json:
        click.echo(json.dumps(doc, ensure_ascii=False))
    else:
        click.echo(header + render(expl, precision=precision, full=full), nl=False)
    if plot_path is not None:
        click.echo(f"attention heatmaps written to {plot_path}", err=True)
    return 0


def _plot(expl: Explanation, path: Path, title: str) -> None:
    weights = next(s for s in expl.steps if s.key.endswith("weights"))  # its labels: queries, keys
    plot_attention(expl.attention, weights.rows, weights.cols, path, title)


COMMANDS = (explain_command,)
