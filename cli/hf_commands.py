"""`tk export-hf` and `tk import-hf`: a model to and from a Hugging Face transformers directory.

Thin wrappers over `pipeline.hf_export` and `pipeline.hf_import`, which map the names and shapes
(GPT-2's and the Llama family's); these check the output path, call them and print what was
written in a line or two.

What it deliberately does not do: convert anything itself, or load transformers (the files are
written and read as safetensors and JSON).
"""

from __future__ import annotations

from pathlib import Path

import click

from tokenkit.cli.options import out_option, overwrite_option, tokenizer_option


@click.command("export-hf")
@click.argument("model_path", metavar="RUN_OR_MODEL", type=click.Path(path_type=Path))
@out_option("directory", "directory to write (created if needed)")
@tokenizer_option()
@overwrite_option("replace the model and tokenizer files of a directory that is not an earlier export")
def export_hf_command(model_path, directory, tokenizer_path, overwrite) -> int:
    """Write a model as a Hugging Face transformers directory (GPT-2's or Llama's).

    DIR gets config.json, model.safetensors, generation_config.json and the tokenizer's files;
    transformers' AutoModelForCausalLM.from_pretrained(DIR) and AutoTokenizer.from_pretrained(DIR)
    load them: GPT2LMHeadModel, or LlamaForCausalLM for a model with rotary positions, RMSNorm
    and SwiGLU (--arch llama). Post-norm, sinusoidal and bidirectional models have neither form.

    \b
    Example:
      tk export-hf runs/demo -o demo-hf
    """
    from tokenkit.common import atomic_dir
    from tokenkit.pipeline import hf_export

    atomic_dir.check_output_dir(directory)
    result = hf_export.export_hf(model_path, directory, tokenizer_path=tokenizer_path, overwrite=overwrite)
    shape = _shape(result.config)
    click.echo(f"wrote {result.directory}: {result.architecture}, {result.n_params:,} parameters ({shape})")
    click.echo(f"files: {', '.join(sorted(p.name for p in result.files))}")
    if result.removed:
        click.echo(f"removed the earlier export's {', '.join(p.name for p in result.removed)}")
    return 0


@click.command("import-hf")
@click.argument("directory", metavar="DIR", type=click.Path(path_type=Path))
@out_option("out", "model file to write (e.g. gpt2.safetensors)", directory=False)
@overwrite_option("replace OUT if it exists")
@click.option(
    "--context",
    "context",
    type=click.IntRange(1),
    default=None,
    help="a window of this many tokens instead of max_position_embeddings (rotary models: Llama 3.1's 131,072 "
    "is beyond tk's 65,536)",
)
@click.option(
    "--tokenizer-json",
    "tokenizer_json",
    is_flag=True,
    help="read DIR/tokenizer.json as written, whatever class tokenizer_config.json names (SmolLM's names "
    "GPT2Tokenizer, which transformers 5 builds without the file's Digits split)",
)
def import_hf_command(directory, out, overwrite, context, tokenizer_json) -> int:
    """Read a transformers checkpoint directory into one tokenkit model file.

    DIR holds config.json (GPT-2's, or Llama's, Mistral's or Qwen2's), model.safetensors (or
    model.safetensors.index.json and its shards) and the tokenizer (a byte-level BPE
    tokenizer.json, or vocab.json + merges.txt). The -o file works with predict-next,
    generate, explain and info, and train-model --init-from fine-tunes it. pytorch_model.bin
    is a pickle and is refused: convert it to safetensors first.

    \b
    Example:
      tk import-hf gpt2-hf -o gpt2.safetensors
    """
    from tokenkit.common import atomic
    from tokenkit.pipeline import hf_import

    atomic.check_output(out)  # a device, FIFO or socket at -o is refused, with or without --overwrite
    result = hf_import.import_hf(
        directory, out, overwrite=overwrite, context_length=context, tokenizer_json=tokenizer_json
    )
    shards = f" in {result.shards} shards" if result.shards > 1 else ""
    source = "" if result.architecture == "GPT2LMHeadModel" else f" of {result.architecture}"
    click.echo(
        f"wrote {result.path}: {result.n_params:,} parameters{source} ({_shape(result.config)}; "
        f"{'/'.join(result.dtypes)}{shards} -> float32) + tokenizer"
    )
    return 0


def _shape(cfg) -> str:
    """A model's sizes in a few words (`GPTConfig.describe`), and an untied head where it has one."""
    return cfg.describe() + ("" if cfg.tie_embeddings else ", untied head")


COMMANDS = (export_hf_command, import_hf_command)
