"""Other libraries' tokenizer files: read into plain values, and written from them.

What it does:
- GPT-2's published formats: `read_gpt2` (encoder.json + vocab.bpe, or vocab.json + merges.txt) and
  `gpt2_files` (vocab.json + merges.txt, so people can open a tokenizer in an editor).
- Hugging Face's `tokenizer.json` (`find_hf`, `read_hf`, `hf_files`, with tokenizer_config.json and
  special_tokens_map.json; `read_hf_configs`, the configs that decide transformers' class;
  `read_hf_chat_template`, chat_template.jinja) and
  tiktoken's rank files (`read_tiktoken`, `tiktoken_files`, with a `NAME_tiktoken.json` of
  pat_str and special tokens).
- `write_files` puts an export's files into a directory as one change
  (`common.atomic_dir.replace_files`), replacing files already there only when asked to.

What it deliberately does not do: convert between those formats and tk's parts (bpe/interop.py,
bpe/hf_import.py), build a `Tokenizer` (bpe/formats.py does, from these), or read and write tk's
own files (bpe/io.py).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path

from tokenkit.bpe import hf_import
from tokenkit.bpe.bytelevel import bytes_to_unicode
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.io import check_readable, read_limited
from tokenkit.bpe.jinja_template import MAX_TEMPLATE_CHARS
from tokenkit.common import FileError, atomic_dir, jsonsafe, readfile

# the values a tokenizer.json or vocab.json may make when parsed (`jsonsafe.items`; ~70 bytes of memory
# each): the largest published tokenizer.json, Gemma 3's, makes ~2 million (262k tokens, 514k merges)
TOKENIZER_JSON_ITEMS = 8_000_000
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where transformers 5 saves a tokenizer's one chat template

__all__ = [
    "find_hf",
    "gpt2_files",
    "hf_files",
    "read_gpt2",
    "read_hf",
    "read_hf_chat_template",
    "read_hf_configs",
    "read_tiktoken",
    "tiktoken_files",
    "tiktoken_meta_path",
    "write_files",
]


# ---------------------------------------------------------------------------------------------
# GPT-2 formats


def read_gpt2(vocab_path: str | os.PathLike, merges_path: str | os.PathLike) -> dict:
    """Parts of a tokenizer from GPT-2's files (encoder.json + vocab.bpe or vocab.json + merges.txt).

    The JSON maps token strings (bytes through `bytes_to_unicode`) to ids; the merges file lists
    one "left right" pair per line in rank order after a "#version" header. Ids 0-255 must be the
    single bytes (in any order), merge r must produce id 256 + r, and anything after the merges is
    a special token (GPT-2: <|endoftext|> = 50256).
    """
    vocab_path, merges_path = check_readable(Path(vocab_path)), check_readable(Path(merges_path))
    vocab = read_limited(vocab_path, readfile.TOKENIZER_JSON_LIMIT, "GPT-2's encoder.json or vocab.json")
    try:
        encoder = jsonsafe.loads(vocab, str(vocab_path), max_items=TOKENIZER_JSON_ITEMS)
    except FileError as err:  # invalid, not UTF-8, or nested absurdly deep
        raise TokenizerError(f"{err}; give GPT-2's encoder.json or vocab.json") from None
    if not isinstance(encoder, dict) or not all(type(v) is int for v in encoder.values()):
        raise TokenizerError(f"{vocab_path}: expected a JSON object of token string -> id")
    merges_text = read_limited(merges_path, readfile.TOKENIZER_LIMIT, "GPT-2's vocab.bpe or merges.txt")
    try:
        lines = merges_text.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise TokenizerError(f"{merges_path}: not UTF-8 text; give vocab.bpe or merges.txt") from None
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    byte_order = [None] * 256
    for char, b in byte_of.items():
        i = encoder.get(char)
        if i is None or not 0 <= i < 256:
            raise TokenizerError(
                f"{vocab_path}: the byte token {char!r} must have an id in 0..255 (got {i}); "
                "is this a GPT-2 style vocabulary?"
            )
        byte_order[i] = b
    merges = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or (lineno == 1 and line.startswith("#version")):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenizerError(f"{merges_path}:{lineno}: expected 'left right', got {line[:40]!r}")
        left, right = parts
        ids = encoder.get(left), encoder.get(right), encoder.get(left + right)
        if None in ids:
            raise TokenizerError(f"{merges_path}:{lineno}: {line!r} uses a token missing from {vocab_path.name}")
        expected = 256 + len(merges)
        if ids[2] != expected:
            raise TokenizerError(
                f"{merges_path}:{lineno}: merge {len(merges)} makes id {ids[2]}, expected {expected}; "
                "the files do not belong together"
            )
        merges.append((ids[0], ids[1]))
    n_tokens = 256 + len(merges)
    specials = {s: i for s, i in encoder.items() if i >= n_tokens}
    if len(encoder) != n_tokens + len(specials) or set(specials.values()) != set(
        range(n_tokens, n_tokens + len(specials))
    ):
        raise TokenizerError(
            f"{vocab_path}: has {len(encoder)} entries, expected 256 bytes + {len(merges)} merges + specials "
            "with consecutive ids after them; the files do not belong together"
        )
    return {"merges": merges, "byte_order": byte_order, "special_tokens": specials}


def gpt2_files(vocab: list[bytes], merges: list[tuple[int, int]], special_tokens: dict[str, int]) -> dict[str, bytes]:
    """`vocab.json` + `merges.txt` (GPT-2's format, as Hugging Face names them): name -> contents."""
    table = bytes_to_unicode()
    names = ["".join(table[b] for b in token) for token in vocab]
    encoder = {name: i for i, name in enumerate(names)}
    encoder.update(special_tokens)
    lines = ["#version: 0.2"] + [f"{names[a]} {names[b]}" for a, b in merges]
    return {
        "vocab.json": json.dumps(encoder, ensure_ascii=False).encode("utf-8"),
        "merges.txt": ("\n".join(lines) + "\n").encode("utf-8"),
    }


def write_files(directory: str | os.PathLike, files: dict[str, bytes], *, overwrite: bool = False) -> list[Path]:
    """Put an export's `files` (name -> contents) into `directory` (created if missing) as one
    change: a reader sees all the old ones or all the new ones (`common.atomic_dir.replace_files`;
    in a mount point a crash still ends so, a reader during the moves may see a mix), and the
    directory's other files stay. Files of the same names already there are replaced only
    with `overwrite`; a path that is a file is refused, never replaced. An export with a chat
    template is refused where a chat_template.jinja (not ours: we never write one) would win over
    it in transformers 5. Returns the paths."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise TokenizerError(f"{directory}: exists and is not a directory")
    present = [name for name in files if os.path.lexists(directory / name)]
    if "tokenizer_config.json" in files and os.path.lexists(directory / CHAT_TEMPLATE_FILE):
        if "chat_template" in json.loads(files["tokenizer_config.json"]):
            raise TokenizerError(
                f"{directory / CHAT_TEMPLATE_FILE} is not this export's, and transformers would read its template "
                "before the one in tokenizer_config.json; move it away or choose another directory"
            )
    if present and not overwrite:
        raise TokenizerError(
            f"{directory} already holds {', '.join(present)}; choose another directory, "
            "or pass --overwrite to replace them"
        )
    try:
        atomic_dir.replace_files(directory, files)
    except FileError as err:
        raise TokenizerError(str(err)) from None
    return [directory / name for name in files]


def _json_bytes(value) -> bytes:
    return (json.dumps(value, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


def _read_json(path: Path, hint: str, what: str, limit: int = readfile.HF_CONFIG_LIMIT, max_items: int | None = None):
    """A JSON file of at most `limit` bytes (refused before it is read) and `max_items` values
    (refused before the parse: `jsonsafe.items`)."""
    path = check_readable(path)
    data = read_limited(path, limit, what)
    try:
        return jsonsafe.loads(data, str(path), max_items=max_items)
    except FileError as err:
        raise TokenizerError(f"{err}; {hint}") from None


# ---------------------------------------------------------------------------------------------
# Hugging Face and tiktoken formats


def hf_files(data: dict, config: dict, special_map: dict) -> dict[str, bytes]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json: name -> contents."""
    return {
        "tokenizer.json": _json_bytes(data),
        "tokenizer_config.json": _json_bytes(config),
        "special_tokens_map.json": _json_bytes(special_map),
    }


def find_hf(path: str | os.PathLike) -> tuple[Path, ...]:
    """The files of a Hugging Face tokenizer at `path`: (tokenizer.json,) or (vocab.json, merges.txt).

    `path` is a tokenizer.json or a directory holding one (preferred) or vocab.json + merges.txt.
    """
    path = Path(path)
    if not path.is_dir():
        return (check_readable(path),)
    # lexists, not is_file: a tokenizer.json that is a FIFO or a device is named by its reader
    if os.path.lexists(path / "tokenizer.json"):
        return (path / "tokenizer.json",)
    if os.path.lexists(path / "vocab.json") and os.path.lexists(path / "merges.txt"):
        return (path / "vocab.json", path / "merges.txt")
    raise TokenizerError(f"{path}: holds neither tokenizer.json nor vocab.json + merges.txt")


def read_hf(path: str | os.PathLike) -> dict:
    """Parts of a byte-level BPE tokenizer from a Hugging Face tokenizer.json (see `bpe.hf_import.from_hf`)."""
    path = Path(path)
    data = _read_json(
        path,
        "give a Hugging Face tokenizer.json",
        "a Hugging Face tokenizer.json",
        readfile.TOKENIZER_JSON_LIMIT,
        TOKENIZER_JSON_ITEMS,
    )
    return hf_import.from_hf(data, str(path))


def read_hf_configs(directory: str | os.PathLike) -> tuple[dict | None, dict | None]:
    """transformers' tokenizer_config.json and config.json in `directory`, parsed (None when absent):
    they decide which tokenizer class transformers loads there (`bpe.hf_import.check_transformers_class`)."""
    found = []
    for name in ("tokenizer_config.json", "config.json"):
        path = Path(directory) / name
        present = os.path.lexists(path)  # a FIFO or a dangling link there is refused by the reader, not skipped
        found.append(
            _read_json(path, "give a directory as transformers saves it", f"transformers' {name}") if present else None
        )
    return found[0], found[1]


def read_hf_chat_template(directory: str | os.PathLike) -> str | None:
    """chat_template.jinja's text in `directory` (as transformers 5 saves a chat template), or None
    when absent: with tokenizer_config.json, what a chat template needs (`bpe.jinja_template.from_hf`).
    Refused before it is read past 4 bytes a character of MAX_TEMPLATE_CHARS."""
    path = Path(directory) / CHAT_TEMPLATE_FILE
    if not os.path.lexists(path):
        return None
    data = read_limited(check_readable(path), 4 * MAX_TEMPLATE_CHARS, "a chat template (chat_template.jinja)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenizerError(f"{path} is not UTF-8 text; a chat template is Jinja text") from None


def tiktoken_meta_path(path: str | os.PathLike) -> Path:
    """Where the pattern and specials of a rank file live: tokenizer.tiktoken -> tokenizer_tiktoken.json."""
    path = Path(path)
    return path.with_name(path.stem + "_tiktoken.json")


def tiktoken_files(
    ranks: list[tuple[bytes, int]], pat_str: str, special_tokens: dict[str, int], pattern: str
) -> dict[str, bytes]:
    """tokenizer.tiktoken (one "base64-bytes rank" line per token, tiktoken's format) and
    tokenizer_tiktoken.json ({"pat_str", "special_tokens"}, plus tk's own name of the pattern)."""
    ranks_file = Path("tokenizer.tiktoken")
    meta = {"pat_str": pat_str, "special_tokens": special_tokens, "pattern": pattern}
    return {
        ranks_file.name: b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks),
        tiktoken_meta_path(ranks_file).name: _json_bytes(meta),
    }


def read_tiktoken(path: str | os.PathLike) -> tuple[dict[bytes, int], dict | None]:
    """The mergeable ranks of a tiktoken rank file, and its `NAME_tiktoken.json` when there is one
    beside it (checked: a pat_str string and special tokens as string -> id)."""
    path = check_readable(Path(path))
    lines = read_limited(path, readfile.TOKENIZER_LIMIT, "a tiktoken rank file (NAME.tiktoken)").splitlines()
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
            if len(parts) != 2 or not token or rank < 0:
                raise ValueError
        except (ValueError, IndexError, binascii.Error):
            raise TokenizerError(
                f"{path}:{lineno}: expected 'base64-bytes rank', got {line[:40]!r}; give a .tiktoken rank file"
            ) from None
        if token in ranks:
            raise TokenizerError(f"{path}:{lineno}: the bytes {token!r} have two ranks ({ranks[token]} and {rank})")
        ranks[token] = rank
    meta_path = tiktoken_meta_path(path)
    if not meta_path.exists():
        return ranks, None
    meta = _read_json(
        meta_path, "give the tokenizer_tiktoken.json that tk bpe-export wrote", "a tokenizer_tiktoken.json"
    )
    specials = meta.get("special_tokens", {}) if isinstance(meta, dict) else None
    if (
        not isinstance(meta, dict)
        or not isinstance(meta.get("pat_str"), str)
        or not isinstance(specials, dict)
        or not all(isinstance(s, str) and s and type(i) is int for s, i in specials.items())
        or not isinstance(meta.get("pattern", ""), str)
    ):
        raise TokenizerError(f'{meta_path}: expected {{"pat_str": str, "special_tokens": {{str: id}}}}')
    return ranks, meta
