"""`tk bpe-train`, `tk encode`, `tk decode`, `tk bpe-import`, `tk bpe-export`: thin wrappers over `bpe`.

Each command parses flags, calls the `bpe` API and prints: results to stdout, progress bars to
stderr. Mistakes arrive as TokenizerError (or click errors) and become one line in `cli.commands`.
Under mpirun, bpe-train and encode -f share the counting or encoding among the ranks (`bpe.distributed`).

What it deliberately does not do: any tokenizer work itself, or train or run a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tokenkit.bpe.names import EXPORT_FORMATS
from tokenkit.cli.launch import end_together, mpi_world
from tokenkit.cli.notes import warn
from tokenkit.cli.options import (
    TOKENIZER_OR_MODEL,
    corpus_options,
    eot_option,
    file_option,
    json_option,
    output_option,
    overwrite_option,
    path_option,
    pattern_option,
    quiet_option,
    special_tokens_option,
    tokenizer_option,
    workers_option,
)
from tokenkit.cli.params import count
from tokenkit.cli.specials import flags_in_errors, special_options
from tokenkit.common.messages import short

if TYPE_CHECKING:
    import numpy as np

    from tokenkit.bpe import Corpus, Tokenizer

# The codec, NumPy and the pipeline are imported by each command when it runs, so that `tk encode
# --help` does not wait for them (tests/test_cli_main.py).

_STOP_REASONS = {
    "vocab_size": "the vocabulary reached --vocab-size",
    "min_frequency": "the most frequent pair occurs fewer than --min-frequency times",
    "no_pairs": "no adjacent pairs are left (every chunk is a single token)",
}


def _corpus(inputs, glob, text_field, binary, comm) -> Corpus:
    """The corpus of the command line; under MPI only rank 0 warns."""
    from tokenkit.bpe import Corpus

    quiet = comm is not None and comm.Get_rank() > 0
    return Corpus(list(inputs), glob=glob, text_field=text_field, binary=binary, warn=None if quiet else warn)


@click.command("bpe-train")
@click.argument("corpus", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--vocab-size",
    type=int,
    default=None,
    help="Stop at this many ids: 256 bytes + merges + specials.  [default: no limit]",
)
@click.option(
    "--min-frequency",
    type=count(1),
    default=2,
    show_default=True,
    help="Stop when the best pair occurs fewer times than this.",
)
@pattern_option("Split pattern: gpt2, gpt4, none, or a regex. Merges never cross its chunks.", default="gpt2")
@special_tokens_option("A special token (repeatable); ids follow the merges.")
@workers_option("Processes for counting.  [default: all cores]")
@click.option("-v", "--verbose", is_flag=True, help="Print every merge: rank, the pair as text, its count.")
@quiet_option("No progress bars.")
@output_option("Where to write the tokenizer.", default=Path("tokenizer.safetensors"))
@corpus_options
def bpe_train_command(
    corpus, vocab_size, min_frequency, pattern, specials, workers, verbose, quiet, output, glob, text_field, binary
) -> int:
    """Learn a byte-level BPE tokenizer from text files.

    CORPUS: files, directories (every file below, sorted by path), - for stdin, or pipes;
    gzip, bzip2, xz and zstd files are decompressed; JSON Lines with --text-field. Merges never
    cross two documents (files, JSONL records).

    Counts the corpus's pre-token chunks, then merges the most frequent adjacent pair again and
    again until --vocab-size or --min-frequency stops it, and writes a tokenizer.safetensors.

    \b
    Examples:
      tk bpe-train corpora/tiny_tales.txt --vocab-size 1024 --special '<|endoftext|>' -o tok.safetensors
      tk bpe-train data/ --glob '*.jsonl.gz' --text-field text --vocab-size 32000 -o tok.safetensors
    """
    comm = mpi_world()
    with end_together(comm):
        inputs = _corpus(corpus, glob, text_field, binary, comm)
        return _bpe_train(comm, inputs, vocab_size, min_frequency, pattern, specials, workers, verbose, quiet, output)


def _bpe_train(comm, corpus, vocab_size, min_frequency, pattern, specials, workers, verbose, quiet, output) -> int:
    from tokenkit.bpe import Tokenizer
    from tokenkit.bpe.train_corpus import describe_merge
    from tokenkit.common import atomic

    atomic.check_output(output)  # a device, FIFO or socket at -o is refused before the counting
    on_merge = None
    if verbose:
        vocab = [bytes([i]) for i in range(256)]

        def on_merge(rank, pair, count):
            vocab.append(vocab[pair[0]] + vocab[pair[1]])
            click.echo(describe_merge(vocab, rank, pair, count))

    options = dict(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        pattern=pattern,
        special_tokens=specials,
        quiet=quiet,
        on_merge=on_merge,
    )
    split = None
    if comm is None:
        tok = Tokenizer.train(corpus, workers=workers, **options)
    else:  # within a rank, one process unless --workers says otherwise
        from tokenkit.bpe import distributed

        tok, split = distributed.train(comm, corpus, workers=workers or 1, **options)
        if tok is None:  # not rank 0: its counts went to rank 0, which writes and reports
            return 0
    tok.save(output)
    report = tok.train_report
    specials_text = f" + {len(specials)} special" + ("s" if len(specials) != 1 else "") if specials else ""
    click.echo(
        f"wrote {output}: 256 bytes + {report.merges_learned} merges{specials_text} = vocab size {tok.vocab_size}"
    )
    click.echo(f"stopped because {_STOP_REASONS.get(report.stop_reason, report.stop_reason)}")
    click.echo(f"time: {report.seconds:.2f} s ({report.unique_chunks:,} distinct chunks)")
    click.echo(
        f"bytes per token on the corpus: {report.bytes_per_token:.2f} "
        f"({report.corpus_bytes:,} bytes -> {report.corpus_tokens:,} tokens)"
    )
    if split is not None:
        click.echo(f"counted on {split.describe()}")
    return 0


@click.command("encode")
@tokenizer_option(TOKENIZER_OR_MODEL, required=True)
@click.argument("text", required=False)
@file_option("Encode this corpus instead of TEXT: a file (its exact bytes), a directory, - for stdin, or a pipe.")
@json_option("Print the ids as a JSON list.")
@output_option("Write the ids to a .npy file (uint16, or uint32 for big vocabularies).")
@special_options
@click.option("--show", is_flag=True, help="Show each token's text next to its id, to see where the boundaries fall.")
@workers_option("Processes for -f FILE.  [default: all cores]")
@quiet_option("No progress bar.")
@eot_option("With -f: put this special token's id between documents (files, JSONL records).")
@corpus_options
@path_option(
    "--chat",
    help='Render each conversation of this JSONL file ({"messages": [...]}) with the chat template: its ids and '
    "the mask of the tokens fine-tuning learns (each assistant turn and its end).",
)
@click.option(
    "--generation-prompt", is_flag=True, help="With --chat: end each conversation with the assistant's opening."
)
@path_option(
    "--add-chat-tokens",
    "chat_tokens_output",
    help="Write the tokenizer with the chat template's special tokens appended (other ids unchanged) to this new file.",
)
def encode_command(
    tokenizer_path,
    text,
    file,
    as_json,
    output,
    special_policy,
    show,
    workers,
    quiet,
    eot,
    glob,
    text_field,
    binary,
    chat,
    generation_prompt,
    chat_tokens_output,
) -> int:
    """Turn text into token ids.

    With --chat: each conversation of a JSONL file as tk's chat template renders it, with the
    tokens fine-tuning learns (each assistant turn and its end) marked.

    \b
    Examples:
      tk encode -t gpt2.safetensors "hello world"
      tk encode -t tok.safetensors --show "Once upon a time"
      tk encode -t tok.safetensors -f corpus.txt -o ids.npy
      tk encode -t tok.safetensors -f docs.jsonl.gz --text-field text --eot '<|endoftext|>' -o ids.npy
      tk encode -t tok.safetensors --add-chat-tokens chat_tok.safetensors
      tk encode -t chat_tok.safetensors --chat chats.jsonl --json
    """
    from tokenkit.common import atomic
    from tokenkit.pipeline.checkpoint import load_tokenizer

    if chat is not None or chat_tokens_output is not None or generation_prompt:
        plain = (text, file, output, eot, glob, text_field) == (None,) * 6 and not (binary or show)
        if not plain or special_policy["allowed_special"] or special_policy["disallowed_special"] != "all":
            raise click.UsageError(
                "--chat and --add-chat-tokens take only -t, --generation-prompt and --json: the template encodes "
                "every content as text"
            )
        if generation_prompt and chat is None:
            raise click.UsageError("--generation-prompt is for --chat FILE")
        comm = mpi_world()
        with end_together(comm):
            if comm is not None and comm.Get_rank():  # conversations are rank 0's alone
                return 0
            return _encode_chat(load_tokenizer(tokenizer_path), tokenizer_path, chat, generation_prompt,
                                chat_tokens_output, as_json)  # fmt: skip
    if (text is None) == (file is None):
        raise click.UsageError("give either TEXT or -f FILE (exactly one)")
    if file is None and (eot is not None or glob is not None or text_field is not None or binary):
        raise click.UsageError("--eot, --glob, --text-field and --binary are for -f FILE")
    comm = mpi_world()
    with end_together(comm), flags_in_errors():  # under MPI the error is said inside, by its rank
        if comm is not None and comm.Get_rank() and file is None:  # a text is rank 0's alone
            return 0
        if output is not None:
            atomic.check_output(output)  # before any encoding
        tok = load_tokenizer(tokenizer_path)
        if file is None:
            arr, n_bytes = _encode_text(tok, text, output, special_policy)
            split = None
        else:
            from tokenkit.bpe.encode_corpus import eot_id  # the workers' module: for -f only

            eot_id(tok, eot)  # a mistake in the flags is said before the corpus is looked at
            inputs = _corpus([file], glob, text_field, binary, comm)
            arr, n_bytes, split = _encode_corpus(comm, tok, inputs, output, workers, quiet, special_policy, eot)
            if arr is None:  # not rank 0: its ids went to rank 0, which writes and reports
                return 0
        return _print_ids(tok, arr, n_bytes, split, output, show, as_json)


def _encode_text(tok: Tokenizer, text: str, output, special_policy) -> tuple[np.ndarray, int]:
    """TEXT's ids (written to `output` when given) and its length in bytes."""
    import numpy as np

    from tokenkit.bpe import io as bpe_io

    arr = np.asarray(tok.encode(text, **special_policy), dtype=tok.ids_dtype)
    if output is not None:
        bpe_io.save_ids(output, arr)
    return arr, len(text.encode("utf-8", errors="surrogateescape"))


def _encode_corpus(comm, tok: Tokenizer, inputs: Corpus, output, workers, quiet, special_policy, eot):
    """-f FILE's ids (written to `output` when given), its length in bytes and, under MPI, how
    the ranks split it; (None, 0, split) on a rank other than 0."""
    from tokenkit.bpe.encode_corpus import encode_corpus

    if comm is None:
        encoded = encode_corpus(tok, inputs, output, workers=workers, quiet=quiet, **special_policy, eot=eot)
        return encoded.ids, encoded.n_bytes, None
    from tokenkit.bpe import distributed  # within a rank, one process unless --workers says otherwise

    arr, split = distributed.encode_file(
        comm, tok, inputs, output, workers=workers or 1, quiet=quiet, **special_policy, eot=eot
    )
    return arr, (0 if arr is None else sum(split.bytes_per_rank)), split


def _print_ids(tok: Tokenizer, arr: np.ndarray, n_bytes: int, split, output, show: bool, as_json: bool) -> int:
    """What was written (with -o), then the ids as --show, --json or the plain list asks."""
    if output is not None:
        click.echo(
            f"wrote {len(arr):,} tokens ({arr.dtype}) to {output}; {n_bytes / max(len(arr), 1):.2f} bytes per token"
        )
        if split is not None:
            click.echo(f"encoded on {split.describe()}")
        if not show:
            return 0  # a big file's ids stay on disk: never turned into a Python list
    ids = arr.tolist()
    if show:
        for i, piece in zip(ids, tok.token_pieces(ids), strict=True):
            click.echo(f"{i:>7}  {piece!r}")
        click.echo(f"{len(ids)} tokens for {n_bytes} bytes")
    elif as_json:
        click.echo(json.dumps(ids))
    else:
        click.echo(" ".join(map(str, ids)))
    return 0


def _encode_chat(tok: Tokenizer, tokenizer_path, chat, generation_prompt, output, as_json) -> int:
    """--add-chat-tokens OUT (a new file) then --chat FILE: each conversation as the template
    renders it (tk's, bpe/chat_template.py, or the tokenizer's own: bpe/template_ids.py), one per
    line with --json, a line per turn otherwise."""
    from tokenkit.bpe import chat_template, template_ids
    from tokenkit.bpe.conversations import read_conversations
    from tokenkit.common import atomic

    if output is not None:
        atomic.check_output(output)  # a device, FIFO or socket is said as what it is
        if output.exists() or output.is_symlink():
            raise click.UsageError(f"{output} exists; --add-chat-tokens writes a new file, give another path")
        added = chat_template.missing(tok)
        tok = chat_template.add_chat_tokens(tok)
        tok.save(output)
        ids = ", ".join(f"{t}={tok.special_tokens[t]}" for t in added) or "none: it had them all"
        click.echo(f"wrote {output}: vocab size {tok.vocab_size}; added {ids}")
    if chat is None:
        return 0
    own = template_ids.template_name(tok) == "jinja"  # the tokenizer's own template, imported with it
    lacks = [] if own else chat_template.missing(tok)
    if lacks:
        raise click.ClickException(
            f"{tokenizer_path} lacks the chat template's special tokens {', '.join(lacks)}; add them with "
            f"tk encode -t {tokenizer_path} --add-chat-tokens NEW.safetensors (appended ids; the others stay)"
        )
    end = template_ids.end_of_turn(tok, str(tokenizer_path)) if own else None
    for conversation in read_conversations(chat, prompt=generation_prompt):  # all checked before one prints
        rendered = template_ids.render(
            tok, conversation, generation_prompt=generation_prompt, where=str(tokenizer_path)
        )
        if as_json:
            click.echo(json.dumps(rendered.as_json()))
        else:
            counted = int(rendered.mask.sum())
            click.echo(f"line {rendered.line}: {len(rendered.ids)} tokens, {counted} counted (*)")
            click.echo("\n".join(rendered.shown(tok, end)))
    return 0


@click.command("decode")
@tokenizer_option(TOKENIZER_OR_MODEL, required=True)
@click.argument("ids", nargs=-1)
@file_option("Decode the ids in this .npy file instead of IDS.")
def decode_command(tokenizer_path, ids, file) -> int:
    """Turn token ids back into text (bytes that are not valid UTF-8 print as U+FFFD).

    IDS may be separated by spaces or commas, and may be a JSON list as `tk encode --json` prints.

    \b
    Examples:
      tk decode -t gpt2.safetensors 31373 995
      tk decode -t gpt2.safetensors "[31373, 995]"
      tk decode -t tok.safetensors -f ids.npy
    """
    from tokenkit.bpe import io as bpe_io
    from tokenkit.pipeline.checkpoint import load_tokenizer

    if bool(ids) == (file is not None):
        raise click.UsageError("give either IDS or -f FILE (exactly one)")
    tok = load_tokenizer(tokenizer_path)
    if file is not None:
        values = bpe_io.load_ids(file)
    else:
        words = " ".join(ids).replace(",", " ").replace("[", " ").replace("]", " ").split()
        values = []
        for w in words:
            try:  # int() itself is the test: '²' passes isdigit() and fails int()
                values.append(int(w))
            except ValueError:
                raise click.BadParameter(
                    f"{short(w)} is not a token id (ids are whole numbers)", param_hint="IDS"
                ) from None
    click.echo(tok.decode(values))
    return 0


@click.command("bpe-import")
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@output_option("Where to write the tokenizer.safetensors.", required=True)
@pattern_option(
    "Split pattern: gpt2, gpt4, none or a regex. For GPT-2's pair (default gpt2) and a bare .tiktoken file "
    "(required); tokenizer.json holds its own."
)
@special_tokens_option("A special token of a bare .tiktoken file (repeatable); ids follow the ranks.")
def bpe_import_command(sources, output, pattern, specials) -> int:
    """Import a byte-level BPE tokenizer from GPT-2's, Hugging Face's or tiktoken's files.

    SOURCES is GPT-2's pair (encoder.json + vocab.bpe, or vocab.json + merges.txt), a Hugging Face
    tokenizer.json (or a directory holding it), or a tiktoken rank file (NAME.tiktoken; the pattern
    and special tokens come from NAME_tiktoken.json beside it, or from --pattern and --special).
    The imported tokenizer gives the library's exact ids.

    \b
    Examples:
      tk bpe-import encoder.json vocab.bpe -o gpt2.safetensors
      tk bpe-import hf_dir/tokenizer.json -o tok.safetensors
      tk bpe-import gpt2.tiktoken --pattern gpt2 --special '<|endoftext|>' -o gpt2.safetensors
    """
    from tokenkit.bpe import Tokenizer, formats
    from tokenkit.common import atomic

    atomic.check_output(output)
    if len(sources) > 2:
        raise click.UsageError("give one file (tokenizer.json, a .tiktoken file, a directory) or GPT-2's two files")
    kind = formats.source_format(sources) or "hf"  # what is none of the formats is read as a tokenizer.json
    if specials and kind != "tiktoken":
        raise click.UsageError("--special is for a .tiktoken file; the other formats hold their special tokens")
    if pattern is not None and kind == "hf":
        raise click.UsageError("tokenizer.json holds its own split pattern; leave out --pattern")
    tok = formats.from_files(Tokenizer, sources, pattern, specials)
    tok.save(output)
    specials_text = ", ".join(f"{s}={i}" for s, i in tok.special_tokens.items()) or "none"
    ids = (
        f"{tok.vocab_size - len(tok.special_tokens)} tokens listed with {len(tok.merges)} merges"
        if tok.listed
        else f"256 bytes + {len(tok.merges)} merges"
    )
    bos = f" (bos {tok.bos})" if tok.bos else ""
    click.echo(f"wrote {output}: {ids}, specials: {specials_text}{bos}; vocab size {tok.vocab_size}")
    return 0


@click.command("bpe-export")
@click.argument("tokenizer_path", type=click.Path(path_type=Path))
@output_option("Directory for the files (created if missing).", required=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(EXPORT_FORMATS),
    default="gpt2",
    show_default=True,
    help="gpt2: vocab.json + merges.txt; hf: tokenizer.json (+ tokenizer_config.json, special_tokens_map.json); "
    "tiktoken: tokenizer.tiktoken + tokenizer_tiktoken.json.",
)
@overwrite_option("replace the format's files if the directory holds them already")
def bpe_export_command(tokenizer_path, output, fmt, overwrite) -> int:
    """Write a tokenizer in GPT-2's, Hugging Face's or tiktoken's format.

    The files give tk's exact ids in those libraries; a vocabulary a format cannot express
    exactly is refused in one line and nothing is written. The files arrive together, so a
    reader never finds a new one beside an old one; other files in the directory stay.

    \b
    Examples:
      tk bpe-export tok.safetensors -o tok_readable/
      tk bpe-export tok.safetensors --format hf -o tok_hf/
      tk bpe-export tok.safetensors --format tiktoken -o tok_tiktoken/
    """
    from tokenkit.common import atomic_dir
    from tokenkit.pipeline.checkpoint import load_tokenizer

    atomic_dir.check_output_dir(output)
    tok = load_tokenizer(tokenizer_path)
    paths = tok.export(output, fmt, overwrite=overwrite)
    if fmt == "gpt2":
        click.echo(f"wrote {paths[0]} ({tok.vocab_size} tokens) and {paths[1]} ({len(tok.merges)} merges)")
    elif fmt == "hf":
        click.echo(
            f"wrote {paths[0]} ({tok.vocab_size} tokens, {len(tok.merges)} merges), {paths[1].name} and {paths[2].name}"
        )
    else:
        n_specials = len(tok.special_tokens)
        click.echo(
            f"wrote {paths[0]} ({tok.vocab_size - n_specials} ranks) and "
            f"{paths[1]} ({n_specials} special token{'s' * (n_specials != 1)})"
        )
    return 0


COMMANDS = (bpe_train_command, encode_command, decode_command, bpe_import_command, bpe_export_command)
