"""tk's own files: the tokenizer file and files of token ids, and the few helpers every file needs.

What it does:
- `tokenizer.safetensors`: `pack`/`unpack` turn a tokenizer's parts into the tensors + string
  metadata of the file (and back, validating everything), `serialize` makes the file's bytes
  deterministically, `write_tokenizer_file`/`read_tokenizer_file` store and read them atomically.
- The atomic `.npy` writer for token ids, its bounded reader (`load_ids`), and unnamed temporary
  files of ids (`spill_ids`, `read_id_blocks`) where MPI ranks keep theirs until rank 0 takes them.
- What reading and writing any file needs, in one-line TokenizerErrors: `check_readable`,
  `read_limited`, `write_atomic`.

What it deliberately does not do: any BPE, or other libraries' files (bpe/library_files.py:
GPT-2's, Hugging Face's, tiktoken's) or corpora (bpe/corpus.py). It hands plain values (merges,
byte order, specials, pattern, settings) to `bpe.tokenizer`, which builds the `Tokenizer`.

File layout (format "tokenkit.bpe", version 1):
    merges         int32 (M, 2)   row r merges ids (a, b) into id 256 + r
    vocab_bytes    uint8 (N,)     every token's bytes, concatenated in id order
    vocab_offsets  int64 (256+M+1,)  token i is vocab_bytes[off[i]:off[i+1]]
    metadata: format, format_version, pattern (name or regex as given), pattern_regex
    (the regex actually used; "" for none), special_tokens (JSON str -> id), training (JSON).
Version 2 is version 1 with encoding options that change ids (`OPTIONS`, imported from Hugging
Face tokenizers): `ignore_merges` "true", `normalizer` "nfc", `bos` (the special token a model
expects before every text: Llama 3's template adds it). A file is version 2 only when it
has one, so every other file is the bytes it always was, and a tk that predates the options
refuses the file (it would give other ids) instead of reading it without them.
Version 3 holds a listed vocabulary (`bpe.layout`: merges that do not make ids 256, 257, ...):
vocab_offsets cut every id's bytes, a special token's id as an empty token, and merge r makes
the id whose bytes are its pair's together; it may set the options too.
"""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.layout import canonical_checked
from tokenkit.bpe.patterns import PATTERNS, resolve_pattern
from tokenkit.common import FileError, atomic, jsonsafe, readfile, safetensors_file

FORMAT = "tokenkit.bpe"
FORMAT_VERSION = "1"
OPTIONS_VERSION = "2"  # the version of a file with OPTIONS
LISTED_VERSION = "3"  # the version of a file with a listed vocabulary
# option -> (its metadata value when set, the value of a tokenizer without it); bos's value is
# the name of one of the tokenizer's special tokens (None here), which the tokenizer checks;
# text_tokens' is a JSON list of special tokens' names
OPTIONS = {
    "ignore_merges": ("true", False),
    "normalizer": ("nfc", None),
    "bos": (None, None),
    "text_tokens": (None, None),
}
TENSOR_NAMES = ("merges", "vocab_bytes", "vocab_offsets")


# ---------------------------------------------------------------------------------------------
# tensors <-> parts


def pack(
    merges: list[tuple[int, int]],
    vocab: list[bytes],
    special_tokens: dict[str, int],
    pattern: str,
    pattern_regex: str | None,
    training: dict,
    options: dict | None = None,
    *,
    listed: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors and string metadata of a tokenizer file (no I/O); `options` as `unpack`
    returns them (those at their defaults are left out); `listed`: `vocab` is every id's bytes,
    None at special tokens' ids (version 3)."""
    vocab = [t or b"" for t in vocab]
    lengths = np.fromiter((len(t) for t in vocab), dtype=np.int64, count=len(vocab))
    offsets = np.zeros(len(vocab) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tensors = {
        "merges": np.asarray(merges, dtype=np.int32).reshape(len(merges), 2),
        "vocab_bytes": np.frombuffer(b"".join(vocab), dtype=np.uint8).copy(),
        "vocab_offsets": offsets,
    }
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "pattern": pattern,
        "pattern_regex": pattern_regex or "",
        "special_tokens": json.dumps(special_tokens, sort_keys=True),
        "training": json.dumps(training, sort_keys=True),
    }
    for name, value in (options or {}).items():
        if value != OPTIONS[name][1]:
            metadata[name] = "true" if value is True else json.dumps(value) if isinstance(value, list) else value
            metadata["format_version"] = OPTIONS_VERSION
    if listed:
        metadata["format_version"] = LISTED_VERSION
    return tensors, metadata


def unpack(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None) -> dict:
    """Validate tensors + metadata of a tokenizer file and return its parts.

    Returns a dict with merges (list of (a, b)), byte_order (the byte value of ids 0..255) or,
    for version 3, vocab (every id's bytes, None at special tokens), special_tokens, pattern,
    pattern_regex (None for no split), training (dict) and options (ignore_merges: bool,
    normalizer: "nfc" or None).
    Raises TokenizerError with one line for anything that is not a valid tokenizer.
    """
    metadata = metadata or {}
    fmt = metadata.get("format")
    if fmt != FORMAT:
        raise TokenizerError(f"not a tokenkit tokenizer (format {fmt!r}, expected {FORMAT!r})")
    version = metadata.get("format_version")
    if version not in (FORMAT_VERSION, OPTIONS_VERSION, LISTED_VERSION):
        raise TokenizerError(
            f"tokenizer format version {version!r} is not supported (this tokenkit reads "
            f"versions {FORMAT_VERSION} to {LISTED_VERSION}); upgrade tokenkit or re-train the tokenizer"
        )
    options = {name: default for name, (_, default) in OPTIONS.items()}
    for name, (value, _) in OPTIONS.items():
        if name in metadata:
            given = metadata[name]
            bad = not (isinstance(given, str) and given) if value is None else given != value
            if bad or version == FORMAT_VERSION:
                raise TokenizerError(
                    f"tokenizer metadata {name} is {str(metadata[name])[:20]!r} in a version {version} file (version "
                    f"{OPTIONS_VERSION} files may set it to {value!r}); the file is damaged"
                )
            options[name] = True if value == "true" else metadata[name]
    if options["text_tokens"] is not None:
        try:
            text = jsonsafe.loads(options["text_tokens"], "tokenizer metadata text_tokens")
        except FileError as err:
            raise TokenizerError(f"{err}; the file is damaged") from None
        if not isinstance(text, list) or not all(isinstance(t, str) and t for t in text):
            raise TokenizerError("tokenizer metadata text_tokens must be a JSON list of names; the file is damaged")
        options["text_tokens"] = text
    if version == OPTIONS_VERSION and options == {name: default for name, (_, default) in OPTIONS.items()}:
        raise TokenizerError(f"a version {OPTIONS_VERSION} tokenizer file without options; the file is damaged")
    missing = [k for k in ("pattern", "pattern_regex", "special_tokens", "training") if k not in metadata]
    if missing:
        raise TokenizerError(f"tokenizer metadata lacks {', '.join(missing)}; the file is damaged")
    pattern_regex = _check_pattern(metadata["pattern"], metadata["pattern_regex"])
    if set(tensors) != set(TENSOR_NAMES):
        raise TokenizerError(
            f"tokenizer tensors are {sorted(tensors)}, expected {list(TENSOR_NAMES)}; the file is damaged"
        )
    merges_arr, vbytes, offsets = (tensors[k] for k in TENSOR_NAMES)
    for name, arr, dtype, ndim in (
        ("merges", merges_arr, np.int32, 2),
        ("vocab_bytes", vbytes, np.uint8, 1),
        ("vocab_offsets", offsets, np.int64, 1),
    ):
        if arr.dtype != dtype or arr.ndim != ndim:
            raise TokenizerError(
                f"tokenizer tensor {name} is {arr.dtype} with {arr.ndim} dims, expected "
                f"{np.dtype(dtype)} with {ndim}; the file is damaged"
            )
    n_merges = merges_arr.shape[0]
    if merges_arr.shape[1] != 2:
        raise TokenizerError(f"tokenizer merges have shape {merges_arr.shape}, expected (M, 2)")
    specials, training = _json_metadata(metadata)
    common = {"pattern": metadata["pattern"], "pattern_regex": pattern_regex, "training": training, "options": options}
    if version == LISTED_VERSION:
        return {**_unpack_listed(merges_arr, vbytes, offsets, specials), **common}
    n_tokens = 256 + n_merges
    if offsets.shape[0] != n_tokens + 1:
        raise TokenizerError(
            f"vocab_offsets has {offsets.shape[0]} entries for {n_merges} merges, expected "
            f"{n_tokens + 1}; the file is damaged"
        )
    lengths = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != vbytes.shape[0] or (lengths < 1).any():
        raise TokenizerError("vocab_offsets do not cut vocab_bytes into non-empty tokens; the file is damaged")
    # Merge r may only use ids that exist before it: bytes or the results of earlier merges.
    limit = 256 + np.arange(n_merges, dtype=np.int64)[:, None]
    if n_merges and ((merges_arr < 0) | (merges_arr >= limit)).any():
        bad = int(np.argmax(((merges_arr < 0) | (merges_arr >= limit)).any(axis=1)))
        raise TokenizerError(f"merge {bad} uses an id that does not exist yet; the file is damaged")
    if (lengths[:256] != 1).any():
        raise TokenizerError("tokens 0-255 must be single bytes; the file is damaged")
    byte_order = vbytes[offsets[:256]].tolist()
    if len(set(byte_order)) != 256:
        raise TokenizerError("tokens 0-255 are not a permutation of the 256 bytes; the file is damaged")
    left, right = merges_arr[:, 0].astype(np.int64), merges_arr[:, 1].astype(np.int64)
    pairs = np.sort(left * n_tokens + right)  # sorted, a pair merged twice is two equal neighbours
    if (pairs[1:] == pairs[:-1]).any():
        raise TokenizerError("the same pair is merged twice; the file is damaged")
    if n_merges and (lengths[256:] != lengths[left] + lengths[right]).any():
        raise TokenizerError("vocab_bytes disagree with the merges; the file is damaged")
    disagree = _merged_bytes_disagree(vbytes, offsets, left, right)
    if disagree is not None:
        token = 256 + disagree
        raise TokenizerError(f"vocab_bytes of token {token} disagree with merge {disagree}; the file is damaged")
    raw = vbytes.tobytes()
    off = offsets.tolist()
    tokens = [raw[off[i] : off[i + 1]] for i in range(n_tokens)]
    merges = list(zip(left.tolist(), right.tolist(), strict=True))
    expected = set(range(n_tokens, n_tokens + len(specials)))
    if (
        any(not isinstance(k, str) or not k or type(v) is not int for k, v in specials.items())
        or set(specials.values()) != expected
    ):
        raise TokenizerError(
            f"special tokens must be non-empty strings with the ids {n_tokens}..{n_tokens + len(specials) - 1}"
            " right after the merges; the file is damaged"
        )
    layout = canonical_checked(tokens, byte_order, merges, specials)
    return {"merges": merges, "byte_order": byte_order, "special_tokens": specials, "layout": layout, **common}


def _merged_bytes_disagree(vbytes: np.ndarray, offsets: np.ndarray, left: np.ndarray, right: np.ndarray) -> int | None:
    """The first merge r whose token's bytes (id 256 + r) are not its pair's bytes together, or
    None: every merged token's bytes against its two parts' at once (the lengths agree already).

    vbytes: (B,) uint8; offsets: (256 + M + 1,) int64; left, right: (M,) int64 ids."""
    if not left.size:
        return None
    parts = np.stack([left, right], axis=1).reshape(-1)  # (2M,) a, b, a, b, ...
    starts, lengths = offsets[parts], offsets[parts + 1] - offsets[parts]
    ends = np.cumsum(lengths)
    where = np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1]))  # the parts' bytes, in order
    made = vbytes[int(offsets[256]) :]  # the merged tokens' bytes, in order
    bad = np.flatnonzero(vbytes[where] != made)
    if not bad.size:
        return None
    return int(np.searchsorted(offsets[257:] - offsets[256], bad[0], side="right"))


def _json_metadata(metadata: dict) -> tuple[dict, dict]:
    """The special_tokens and training objects of a tokenizer file's metadata."""
    for key in ("special_tokens", "training"):
        if not isinstance(metadata[key], str):
            raise TokenizerError(f"tokenizer metadata {key} must be a JSON string, got {type(metadata[key]).__name__}")
    try:  # bounded: JSON nested 100,000 deep is a one-line error, not a RecursionError
        specials = jsonsafe.loads(metadata["special_tokens"], "tokenizer metadata special_tokens")
        training = jsonsafe.loads(metadata["training"], "tokenizer metadata training")
    except FileError as err:
        raise TokenizerError(f"{err}; the file is damaged") from None
    if not isinstance(specials, dict) or not isinstance(training, dict):
        raise TokenizerError("tokenizer metadata special_tokens/training must be JSON objects")
    return specials, training


def _unpack_listed(merges_arr: np.ndarray, vbytes: np.ndarray, offsets: np.ndarray, specials: dict) -> dict:
    """merges, vocab and special_tokens of a version 3 file; what the merges make and whether
    every byte has an id is `bpe.layout.listed`'s to check."""
    n = offsets.shape[0] - 1
    lengths = np.diff(offsets)
    if n < 1 or offsets[0] != 0 or offsets[-1] != vbytes.shape[0] or (lengths < 0).any():
        raise TokenizerError("vocab_offsets do not cut vocab_bytes into tokens; the file is damaged")
    if merges_arr.size and (merges_arr.min() < 0 or merges_arr.max() >= n):
        raise TokenizerError("a merge uses an id past the vocabulary; the file is damaged")
    ids = list(specials.values())
    if (
        any(not isinstance(k, str) or not k or type(v) is not int for k, v in specials.items())
        or sorted(ids) != np.flatnonzero(lengths == 0).tolist()
    ):
        raise TokenizerError(
            "special tokens must be non-empty strings with exactly the ids of the empty tokens; the file is damaged"
        )
    raw = vbytes.tobytes()
    off = offsets.tolist()
    tokens = [raw[off[i] : off[i + 1]] or None for i in range(n)]
    return {"merges": [tuple(p) for p in merges_arr.tolist()], "vocab": tokens, "special_tokens": specials}


def _check_pattern(pattern, pattern_regex) -> str | None:
    """The split regex of a tokenizer file (None for no split), refusing one the file's `pattern`
    does not imply.

    A tokenizer file is data: it names its pattern (gpt2, gpt4/cl100k, none, or a custom regex)
    and `pattern_regex` must be exactly what `resolve_pattern` makes of that name, so a file
    cannot run a regex of its own under a built-in name (built-ins run without a time limit,
    custom patterns with one: see bpe.pretokenize.split_text).
    """
    for key, value in (("pattern", pattern), ("pattern_regex", pattern_regex)):
        if not isinstance(value, str):
            raise TokenizerError(
                f"tokenizer metadata {key} must be a string, got {type(value).__name__}; the file is damaged"
            )
    if pattern in PATTERNS or pattern == "":  # a built-in name ("" is no pattern, like none)
        expected = PATTERNS.get(pattern) or ""
    else:
        expected = pattern  # a custom regex: it is its own regex (and must compile)
    if pattern_regex != expected:
        shown = repr(pattern) if len(pattern) <= 60 else repr(pattern[:50]) + "..."
        raise TokenizerError(
            f"tokenizer metadata pattern_regex is not the regex of its pattern {shown}; the file was "
            "altered or damaged (re-train or re-import the tokenizer)"
        )
    return resolve_pattern(expected) if expected else None


# ---------------------------------------------------------------------------------------------
# safetensors bytes


def serialize(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """The safetensors file for these tensors, byte-identical for identical input (sorted names
    and metadata, see `common.safetensors_file`): same corpus and options, same fingerprint."""
    return safetensors_file.serialize(tensors, metadata)


def deserialize(data: bytes, what: str = "the file") -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Tensors and metadata of safetensors bytes, every size checked; one-line TokenizerError when they are not."""
    try:
        return safetensors_file.load_bytes(data, what)
    except FileError as err:
        raise TokenizerError(str(err)) from None


# ---------------------------------------------------------------------------------------------
# files


def check_readable(path: Path) -> Path:
    """`path`, refused in one line when it is missing or a directory."""
    path = Path(path)
    if not path.exists():
        raise TokenizerError(f"{path}: no such file")
    if path.is_dir():
        raise TokenizerError(f"{path}: is a directory, expected a file")
    return path


def read_limited(path: Path, limit: int | None, what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (`common.readfile`); one-line TokenizerError otherwise."""
    try:
        return readfile.read_bytes(path, limit, what)
    except FileError as err:
        raise TokenizerError(str(err)) from None


def write_atomic(path: str | os.PathLike, data) -> None:
    """Write `data` (bytes, or a function writing into the open file) so that readers see the old
    file or the new one, never half (`common.atomic`); one-line TokenizerError when it cannot."""
    try:
        atomic.write_atomic(path, data)
    except FileError as err:
        raise TokenizerError(str(err)) from None


def write_tokenizer_file(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    write_atomic(path, serialize(tensors, metadata))


def read_tokenizer_file(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    path = check_readable(Path(path))
    data = read_limited(path, readfile.TOKENIZER_LIMIT, "a tokenizer file (tokenizer.safetensors)")
    return deserialize(data, str(path))


def save_ids(path: str | os.PathLike, ids: np.ndarray) -> None:
    """Token ids (1-D) as a `.npy` file, written atomically."""
    ids = np.asarray(ids)
    save_ids_stream(path, ids.dtype, [ids])


_NPY_HEADER_BYTES = 128  # a .npy v1.0 header padded to this length: room for any 1-D length


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    """The .npy (version 1.0) header of a 1-D array of n `dtype` values, always _NPY_HEADER_BYTES
    long, so that it can be rewritten in place once n is known.

    >>> len(_npy_header(np.dtype(np.uint16), 0)) == len(_npy_header(np.dtype(np.uint16), 10**15)) == 128
    True
    """
    text = f"{{'descr': {dtype.str!r}, 'fortran_order': False, 'shape': ({n},), }}"
    text = text.ljust(_NPY_HEADER_BYTES - 10 - 1) + "\n"  # magic (6) + version (2) + length (2) before it
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def save_ids_stream(path: str | os.PathLike, dtype, pieces) -> int:
    """Write the 1-D id arrays of `pieces` (an iterable, consumed in order) one after the other
    as one `.npy` file, atomically, holding one piece in memory at a time; returns the count.
    The header goes first with a provisional length and is rewritten at the end."""
    dtype = np.dtype(dtype)
    count = 0

    def write(f) -> None:
        nonlocal count
        f.write(_npy_header(dtype, 0))
        for piece in pieces:
            f.write(np.ascontiguousarray(piece, dtype=dtype).tobytes())
            count += len(piece)
        f.seek(0)
        f.write(_npy_header(dtype, count))

    write_atomic(path, write)
    return count


def spill_ids(pieces, dtype):
    """The 1-D id arrays of `pieces` written one after the other into an unnamed temporary file
    (nothing is left behind, however the process ends): (the open file, how many ids)."""
    f = tempfile.TemporaryFile()
    count = 0
    for piece in pieces:
        f.write(np.ascontiguousarray(piece, dtype=dtype).tobytes())
        count += len(piece)
    return f, count


def read_id_blocks(f, dtype, block: int):
    """The ids of an open `spill_ids` file from its start, `block` ids at a time."""
    f.seek(0)
    size = np.dtype(dtype).itemsize * block
    while data := f.read(size):
        yield np.frombuffer(data, dtype=dtype)


IDS_FILE = "a .npy file of token ids (`tk encode -o` writes one)"


def load_ids(path: str | os.PathLike) -> np.ndarray:
    """Token ids from a `.npy` file (integers, any shape flattened), memory-mapped read-only.

    The header is checked before anything is allocated: an integer dtype (never objects, so never
    pickle) and a shape whose size is exactly the bytes after the header. Memory then follows
    what is read, so a header claiming 1e11 ids in a 200-byte file is an error, not 186 GiB.
    The file is opened once (`common.readfile`: a regular file) and mapped from that open file.
    """
    path = check_readable(Path(path))
    try:
        with readfile.open_regular(path, readfile.NO_LIMIT, IDS_FILE) as (f, size):
            dtype, shape, fortran, offset = _npy_header_of(f, path)
            if dtype.hasobject or dtype.kind not in "iu":
                raise TokenizerError(
                    f"{path}: holds {dtype}, expected integer token ids (give the ids file that `tk encode -o` wrote)"
                )
            count = math.prod(shape)
            if any(n < 0 for n in shape) or count * dtype.itemsize != size - offset:
                raise TokenizerError(
                    f"{path}: its header declares {count:,} ids of {dtype} ({count * dtype.itemsize:,} bytes) but "
                    f"{size - offset:,} bytes follow it; the file is truncated or corrupt"
                )
            if count == 0:
                return np.zeros(0, dtype=dtype)
            ids = np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape or (1,), order="F" if fortran else "C")
    except FileError as err:
        raise TokenizerError(str(err)) from None
    except (ValueError, OSError) as err:
        raise TokenizerError(f"{path}: not a .npy file of token ids ({str(err).splitlines()[0]})") from None
    return ids.reshape(-1)


def _npy_header_of(f, path: Path) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """(dtype, shape, fortran_order, data offset) of the open .npy file `f`; TokenizerError when
    its header is not one numpy would read."""
    from numpy.lib import format as npy

    try:
        if f.read(6) != b"\x93NUMPY":
            raise TokenizerError(f"{path}: not a .npy file (give the ids file that `tk encode -o` wrote)")
        f.seek(0)
        version = npy.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npy.read_array_header_2_0(f)
        else:
            raise TokenizerError(
                f"{path}: .npy format version {version[0]}.{version[1]} is not supported; re-encode it"
            )
        return dtype, shape, fortran, f.tell()
    except OSError as err:
        raise TokenizerError(f"{path}: cannot read ({err.strerror or err})") from None
    except TokenizerError:
        raise
    except Exception as err:  # numpy's header parser raises ValueError, SyntaxError, ...: one line for all
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TokenizerError(f"{path}: not a .npy file of token ids (bad header: {first})") from None
