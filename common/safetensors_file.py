"""safetensors files written byte-for-byte reproducibly, and read with every size checked.

The layout is the standard one (any safetensors reader opens our files): an 8-byte little-endian
header length, a JSON header (tensor name -> dtype, shape, data_offsets; `__metadata__` -> str:str)
padded with spaces to a multiple of 8, then the tensors' raw little-endian bytes.

Writing is our own (`write`, `serialize`) because a file must be reproducible: the same tensors
and metadata give the same bytes (names and metadata keys sorted), whereas the library orders
`__metadata__` differently from one process to the next. `write` streams each array into the
file object of `common.atomic.write_atomic`, so saving never holds a second copy of the weights.

Reading opens the file once through `common.readfile` (a regular file, or one line saying what it
is) and checks the header against it before anything is allocated (`read_header`): its length,
its nesting, every dtype, shape and offset, and that the offsets tile the data exactly. `opened`
keeps that one open file and reads from it only the tensors asked for (a model file's tokenizer
without its weights), each straight into an array of its checked size, or, `mapped`, as a view
of one copy-on-write map of the file: the weights stay in the page cache, never copied, and a
write into such an array changes memory, never the file. `read` reads every tensor.

What it deliberately does not do: interpret names or metadata (bpe/io.py and transformer/io.py do).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import mmap
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from tokenkit.common import jsonsafe, readfile
from tokenkit.common.errors import FileError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit
WHAT = "a .safetensors file"  # what a path that is not a regular file is told to give instead

DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {dtype.newbyteorder("="): name for name, dtype in DTYPES.items()}
# bfloat16, which NumPy lacks: a header holding it is valid only where the caller asks (`bfloat16=True`)
# and converts the raw bytes itself (transformers' checkpoints; tokenkit never writes it)
BF16 = "BF16"


def _dtype_name(dtype: np.dtype) -> str:
    name = _NAMES.get(dtype.newbyteorder("="))
    if name is None:
        raise FileError(f"cannot store dtype {dtype} in a safetensors file")
    return name


def header_bytes(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    """The 8-byte length and the padded JSON header for these tensors (sorted: reproducible)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(metadata[k]) for k in sorted(metadata)}
    start = 0
    for name in sorted(tensors):
        arr = tensors[name]
        header[name] = {
            "dtype": _dtype_name(arr.dtype),
            "shape": list(arr.shape),
            "data_offsets": [start, start + arr.nbytes],
        }
        start += arr.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write(f: BinaryIO, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    """Stream a safetensors file into `f`: header, then each tensor's bytes in name order."""
    arrays = {name: np.asarray(a) for name, a in tensors.items()}
    f.write(header_bytes(arrays, metadata))
    for name in sorted(arrays):
        arr = arrays[name]
        little = arr.dtype.newbyteorder("<")
        if arr.dtype != little or not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr, dtype=little)
        f.write(memoryview(arr.reshape(-1)).cast("B"))


def serialize(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    """The whole file as bytes (small files, fingerprints)."""
    buf = io.BytesIO()
    write(buf, tensors, metadata)
    return buf.getvalue()


def parse_header(
    data: bytes, file_size: int, what: str, *, bfloat16: bool = False
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Validate a header (the bytes after the 8-byte length) against a file of `file_size` bytes.

    Returns ({name: {"dtype", "shape", "data_offsets"}}, metadata). FileError for anything that
    does not describe exactly the bytes that follow it. `bfloat16`: accept BF16 tensors too.
    """
    header = jsonsafe.loads(data, f"{what}'s header")
    if not isinstance(header, dict):
        raise FileError(f"{what} is not a safetensors file (its header is not a JSON object)")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise FileError(f"{what} has invalid safetensors metadata (it must map strings to strings)")
    data_bytes = file_size - 8 - len(data)
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise FileError(f"{what}: tensor {name!r} has a malformed header entry; the file is corrupt")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPES and not (bfloat16 and dtype == BF16):
            raise FileError(f"{what}: tensor {name!r} has unknown dtype {dtype!r}; the file is corrupt")
        ints = lambda xs: isinstance(xs, list) and all(type(x) is int and x >= 0 for x in xs)  # noqa: E731
        if not ints(shape) or not ints(offsets) or len(offsets) != 2 or len(shape) > 8:
            raise FileError(f"{what}: tensor {name!r} has a bad shape or offsets; the file is corrupt")
        begin, end = offsets
        itemsize = 2 if dtype == BF16 else DTYPES[dtype].itemsize
        if not begin <= end <= data_bytes or math.prod(shape) * itemsize != end - begin:
            raise FileError(
                f"{what}: tensor {name!r} ({dtype} {shape}) does not fit its bytes {begin}..{end} "
                f"of {data_bytes}; the file is truncated or corrupt"
            )
        spans.append((begin, end))
    spans.sort()
    covered = 0
    for begin, end in spans:
        if begin != covered:
            raise FileError(f"{what}: tensor data overlaps or has gaps; the file is corrupt")
        covered = end
    if covered != data_bytes:
        raise FileError(f"{what}: {data_bytes - covered} bytes after the last tensor; the file is truncated or corrupt")
    return header, metadata


def read_header(
    path: str | os.PathLike, what: str | None = None, *, bfloat16: bool = False, what_file: str = WHAT
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The validated tensor entries and metadata of a safetensors file (reads only its header);
    `bfloat16`: accept BF16 tensors too. `what_file` is what a path that is not a regular file
    should have been ("a model file"); `what` names the file in messages (default: its path)."""
    entries, metadata, _ = read_layout(path, what, bfloat16=bfloat16, what_file=what_file)
    return entries, metadata


def read_layout(
    path: str | os.PathLike, what: str | None = None, *, bfloat16: bool = False, what_file: str = WHAT
) -> tuple[dict[str, dict[str, Any]], dict[str, str], int]:
    """`read_header`, and where the tensors' data starts in the file (their offsets count from there)."""
    with readfile.open_regular(path, readfile.NO_LIMIT, what_file) as (f, size):
        return _layout(f, size, what or str(path), bfloat16)


def _layout(f: BinaryIO, size: int, what: str, bfloat16: bool) -> tuple[dict[str, dict[str, Any]], dict[str, str], int]:
    try:
        head = f.read(8)
        if len(head) < 8:
            raise FileError(f"{what} is not a safetensors file (too short; truncated?)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise FileError(
                f"{what} is not a safetensors file, or it is truncated (its header length {n} runs past the end)"
            )
        data = f.read(n)
    except OSError as err:
        raise FileError(f"{what}: cannot read ({err.strerror or err})") from None
    entries, metadata = parse_header(data, size, what, bfloat16=bfloat16)
    return entries, metadata, 8 + n


@dataclass
class Opened:
    """A safetensors file opened once, its header checked (`entries`: name -> {"dtype", "shape",
    "data_offsets"}, `metadata`), from which `read` takes only the tensors asked for."""

    f: BinaryIO
    what: str
    entries: dict[str, dict[str, Any]]
    metadata: dict[str, str]
    start: int  # where the tensors' data begins; their offsets count from there
    _map: mmap.mmap | None = field(default=None, repr=False)

    def nbytes(self, names: Iterable[str]) -> int:
        """How many bytes these tensors hold, from the header alone."""
        return sum(self.entries[n]["data_offsets"][1] - self.entries[n]["data_offsets"][0] for n in names)

    def read(self, names: Iterable[str], *, mapped: bool = False) -> dict[str, np.ndarray]:
        """These tensors (native byte order), by name; the others are never read. `mapped`: a
        tensor stored aligned in the host's byte order is a view of the file mapped copy-on-write
        (`mmap.ACCESS_COPY`): no copy is made, and the pages are the kernel's cache, given back under
        pressure; the rest are read. A file replaced by a rename while mapped keeps the old data;
        one truncated in place (`cp` onto it) would fault: tk writes by renaming."""
        out = {}
        for name in sorted(names):
            entry = self.entries[name]
            dtype = DTYPES[entry["dtype"]]
            offset = self.start + entry["data_offsets"][0]
            view = self._view(offset, dtype, entry["shape"]) if mapped else None
            if view is None:
                view = np.empty(entry["shape"], dtype=dtype)
                read_into(self.f, offset, view, self.what)
                view = view.astype(dtype.newbyteorder("="), copy=False)
            out[name] = view
        return out

    def _view(self, offset: int, dtype: np.dtype, shape: list[int]) -> np.ndarray | None:
        """The tensor as a view of the mapped file, or None where NumPy cannot map it (another byte
        order, an unaligned offset, no room for the map in the address space)."""
        if not dtype.isnative or offset % dtype.alignment:
            return None
        if self._map is None:
            try:
                self._map = mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError, OverflowError):  # a 32-bit address space, a file system that cannot map
                return None
        count = math.prod(shape)
        if offset + count * dtype.itemsize > len(self._map):
            raise FileError(f"{self.what}: the file ends inside a tensor; it was truncated while being read")
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(shape)


@contextlib.contextmanager
def opened(path: str | os.PathLike, what: str | None = None, *, what_file: str = WHAT) -> Iterator[Opened]:
    """The file opened once and its header checked (`Opened`); tensors are read only when asked for.
    Mapped tensors stay valid after the block; read ones are copies."""
    what = what or str(path)
    with readfile.open_regular(path, readfile.NO_LIMIT, what_file) as (f, size):
        entries, metadata, start = _layout(f, size, what, False)
        yield Opened(f, what, entries, metadata, start)


def read(
    path: str | os.PathLike, what: str | None = None, *, what_file: str = WHAT
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """All tensors (native byte order) and the metadata of a safetensors file, sizes checked first:
    each tensor is read straight into an array of its checked size, from the one open file."""
    with opened(path, what, what_file=what_file) as st:
        return st.read(st.entries), st.metadata


def read_into(f: BinaryIO, offset: int, arr: np.ndarray, what: str) -> None:
    """Fill the contiguous `arr` with the file's bytes from `offset`; FileError when they run out."""
    buf = memoryview(arr.reshape(-1).view(np.uint8))
    try:
        f.seek(offset)
        done = 0
        while done < len(buf):
            n = f.readinto(buf[done:])
            if not n:
                raise FileError(f"{what}: the file ends inside a tensor; it was truncated while being read")
            done += n
    except OSError as err:
        raise FileError(f"{what}: cannot read ({err.strerror or err})") from None


def load_bytes(data: bytes, what: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Tensors and metadata of a whole file held in memory (checked as `read` checks a file)."""
    if len(data) < 8:
        raise FileError(f"{what} is not a safetensors file (too short; truncated?)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(len(data) - 8, MAX_HEADER_BYTES):
        raise FileError(
            f"{what} is not a safetensors file, or it is truncated (its header length {n} runs past the end)"
        )
    entries, metadata = parse_header(data[8 : 8 + n], len(data), what)
    start = 8 + n
    tensors = {}
    for name in sorted(entries):
        entry = entries[name]
        begin, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        arr = np.frombuffer(data, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=start + begin)
        tensors[name] = arr.reshape(entry["shape"]).astype(dtype.newbyteorder("="))
    return tensors, metadata
