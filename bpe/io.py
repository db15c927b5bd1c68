"""Every file the tokenizer reads or writes, and nothing else.

What it does:
- `tokenizer.safetensors`: `pack`/`unpack` turn a tokenizer's parts into the tensors + string
  metadata of the file (and back, validating everything), `serialize` makes the file's bytes
  deterministically, `write_tokenizer_file`/`read_tokenizer_file` store and read them atomically.
- GPT-2's published formats: `read_gpt2` (encoder.json + vocab.bpe, or vocab.json + merges.txt) and
  `write_gpt2` (vocab.json + merges.txt, so people can open a tokenizer in an editor).
- Byte ranges of large text files for parallel encoding (`file_size`, `find_cut`, `read_range`)
  and the atomic `.npy` writer for token ids.

What it deliberately does not do: any BPE. It hands plain values (merges, byte order, specials,
pattern, settings) to `bpe.tokenizer`, which builds the `Tokenizer`.

File layout (format "tokenkit.bpe", version 1):
    merges         int32 (M, 2)   row r merges ids (a, b) into id 256 + r
    vocab_bytes    uint8 (N,)     every token's bytes, concatenated in id order
    vocab_offsets  int64 (256+M+1,)  token i is vocab_bytes[off[i]:off[i+1]]
    metadata: format, format_version, pattern (name or regex as given), pattern_regex
    (the regex actually used; "" for none), special_tokens (JSON str -> id), training (JSON).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bpe.errors import TokenizerError

FORMAT = "tokenkit.bpe"
FORMAT_VERSION = "1"
TENSOR_NAMES = ("merges", "vocab_bytes", "vocab_offsets")

# safetensors' dtype names for the dtypes we write.
_DTYPE_NAMES = {np.dtype(np.int32): "I32", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}


# ---------------------------------------------------------------------------------------------
# tensors <-> parts


def pack(
    merges: list[tuple[int, int]],
    vocab: list[bytes],
    special_tokens: dict[str, int],
    pattern: str,
    pattern_regex: str | None,
    training: dict,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors and string metadata of a tokenizer file (no I/O)."""
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
    return tensors, metadata


def unpack(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None) -> dict:
    """Validate tensors + metadata of a tokenizer file and return its parts.

    Returns a dict with merges (list of (a, b)), byte_order (the byte value of ids 0..255),
    special_tokens, pattern, pattern_regex (None for no split) and training (dict).
    Raises TokenizerError with one line for anything that is not a valid tokenizer.
    """
    metadata = metadata or {}
    fmt = metadata.get("format")
    if fmt != FORMAT:
        raise TokenizerError(f"not a tokenkit tokenizer (format {fmt!r}, expected {FORMAT!r})")
    version = metadata.get("format_version")
    if version != FORMAT_VERSION:
        raise TokenizerError(
            f"tokenizer format version {version!r} is not supported (this tokenkit reads "
            f"version {FORMAT_VERSION}); upgrade tokenkit or re-train the tokenizer"
        )
    missing = [k for k in ("pattern", "pattern_regex", "special_tokens", "training") if k not in metadata]
    if missing:
        raise TokenizerError(f"tokenizer metadata lacks {', '.join(missing)}; the file is damaged")
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
    merges = [tuple(p) for p in merges_arr.tolist()]
    if len(set(merges)) != n_merges:
        raise TokenizerError("the same pair is merged twice; the file is damaged")
    if n_merges and (lengths[256:] != lengths[merges_arr[:, 0]] + lengths[merges_arr[:, 1]]).any():
        raise TokenizerError("vocab_bytes disagree with the merges; the file is damaged")
    raw = vbytes.tobytes()
    off = offsets.tolist()
    tokens = [raw[off[i] : off[i + 1]] for i in range(n_tokens)]
    for r, (a, b) in enumerate(merges):
        if tokens[256 + r] != tokens[a] + tokens[b]:
            raise TokenizerError(f"vocab_bytes of token {256 + r} disagree with merge {r}; the file is damaged")
    try:
        specials = json.loads(metadata["special_tokens"])
        training = json.loads(metadata["training"])
    except json.JSONDecodeError as err:
        raise TokenizerError(f"tokenizer metadata is not valid JSON ({err.msg}); the file is damaged") from None
    if not isinstance(specials, dict) or not isinstance(training, dict):
        raise TokenizerError("tokenizer metadata special_tokens/training must be JSON objects")
    expected = set(range(n_tokens, n_tokens + len(specials)))
    if any(not isinstance(k, str) or not k or type(v) is not int for k, v in specials.items()) or set(
        specials.values()
    ) != expected:
        raise TokenizerError(
            f"special tokens must be non-empty strings with the ids {n_tokens}..{n_tokens + len(specials) - 1}"
            " right after the merges; the file is damaged"
        )
    return {
        "merges": merges,
        "byte_order": byte_order,
        "special_tokens": specials,
        "pattern": metadata["pattern"],
        "pattern_regex": metadata["pattern_regex"] or None,
        "training": training,
    }


# ---------------------------------------------------------------------------------------------
# safetensors bytes


def serialize(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """The safetensors file for these tensors, byte-identical for identical input.

    Written by hand because the safetensors library orders `__metadata__` keys differently from
    one process to the next, and a tokenizer file must be reproducible (same corpus and options,
    same bytes, same fingerprint). The layout is standard: 8-byte little-endian header length,
    JSON header padded with spaces to a multiple of 8, then the tensors' raw little-endian data.
    """
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    blobs = []
    start = 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        blob = arr.tobytes()
        header[name] = {
            "dtype": _DTYPE_NAMES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [start, start + len(blob)],
        }
        blobs.append(blob)
        start += len(blob)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def deserialize(data: bytes, what: str = "the file") -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Tensors and metadata of safetensors bytes; one-line TokenizerError when they are not."""
    from safetensors.numpy import load  # the library checks offsets, sizes and dtypes for us

    if len(data) < 8:
        raise TokenizerError(f"{what} is not a safetensors file (too short; truncated?)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise TokenizerError(f"{what} is not a safetensors file, or it is truncated (header runs past the end)")
    try:
        header = json.loads(data[8 : 8 + n])
        tensors = load(data)
    except Exception as err:  # the library raises its own SafetensorError, json its own: one line for both
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TokenizerError(f"{what} is not a valid safetensors file ({first}); is it truncated?") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if metadata is not None and not isinstance(metadata, dict):
        raise TokenizerError(f"{what} has invalid safetensors metadata")
    return tensors, metadata or {}


# ---------------------------------------------------------------------------------------------
# files


def _check_readable(path: Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise TokenizerError(f"{path}: no such file")
    if path.is_dir():
        raise TokenizerError(f"{path}: is a directory, expected a file")
    return path


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never half."""
    _write_with(Path(path), lambda f: f.write(data))


def _write_with(path: Path, write) -> None:
    if not path.parent.is_dir():
        raise TokenizerError(f"{path}: directory {path.parent} does not exist; create it first")
    if path.is_dir():
        raise TokenizerError(f"{path}: is a directory, give a file name")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise TokenizerError(f"{path}: cannot write ({err.strerror})") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def write_tokenizer_file(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    write_atomic(path, serialize(tensors, metadata))


def read_tokenizer_file(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    path = _check_readable(Path(path))
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TokenizerError(f"{path}: cannot read ({err.strerror})") from None
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
    text = "{'descr': %r, 'fortran_order': False, 'shape': (%d,), }" % (dtype.str, n)
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

    _write_with(Path(path), write)
    return count


def load_ids(path: str | os.PathLike) -> np.ndarray:
    """Token ids from a `.npy` file (integers, any shape flattened)."""
    path = _check_readable(Path(path))
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise TokenizerError(f"{path}: not a .npy file (give the ids file that `tk encode -o` wrote)")
    try:
        ids = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise TokenizerError(f"{path}: not a .npy file of token ids ({str(err).splitlines()[0]})") from None
    if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu":
        raise TokenizerError(f"{path}: holds {getattr(ids, 'dtype', type(ids))}, expected integer token ids")
    return ids.reshape(-1)


def print_line(line: str) -> None:
    """One line to stderr without breaking a running progress bar (train's verbose=True)."""
    tqdm.write(line, file=sys.stderr)


def file_size(path: str | os.PathLike) -> int:
    return _check_readable(Path(path)).stat().st_size


def read_range(path: str | os.PathLike, start: int, end: int) -> str:
    """Bytes [start, end) of a file as text (surrogateescape, so any bytes survive)."""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start).decode("utf-8", errors="surrogateescape")


def find_cut(path: str | os.PathLike, offset: int, end: int, specials: list[bytes], window: int = 1 << 16) -> int | None:
    """The first safe place to cut the file at or after `offset` (before `end`), or None.

    Safe means: right before an ASCII space that follows a printable non-space ASCII byte
    ("word| next"). GPT-2's and GPT-4's split patterns always end a chunk there (a letter, digit or
    punctuation run stops at a space, and the piece before the cut does not end in whitespace, so
    their `\\s+(?!\\S)` look-ahead sees the same thing), and an ASCII byte is never inside a
    multi-byte UTF-8 character. A cut that would split a special token is skipped.
    """
    pad = max((len(s) for s in specials), default=1)  # context to see a special across the cut
    with open(path, "rb") as f:
        pos = max(offset, 1)
        while pos < end:
            base = max(pos - pad, 0)
            f.seek(base)
            want = pos - base + window + pad
            buf = f.read(want)
            at_eof = len(buf) < want
            i = pos - base
            # keep `pad` bytes of right context unless the file ends there anyway
            stop = min(len(buf) if at_eof else len(buf) - pad, end - base)
            while True:
                i = buf.find(b" ", i, stop)
                if i < 0:
                    break
                if 0x21 <= buf[i - 1] <= 0x7E and not any(
                    s in buf[max(0, i - len(s) + 1) : i + len(s) - 1] for s in specials
                ):
                    return base + i
                i += 1
            if at_eof:
                return None
            pos = base + stop
    return None


# ---------------------------------------------------------------------------------------------
# GPT-2 formats


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to a printable character, in GPT-2's token-id order.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, and a
    few others) are shifted to U+0100 onwards, so every token is a visible, space-free string.
    The dict's order is the order of GPT-2's byte tokens: ids 0..255.

    >>> table = bytes_to_unicode()
    >>> table[ord("a")], table[ord(" ")], list(table)[:3]
    ('a', 'Ġ', [33, 34, 35])
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def read_gpt2(vocab_path: str | os.PathLike, merges_path: str | os.PathLike) -> dict:
    """Parts of a tokenizer from GPT-2's files (encoder.json + vocab.bpe or vocab.json + merges.txt).

    The JSON maps token strings (bytes through `bytes_to_unicode`) to ids; the merges file lists
    one "left right" pair per line in rank order after a "#version" header. Ids 0-255 must be the
    single bytes (in any order), merge r must produce id 256 + r, and anything after the merges is
    a special token (GPT-2: <|endoftext|> = 50256).
    """
    vocab_path, merges_path = _check_readable(Path(vocab_path)), _check_readable(Path(merges_path))
    try:
        encoder = json.loads(vocab_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TokenizerError(f"{vocab_path}: not a GPT-2 vocabulary JSON ({err}); give encoder.json or vocab.json") from None
    if not isinstance(encoder, dict) or not all(isinstance(v, int) for v in encoder.values()):
        raise TokenizerError(f"{vocab_path}: expected a JSON object of token string -> id")
    try:
        lines = merges_path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise TokenizerError(f"{merges_path}: not UTF-8 text; give vocab.bpe or merges.txt") from None
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    byte_order = [None] * 256
    for char, b in byte_of.items():
        i = encoder.get(char)
        if i is None or not 0 <= i < 256:
            raise TokenizerError(
                f"{vocab_path}: the byte token {char!r} must have an id in 0..255 (got {i}); is this a GPT-2 style vocabulary?"
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
    if len(encoder) != n_tokens + len(specials) or set(specials.values()) != set(range(n_tokens, n_tokens + len(specials))):
        raise TokenizerError(
            f"{vocab_path}: has {len(encoder)} entries, expected 256 bytes + {len(merges)} merges + specials "
            "with consecutive ids after them; the files do not belong together"
        )
    return {"merges": merges, "byte_order": byte_order, "special_tokens": specials}


def write_gpt2(directory: str | os.PathLike, vocab: list[bytes], merges: list[tuple[int, int]], special_tokens: dict[str, int]) -> tuple[Path, Path]:
    """Write `vocab.json` + `merges.txt` (GPT-2's format, as Hugging Face names them) into a directory."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise TokenizerError(f"{directory}: exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TokenizerError(f"{directory}: cannot create directory ({err.strerror})") from None
    table = bytes_to_unicode()
    names = ["".join(table[b] for b in token) for token in vocab]
    encoder = {name: i for i, name in enumerate(names)}
    encoder.update(special_tokens)
    vocab_file, merges_file = directory / "vocab.json", directory / "merges.txt"
    write_atomic(vocab_file, json.dumps(encoder, ensure_ascii=False).encode("utf-8"))
    lines = ["#version: 0.2"] + [f"{names[a]} {names[b]}" for a, b in merges]
    write_atomic(merges_file, ("\n".join(lines) + "\n").encode("utf-8"))
    return vocab_file, merges_file
