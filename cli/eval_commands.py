"""`tk eval`, in three modes:
- `-m MODEL FILE...`: a model's loss on held-out text, in nats per token, bits per byte and
  perplexity (pipeline/evaluate.py computes them);
- `-m MODEL --task TASK.jsonl`: a model's accuracy on a multiple-choice task, `acc` and
  `acc_norm` as lm-evaluation-harness scores them (pipeline/choices.py reads and scores it);
- `-t TOK [-t TOK ...] FILE...`: tokenizers side by side on a corpus, bytes per token and the
  rest (bpe/tokenizer_eval.py counts them), the whole corpus's and, with `--by-language` or
  `--group-by`, each group's of a JSONL corpus. TOK is anything `tk bpe-import` reads
  (`bpe.formats.source_format` tells which) or tk's own files (`pipeline.checkpoint.load_tokenizer`).

The corpus is read as train-model reads one (files, directories, compressed files, JSONL, stdin;
each file or JSON line a document), with the same special-token flags.

What it deliberately does not do: any scoring or counting itself, or train.
"""

from __future__ import annotations

import json
import os
import unicodedata
from pathlib import Path

import click

from tokenkit.cli.launch import end_together, mpi_world
from tokenkit.cli.notes import note, notes, warn
from tokenkit.cli.options import (
    check_device,
    corpus_options,
    device_option,
    json_option,
    model_option,
    path_option,
    quiet_option,
)
from tokenkit.cli.params import count
from tokenkit.cli.specials import special_options
from tokenkit.common import progress
from tokenkit.common.launcher import launched_size

# NumPy, the model and the codec are imported when the command runs, not for its --help.


@click.command("eval")
@model_option(required=False)
@click.option(
    "-t",
    "--tokenizer",
    "tokenizer_paths",
    multiple=True,
    metavar="TOK",
    help="without -m, repeatable: a tokenizer to compare (tk's tokenizer or model file, a run directory, "
    "a tokenizer.json or its directory, a NAME.tiktoken, GPT-2's pair as VOCAB,MERGES); with -m, the "
    "model's tokenizer, for a model file without one embedded (GPT.save's)",
)
@click.argument("corpus", nargs=-1, type=click.Path(path_type=Path))
@path_option(
    "--task",
    metavar="TASK.jsonl",
    help='with -m, instead of FILE...: a multiple-choice task, one item a line {"context": "...", "choices": '
    '["...", ...], "gold": i}; prints acc and acc_norm (lm-evaluation-harness\'s)',
)
@click.option(
    "--stride",
    type=count(1),
    default=None,
    help="tokens between the starts of two windows over a text longer than the context; each window scores "
    "only its new tokens (default: half the context; the context: disjoint windows, whose first tokens are "
    "not scored)",
)
@click.option(
    "--by-language",
    is_flag=True,
    help="with -t: a table per language of a JSONL corpus, its field `lang` (--group-by names another)",
)
@click.option(
    "--group-by",
    metavar="FIELD",
    help="with -t: a table per value of this field of a JSONL corpus (the text at --text-field, default text); "
    "with --task: acc and acc_norm per value of this field of the items too",
)
@click.option(
    "--pattern",
    help="with -t: the split pattern (gpt2, gpt4, none or a regex) of a bare .tiktoken file, one without "
    "NAME_tiktoken.json beside it, and of GPT-2's pair (default gpt2)",
)
@corpus_options
@json_option(
    'print one JSON object instead: -m {"tokens", "bytes", "loss", "bits_per_byte", "perplexity", ...}; '
    '--task {"acc", "acc_norm", "n", ..., "items": each one\'s "loglikelihoods", ...}'
)
@quiet_option("no progress bar")
@special_options
@device_option
def eval_command(
    model_path,
    tokenizer_paths,
    corpus,
    task,
    stride,
    by_language,
    group_by,
    pattern,
    glob,
    text_field,
    binary,
    as_json,
    quiet,
    special_policy,
    device,
) -> int:
    """Measure a model on held-out text (bits per byte) or a multiple-choice task, or tokenizers side by side.

    With -m: the model's loss in nats per token, bits per byte and perplexity. Bits per byte
    divides the summed losses (in bits) by the text's UTF-8 bytes, so that models with different
    tokenizers compare. Each file (or JSON line) is a document, scored apart.

    With -m and --task: each choice of each item scored by the log-likelihood of its tokens after
    the context; acc is the share of items whose gold choice scores highest, acc_norm the same
    per UTF-8 byte of the choice (as lm-evaluation-harness scores HellaSwag and ARC).

    With -t (repeatable), no -m: per tokenizer, bytes per token, tokens per word, the share of its
    vocabulary used, the share of bytes left as single-byte tokens, the longest token seen and
    the encode speed; --by-language: the same per language of a JSONL corpus.

    \b
    Examples:
      tk eval -m runs/demo corpora/tiny_tales.txt
      tk eval -m runs/demo held_out/ --glob '*.txt' --json
      tk eval -m runs/demo docs.jsonl --text-field text --stride 32
      tk eval -m runs/demo --task corpora/tiny_tales_task.jsonl
      tk eval -t gpt2.safetensors -t runs/demo corpora/tiny_tales_test.txt
      tk eval -t encoder.json,vocab.bpe -t tok.safetensors --by-language corpora/languages.jsonl
      tk eval -t hf_dir/tokenizer.json -t cl100k_base.tiktoken --pattern gpt4 docs/ --json
    """
    if task is not None:
        if model_path is None:
            raise click.UsageError("--task scores a model: give -m MODEL too")
        if corpus:
            raise click.UsageError("give held-out text (FILE...) or a task (--task TASK.jsonl), not both")
        given = [stride is not None, by_language, pattern is not None, glob is not None, text_field is not None]
        if any(given) or binary:
            raise click.UsageError(
                "--stride, --by-language, --pattern, --glob, --text-field and --binary read a corpus; --task reads "
                "its own file"
            )
    elif not corpus:
        raise click.UsageError("give the FILE... to evaluate on (or, with -m, a task: --task TASK.jsonl)")
    if model_path is None:
        if not tokenizer_paths:
            raise click.UsageError("give -m MODEL to score a model, or -t TOK (repeatable) to compare tokenizers")
        if stride is not None or device != "cpu":
            raise click.UsageError("--stride and --device are for a model (-m); -t alone compares tokenizers")
        if launched_size() > 1:
            raise click.UsageError("tk eval -t compares tokenizers in one process; run it without mpirun")
        return _eval_tokenizers(
            tokenizer_paths, corpus, by_language, group_by, pattern, glob, text_field, binary, as_json, quiet,
            special_policy,
        )  # fmt: skip
    if len(tokenizer_paths) > 1:
        raise click.UsageError(
            "with -m, -t names the model's tokenizer (one); to compare tokenizers, give -t without -m"
        )
    tokenizer_path = Path(tokenizer_paths[0]) if tokenizer_paths else None
    if task is None and (by_language or group_by is not None or pattern is not None):
        raise click.UsageError(
            "--by-language, --group-by and --pattern are for comparing tokenizers (-t without -m) and --group-by "
            "for a task too (--task)"
        )
    comm = mpi_world()  # under mpirun: the forward passes shared over the ranks (pipeline/eval_ranks.py)
    with end_together(comm):
        if comm is not None and device != "cpu":  # this rank's own GPU, before anything runs on one
            from tokenkit.pipeline.eval_ranks import local_rank
            from tokenkit.transformer.backends import use_gpu

            use_gpu(local_rank(comm))
        if task is not None:
            return _eval_task(comm, model_path, tokenizer_path, task, group_by, as_json, quiet, special_policy, device)
        return _eval_text(
            comm, model_path, tokenizer_path, corpus, stride, glob, text_field, binary, as_json, quiet, special_policy,
            device,
        )  # fmt: skip


def _eval_text(
    comm, model_path, tokenizer_path, corpus, stride, glob, text_field, binary, as_json, quiet, special_policy, device
) -> int:
    from tokenkit.bpe import Corpus
    from tokenkit.pipeline.eval_record import EvalRecord
    from tokenkit.pipeline.evaluate import default_stride, score_texts
    from tokenkit.pipeline.run import load_model_and_tokenizer

    lead = comm is None or comm.Get_rank() == 0  # under MPI rank 0 alone warns, prints and records
    check_device(device)
    if comm is not None:
        from tokenkit.pipeline.eval_ranks import check_inputs

        check_inputs(corpus)
    inputs = Corpus(list(corpus), glob=glob, text_field=text_field, binary=binary, warn=warn if lead else None)
    model, tok = load_model_and_tokenizer(model_path, tokenizer_path, device=device)
    if lead:
        record = EvalRecord.open(model_path, corpus, glob, text_field, binary, special_policy, warn=warn)  # eval.json
    context = model.config.context_length
    if stride is not None and stride > context:
        raise click.UsageError(
            f"--stride {stride} is more than the model's context ({context}); give at most {context}"
        )
    hide = quiet or as_json or not lead
    with progress.bar(total=inputs.size, desc="scoring", quiet=hide) as bar:
        if comm is None:
            score = score_texts(model, tok, inputs.documents(), special_policy, stride=stride, progress=bar.update)
        else:
            from tokenkit.pipeline import eval_ranks

            score = eval_ranks.score_texts(
                comm, model, tok, inputs.documents(), special_policy, stride=stride, progress=bar.update
            )
    if not lead:
        return 0
    stride = stride or default_stride(context)
    if as_json:
        click.echo(json.dumps({**score.to_dict(), "stride": stride, "context": context, "model": str(model_path)}))
    else:
        if score.skipped:
            note(f"skipped {score.skipped:,} documents shorter than two tokens (nothing to predict in them)")
        click.echo(f"documents:      {score.documents:,}")
        click.echo(f"tokens scored:  {score.tokens:,} (windows of {context} tokens, stride {stride})")
        click.echo(f"bytes:          {score.bytes:,}")
        click.echo(f"loss:           {score.loss:.4f} nats per token")
        click.echo(f"bits per byte:  {score.bits_per_byte:.4f}")
        click.echo(f"perplexity:     {score.perplexity:.3f}")
        if comm is not None:
            click.echo(f"scored on {comm.Get_size()} MPI ranks")
    record.write(score, stride=stride, context=context, say=notes(quiet), warn=warn)  # a run directory's eval.json
    return 0


# --- --task: a multiple-choice task -----------------------------------------------------------------


def _eval_task(comm, model_path, tokenizer_path, task, group_by, as_json, quiet, special_policy, device) -> int:
    from tokenkit.pipeline.choices import read_task, score_items
    from tokenkit.pipeline.run import load_model_and_tokenizer

    lead = comm is None or comm.Get_rank() == 0
    check_device(device)
    items = read_task(task, group_by)  # before the model loads: a bad line is said at once
    model, tok = load_model_and_tokenizer(model_path, tokenizer_path, device=device)
    context = model.config.context_length
    rows = sum(len(item.choices) for item in items)
    # under MPI the bar counts rank 0's own choices (its share of the passes)
    hide = quiet or as_json or not lead
    with progress.bar(total=rows if comm is None else None, desc="scoring", unit="choice", quiet=hide) as bar:
        if comm is None:
            scores = score_items(model, tok, items, special_policy, progress=bar.update)
        else:
            from tokenkit.pipeline import eval_ranks

            scores = eval_ranks.score_items(comm, model, tok, items, special_policy, progress=bar.update)
    if not lead:
        return 0
    doc = scores.to_dict()
    if as_json:
        head = {**doc, "context": context, "task": str(task), "model": str(model_path)}
        click.echo(json.dumps({**head, "items": head.pop("items")}))  # the figures first, the items last
        return 0
    if scores.truncated:
        note(
            f"{_plural(scores.truncated, 'item')} did not fit in the model's context ({context} tokens): the "
            "model read the last tokens of each, as lm-evaluation-harness does"
        )
    click.echo(f"items:     {scores.n:,} ({rows:,} choices)")
    _print_figures(doc)
    for group, figures in doc.get("groups", {}).items():
        click.echo(f"\n{group_by} {group}: {_plural(figures['n'], 'item')}")
        _print_figures(figures)
    return 0


def _print_figures(figures: dict) -> None:
    """acc and acc_norm, each with its standard error and its count of items."""
    n = figures["n"]
    for key in ("acc", "acc_norm"):
        right = round(figures[key] * n)
        spread = "" if figures[key + "_stderr"] is None else f" ± {figures[key + '_stderr']:.4f}"
        click.echo(f"{key + ':':<10} {figures[key]:.4f}{spread} ({right:,} of {n:,})")


# --- -t: tokenizers side by side -------------------------------------------------------------------


def _eval_tokenizers(
    values, corpus, by_language, group_by, pattern, glob, text_field, binary, as_json, quiet, special_policy
) -> int:
    from tokenkit.bpe import Corpus
    from tokenkit.bpe.tokenizer_eval import compare

    sources = [_sources(v) for v in values]
    names = _column_names(values, sources)
    if by_language or group_by is not None:
        group_by = group_by or "lang"
        text_field = text_field or "text"
    inputs = Corpus(list(corpus), glob=glob, text_field=text_field, group_field=group_by, binary=binary, warn=warn)
    tokenizers = [_load_tokenizer(s, pattern) for s in sources]
    if pattern is not None and not any(_takes_pattern(s) for s in sources):
        raise click.UsageError("--pattern is for a bare .tiktoken file or GPT-2's pair given with -t; leave it out")
    documents = inputs.grouped_documents() if group_by else ((None, d) for d in inputs.documents())
    hide = quiet or as_json
    with progress.bar(total=inputs.size, desc="encoding", quiet=hide) as bar:
        result = compare(tokenizers, documents, special_policy, progress=bar.update)
    sections = [*((f"{group_by} {g}", figures) for g, figures in result.groups.items()), ("all", result.total)]
    if as_json:
        doc = {
            "tokenizers": [
                {"name": n, "path": v, "vocab_size": t.vocab_size}
                for n, v, t in zip(names, values, tokenizers, strict=True)
            ],
            **_corpus_counts(result.total),
            "results": dict(zip(names, (f.to_dict() for f in result.total), strict=True)),
        }
        if group_by:
            doc["group_by"] = group_by
            doc["groups"] = {
                g: {**_corpus_counts(figures), "results": dict(zip(names, (f.to_dict() for f in figures), strict=True))}
                for g, figures in result.groups.items()
            }
        click.echo(json.dumps(doc, ensure_ascii=False))
        return 0
    for i, (title, figures) in enumerate(sections if group_by else sections[-1:]):
        counts = _corpus_counts(figures)
        heading = ", ".join(_plural(counts[k], k[:-1]) for k in ("documents", "bytes", "words"))
        click.echo(("\n" if i else "") + (f"{title}: {heading}" if group_by else heading))
        click.echo(_table(names, figures))
    return 0


def _sources(value: str) -> list[Path]:
    """The path (or GPT-2's two, "VOCAB,MERGES") a -t value names; a path with a comma that exists is one."""
    if "," not in value or os.path.lexists(value):
        return [Path(value)]
    parts = value.split(",")
    if len(parts) != 2 or not all(parts):
        raise click.UsageError(f"-t {value}: give one path, or GPT-2's pair as VOCAB,MERGES")
    return [Path(p) for p in parts]


def _takes_pattern(sources: list[Path]) -> bool:
    """Whether --pattern applies to these sources: GPT-2's pair, or a .tiktoken file without its
    NAME_tiktoken.json (which holds the pattern)."""
    from tokenkit.bpe import formats, library_files

    kind = formats.source_format(sources)
    bare = kind == "tiktoken" and not os.path.lexists(library_files.tiktoken_meta_path(sources[0]))
    return kind == "gpt2" or bare


def _load_tokenizer(sources: list[Path], pattern: str | None):
    """The tokenizer of a -t value: other libraries' files as `tk bpe-import` reads them, else tk's
    own (a tokenizer file, a model file, a run directory)."""
    from tokenkit.bpe import Tokenizer, formats
    from tokenkit.pipeline.checkpoint import load_tokenizer

    if formats.source_format(sources) is None:
        return load_tokenizer(sources[0])
    return formats.from_files(Tokenizer, sources, pattern if _takes_pattern(sources) else None)


def _column_names(values: tuple[str, ...], sources: list[list[Path]]) -> list[str]:
    """Each -t's column: its file's name, with as many of its folders as tell it from the others."""
    for depth in range(1, 1 + max(len(p.parts) for ps in sources for p in ps)):
        names = [",".join("/".join(p.parts[-depth:]) for p in ps) for ps in sources]
        if len(set(names)) == len(names):
            return names
    twice = next(v for i, v in enumerate(values) if v in values[:i])
    raise click.UsageError(f"-t {twice} is given twice; give each tokenizer once")


def _corpus_counts(figures) -> dict:
    """The documents, bytes and words that each tokenizer's figures are over (the same for all)."""
    first = figures[0]
    return {"documents": first.documents, "bytes": first.bytes, "words": first.words}


def _plural(n: int, what: str) -> str:
    return f"{n:,} {what}{'s' * (n != 1)}"


def _table(names: list[str], figures) -> str:
    """A column per tokenizer, a row per figure."""
    from tokenkit.bpe.show import token_repr

    def cell(value, form: str) -> str:
        return "-" if value is None else format(value, form)

    rows = [
        ("tokens", [f"{f.tokens:,}" for f in figures]),
        ("bytes per token", [cell(f.bytes_per_token, ".3f") for f in figures]),
        ("tokens per word", [cell(f.tokens_per_word, ".3f") for f in figures]),
        ("vocabulary used", [f"{cell(f.vocab_used, '.1%')} of {f.vocabulary:,}" for f in figures]),
        ("single-byte share", [cell(f.single_byte_share, ".1%") for f in figures]),
        (
            "longest token",
            ["-" if f.longest is None else f"{token_repr(f.longest)} ({len(f.longest)} B)" for f in figures],
        ),
        ("encode speed", [f"{cell(f.mb_per_s, '.2f')} MB/s" for f in figures]),
    ]
    label = max(len(r[0]) for r in rows)
    widths = [max(_width(c) for c in [name, *(r[1][i] for r in rows)]) for i, name in enumerate(names)]
    lines = []
    for head, cells in [("", names), *rows]:
        padded = [c + " " * (w - _width(c)) for c, w in zip(cells, widths, strict=True)]
        lines.append((head.ljust(label) + "  " + "  ".join(padded)).rstrip())
    return "\n".join(lines)


def _width(text: str) -> int:
    """Columns `text` takes in a terminal: wide East Asian characters two, combining marks none."""
    return sum(
        0 if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf")
        else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )  # fmt: skip


COMMANDS = (eval_command,)
