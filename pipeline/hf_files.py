"""What writing and reading a Hugging Face transformers checkpoint directory share
(pipeline/hf_export.py writes one, pipeline/hf_import.py reads one): the names of its files, the
`transformer.` prefix of GPT2LMHeadModel's tensor names, and `read_json`, which reads its JSON
files (config.json, the shards' index) with a size limit each, failing in one PipelineError line.

tk's model *is* GPT-2's architecture when it is pre-norm, causal, with learned positions: the
same parameter names (`transformer.` prefixed in a `GPT2LMHeadModel` checkpoint), the same
Conv1D (in, out) weight layout, LayerNorm epsilon 1e-5, tanh GELU (`gelu_new`), attention
scaled by 1/sqrt(head size), and the output projection tied to `wte`. So both directions copy
tensors and translate the config; no weight is transposed or renamed beyond the prefix. With
rotary positions, RMSNorm and SwiGLU it is Llama's: q, k, v (and gate, up) are columns of one
tk parameter, and torch's Linear weights are transposed (pipeline/hf_llama.py says how).

What it deliberately does not do: write a file, read a tensor, or translate a config or a tensor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenkit.common import FileError, jsonsafe, readfile
from tokenkit.pipeline.errors import PipelineError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PREFIX = "transformer."
CONFIG_LIMIT = readfile.HF_CONFIG_LIMIT  # config.json is ~1 KB (common/readfile.py says why 4 MiB)
INDEX_LIMIT = readfile.JSON_LIMIT  # an index of a huge sharded model is under 1 MB


def read_json(path: Path, what: str, limit: int = CONFIG_LIMIT) -> Any:
    """The JSON value of `path` (a `what`, as errors name it), or one PipelineError line when it
    cannot be read, is over `limit` bytes (refused before it is read) or is not JSON."""
    try:
        return jsonsafe.loads(readfile.read_bytes(path, limit, f"a {what}"), str(path))
    except FileError as err:
        raise PipelineError(str(err)) from None
