"""`tk explain`: a forward pass printed step by step, for a real model or a worked example.

A thin layer: the numbers and the --json document come from pipeline.views (over
transformer.explain), the text and heatmaps from cli.explain_render, the --html page from
cli.page_file, the model from pipeline.checkpoint.load_model. Tables go to stdout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tokenkit.cli.notes import note
from tokenkit.cli.options import (
    ablation_options,
    check_device,
    device_option,
    json_option,
    model_option,
    top_k_option,
)
from tokenkit.cli.params import count
from tokenkit.cli.specials import special_options
from tokenkit.pipeline.names import VIEWS

if TYPE_CHECKING:
    from tokenkit.cli.page_file import Page
    from tokenkit.transformer.explanation import Explanation

# The model, NumPy and the page are imported by the functions that use them, so that `tk explain
# --help` does not wait for them (tests/test_cli_main.py).


@click.command("explain")
@click.argument("text", required=False)
@model_option(required=False)
@click.option("--example", "example", metavar="NAME", help="a worked example instead of a model (listed below)")
# --layer and --head: their range is the model's, checked by explain_model in one line naming it
@click.option("--layer", default=0, show_default=True, type=int, help="layer to explain (0 = first)")
@click.option("--head", default=0, show_default=True, type=int, help="attention head of that layer (0 = first)")
@top_k_option("next-token candidates listed at the end", default=5)
@click.option("--full", is_flag=True, help="print every row and column of large matrices (default: an 8 x 8 corner)")
@click.option("--precision", default=4, show_default=True, type=click.IntRange(0, 12), help="decimals printed")
@json_option("print the trace as JSON (arrays as nested lists) instead")
@click.option("--query", type=count(0), default=None,
              help="with --json: the per-token steps keep only this position's row (the others null), as the"
              " page asks for one query's arithmetic")  # fmt: skip
@click.option("--attribute-position", "attribute_position", type=count(0), default=None, metavar="P",
              help="with --json: the attribution's position (0 = first)  [default: the last]")  # fmt: skip
@click.option("--attribute-token", "attribute_token", type=count(0), default=None, metavar="ID",
              help="with --json: the token whose logit the attribution splits  [default: the prediction]")  # fmt: skip
@click.option("--plot", "plot_path", type=click.Path(path_type=Path),
              help="also write heatmaps of the layer's attention weights (one panel per head) to this PNG;"
              " needs pip install 'tokenkit[plot]'")  # fmt: skip
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="also write tk serve's page for this text (or the worked examples) to this HTML file: one"
              " self-contained file, no server or network needed")  # fmt: skip
@click.option("--view", type=click.Choice(VIEWS), help="the view the --html page opens in"
              "  [default: attention; examples with --example]")  # fmt: skip
@ablation_options
@special_options
@device_option
def explain_command(
    text,
    model_path,
    example,
    layer,
    head,
    top_k,
    full,
    precision,
    as_json,
    query,
    attribute_position,
    attribute_token,
    plot_path,
    html_path,
    view,
    ablate,
    ablate_mode,
    ablate_text,
    ablate_file,
    special_policy,
    device,
) -> int:
    """Print a forward pass the way a textbook works an example: tokens, embeddings, Q, K, V,
    scores, attention weights, weighted sum, projection, residual, LayerNorm, MLP, logits.

    \b
    Examples:
      tk explain -m runs/demo "Once upon a time" --layer 1 --head 2
      tk explain -m runs/demo "The cat sat" --json > trace.json
      tk explain -m runs/demo "The cat sat" --plot attention.png
      tk explain -m runs/demo "The cat sat" --html cat.html --view next
      tk explain -m runs/demo "The end.<|endoftext|>Once" --allow-special
      tk explain -m runs/demo "Once upon a time" --ablate 0.1,0.3 --json
      tk explain --example chai --precision 3
      tk explain --example chai --html chai.html
    \b
    Examples (--example NAME), their numbers through the library's ops:
      attention-lookup   attention as a fuzzy key/value lookup
      sitting            "The cat sat": Q = K = V = X, scaled by sqrt(4)
      chai               one encoder layer on "The chai is hot"
      one-layer          a one-layer toy with d_head = 2 and W_O
    """
    from tokenkit.bpe.show import token_repr
    from tokenkit.cli import page_file
    from tokenkit.cli.explain_render import render, render_tokens
    from tokenkit.cli.model_commands import ablation_flags, ablation_for
    from tokenkit.common import atomic
    from tokenkit.pipeline import views
    from tokenkit.pipeline.checkpoint import load_model, write_bytes
    from tokenkit.transformer.ablation import ablated
    from tokenkit.transformer.explain_examples import explain_example

    check_device(device)  # first, as in every command: a missing CuPy or GPU is the one line
    flags = ablation_flags(ablate, ablate_mode, ablate_text, ablate_file)
    if flags is not None and (example is not None or html_path is not None):
        raise click.UsageError("--ablate knocks parts out of a model's pass; the --html page and --example have none")
    attributing = attribute_position is not None or attribute_token is not None
    if attributing and (not as_json or example is not None):
        raise click.UsageError("--attribute-position and --attribute-token choose the --json attribution of a model")
    _check_view(view, html_path, example, model_path)
    for written in (html_path, plot_path):  # a device, FIFO or socket there is refused before the model loads
        if written is not None:
            atomic.check_output(written)
    page = None
    if example is not None:
        if model_path is not None or text is not None:
            raise click.UsageError("--example runs a worked example; give it without -m and TEXT")
        if device != "cpu":  # not run elsewhere quietly
            raise click.UsageError(f"the worked examples are computed with NumPy on the CPU; drop --device {device}")
        if query is not None:
            raise click.UsageError("--query picks a row of a model's trace; the worked examples print whole")
        expl = explain_example(example)
        doc = views.example_doc(example) if as_json else None
        header = ""
        if html_path is not None:
            page = page_file.example_page(example, view or "examples")
    else:
        if model_path is None or text is None:
            raise click.UsageError('give -m MODEL "TEXT" to explain a model, or --example NAME for a worked example')
        model, tok, _ = load_model(model_path, device=device)
        knocked = ablation_for(model, tok, flags, special_policy)
        with ablated(model, knocked):  # the lens and attribution read the pass as it ran (docs/inside.md)
            expl, (ids, cut), raw = views.explain_run(
                model, tok, text, layer=layer, head=head, top_k=top_k, policy=special_policy, say=note
            )  # fmt: skip
            # The lens and the default attribution are in every model's --json (docs/inside.md): only built for it.
            doc = views.model_doc(expl, ids, raw, tok, text, str(model_path), query, cut) if as_json else None
            if attributing and doc is not None:
                position = -1 if attribute_position is None else attribute_position
                doc["attribution"] = expl.inside.attribution(position, attribute_token)
        if knocked is not None and doc is not None:
            doc["ablation"] = knocked.to_json()
        header = render_tokens(ids, [token_repr(b) for b in raw], raw) + "\n"
        if knocked is not None:
            header = f"ablated: {knocked}\n" + header
        if html_path is not None:
            policy = next(name for name, p in views.SPECIALS.items() if p == special_policy)
            page = page_file.model_page(
                model, tok, text, name=str(model_path), path=model_path, layer=layer, head=head, specials=policy,
                view=view or "attention",
            )  # fmt: skip
    html = None if page is None else _page_bytes(page)  # refused when too big, before any file is written
    if plot_path is not None:
        title = expl.title if example is not None else f"attention weights of layer {layer}, one panel per head"
        _plot(expl, plot_path, title)
    if as_json:
        click.echo(json.dumps(doc, ensure_ascii=False))
    else:
        click.echo(header + render(expl, precision=precision, full=full), nl=False)
    if html is not None:
        write_bytes(html_path, html)
    if plot_path is not None:
        click.echo(f"attention heatmaps written to {plot_path}", err=True)
    if html is not None:
        click.echo(f"page written to {html_path} ({len(html) / 1000:,.0f} KB)", err=True)
    return 0


def _check_view(view: str | None, html_path: Path | None, example: str | None, model_path: Path | None) -> None:
    """--view: only with --html, and a view the page will hold."""
    from tokenkit.cli import page_file

    if view is None:
        return
    if html_path is None:
        raise click.UsageError("--view picks the view a --html page opens in; give it with --html FILE")
    if example is not None and view not in page_file.EXAMPLE_VIEWS:
        raise click.UsageError(f"a --example page holds the worked examples only; drop --view {view}")
    if example is None and model_path is not None and view not in page_file.model_views(model_path):
        raise click.UsageError(f"the {view} view needs a run directory with its log.jsonl; {model_path} is not one")


def _page_bytes(page: Page) -> bytes:
    from tokenkit.cli import page_file

    html = page_file.page_html(page)
    if len(html) > page_file.MAX_BYTES:
        raise click.ClickException(
            f"the page would be {len(html) / 1e6:,.1f} MB, more than the {page_file.MAX_BYTES / 1e6:.0f} MB a --html "
            "file may hold (every layer and head's attention, one head's arithmetic); give a shorter text"
        )
    return html


def _plot(expl: Explanation, path: Path, title: str) -> None:
    from tokenkit.cli.explain_render import plot_attention

    weights = next(s for s in expl.steps if s.key.endswith("weights"))  # its labels: queries, keys
    plot_attention(expl.attention, weights.rows, weights.cols, path, title)


COMMANDS = (explain_command,)
