"""The one place a corpus is read: files, directories, stdin and pipes, compressed files, JSONL.

What it does:
- `Corpus(inputs, glob=, text_field=, binary=)` names what to read. Inputs: file paths;
  directories (every file below them, sorted by path as `LC_ALL=C sort` lists them, hidden names
  skipped, `glob` to filter, each real directory and file read once even through symlink loops);
  "-" for stdin, and pipes and FIFOs (`<(zcat x.gz)`), read once, as streams; texts in memory
  (bytes). Devices and other special files are refused, and so is stdin when it is a terminal
  (nothing piped in). `names` gives some files another name in messages (a stored copy of stdin
  is "stdin").
- Formats: gzip, bzip2, xz and zstd (zstd with the `zstandard` package or Python's
  `compression.zstd`) are recognised by their first bytes, not their names, and decompressed as
  they stream (bpe/streams.py opens each input). With `text_field`, every input is JSON Lines: one
  JSON object per line, whose document is the string at that field (a dotted path like "meta.text"
  reaches inside; a number picks from a list); with `group_field` too, `grouped_documents()` gives
  each document with the string at that field of its line (its language, say). With `binary`,
  files are their exact bytes: nothing is decompressed, and a file that does not look like text
  is not warned about.
- Documents: each file, text and JSONL record is one document (empty ones are skipped).
  `pieces()` yields them in pieces of about a megabyte, cut only where the split pattern always
  splits (`bpe.cut.cut_pieces`, by `find_cut`, the one cut rule), never across two documents:
  merges never cross documents, and memory stays flat however large a file. `documents()` yields each
  document whole.
- `plain_files()`: the files, when every input can be read at any offset (regular, not
  compressed, not JSONL): what parallel and MPI encoding cut into byte ranges (`file_ranges`).
- `fingerprint()`: a sha256 of the documents' bytes and where each ends (for one plain file,
  the sha256 of the file), for a pipeline to notice a changed corpus.

What it deliberately does not do: split text into chunks, count, or encode (bpe/pretokenize.py,
bpe/encode_corpus.py). It reads each stream once; reading a stream again is an error.

>>> corpus = Corpus([b"first document", b"second"])
>>> list(corpus.documents())
[b'first document', b'second']
>>> [p.starts_document for p in corpus.pieces()]
[True, True]
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from fnmatch import fnmatchcase
from itertools import pairwise
from typing import NamedTuple

from tokenkit.bpe.cut import CUT_CONTEXT, UncutStretch, cut_pieces, find_cut
from tokenkit.bpe.errors import TokenizerError
from tokenkit.bpe.streams import Input, Reader, codec_of
from tokenkit.common import progress

__all__ = ["Corpus", "FileRange", "Piece", "as_corpus", "file_ranges", "find_file_cut", "read_range"]

BLOCK_BYTES = 1 << 20  # read size; also the size of the pieces handed to worker processes
MAX_LINE_BYTES = 1 << 30  # a JSONL line (one document) longer than this is refused
_SNIFF_BYTES = 8192  # how much of a file's start decides whether it looks like text


class FileRange(NamedTuple):
    """Bytes [start, end) of a file, read as a document of its own. Both ends must be places where
    the pattern always splits (file ends, or `find_file_cut`'s cuts), as `bpe.distributed` makes
    them; then the ranges of a file count as the whole file does."""

    path: str
    start: int
    end: int


class Piece(NamedTuple):
    """A stretch of one document; `starts_document` marks the first piece of each."""

    data: bytes
    starts_document: bool


Source = str | os.PathLike | bytes | bytearray | FileRange

_NOT_TEXT = (
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "a zip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
    (b"Rar!\x1a\x07", "a rar archive"),
    (b"\x7fELF", "an executable"),
    (b"%PDF-", "a PDF document"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"\x93NUMPY", "a NumPy array"),
    (b"SQLite format 3\x00", "an SQLite database"),
)


def not_text(head: bytes) -> str | None:
    """What `head` (the first bytes of a document) looks like when it is not text, or None.

    >>> not_text(b"PK\\x03\\x04rest"), not_text(b"plain words"), not_text(b"a\\x00b")
    ('a zip archive', None, 'binary data (NUL bytes)')
    """
    for magic, what in _NOT_TEXT:
        if head.startswith(magic):
            return what
    if codec_of(head):
        return f"{codec_of(head)}-compressed data"
    if head[257:262] == b"ustar":
        return "a tar archive"
    if b"\x00" in head:
        return "binary data (NUL bytes)"
    text = head.decode("utf-8", "surrogateescape")[:-1]  # the last character may be cut short
    bad = sum(1 for ch in text if "\udc80" <= ch <= "\udcff")
    if bad > max(8, len(text) // 10):
        return "binary data (mostly not UTF-8)"
    return None


def _warn_stderr(message: str) -> None:
    progress.print_line(f"warning: {message}")  # a line that leaves a progress bar whole


class Corpus:
    """What to read and how: inputs in order, each expanded into its documents.

    inputs: file paths, directories, "-" (stdin), pipes, texts (bytes) or `FileRange`s; one or a
    list. glob: keep only the files of a directory whose path below it or whose name matches
    (fnmatch, e.g. "*.txt"); files named directly are always kept. text_field: read every input as
    JSON Lines, the document of a line being this field. group_field: with text_field, the field
    naming each line's group (`grouped_documents`). binary: exact bytes, no decompression and
    no warning. warn: called with a message for an input that does not look like text (None: quiet).
    names: {path: name} for files that messages should call otherwise (e.g. a copy of stdin "stdin").

    Raises TokenizerError at once for a missing input, a device, stdin that is a terminal, or a
    directory without files.
    """

    def __init__(
        self,
        inputs: Source | Iterable[Source],
        *,
        glob: str | None = None,
        text_field: str | None = None,
        group_field: str | None = None,
        binary: bool = False,
        warn: Callable[[str], None] | None = _warn_stderr,
        names: Mapping[str, str] | None = None,
    ) -> None:
        if isinstance(inputs, (str, bytes, bytearray, os.PathLike, FileRange)):
            inputs = [inputs]
        if text_field is not None and (not isinstance(text_field, str) or not text_field.strip(".")):
            raise TokenizerError(f"--text-field must name a field, got {text_field!r}")
        if text_field is not None and binary:
            raise TokenizerError("--binary and --text-field exclude each other: JSON lines are text")
        if group_field is not None and (
            text_field is None or not isinstance(group_field, str) or not group_field.strip(".")
        ):
            raise TokenizerError(
                f"--group-by must name a field of JSON lines read with --text-field, got {group_field!r}"
            )
        self.glob, self.text_field, self.binary, self._warn = glob, text_field, binary, warn
        self.group_field = group_field
        self._names = dict(names or {})
        self._inputs: list[Input] = []
        for source in inputs:
            self._inputs.extend(self._resolve(source))
        if not self._inputs:
            raise TokenizerError("no corpus given; pass at least one file")
        if sum(i.kind == "stream" and i.path == "-" for i in self._inputs) > 1:
            raise TokenizerError("stdin (-) is given twice; it can be read only once")
        self._streams_read = False

    def __repr__(self) -> str:
        shown = ", ".join(i.name for i in self._inputs[:3]) + (", ..." if len(self._inputs) > 3 else "")
        return f"Corpus([{shown}], {len(self._inputs)} inputs)"

    # ----------------------------------------------------------------------------- views

    @property
    def names(self) -> list[str]:
        """Each input as shown in messages, in reading order (directories expanded)."""
        return [i.name for i in self._inputs]

    @property
    def size(self) -> int | None:
        """Bytes to read, when known before reading (no streams, nothing compressed, no JSONL)."""
        if self.text_field is not None or any(i.kind == "stream" or i.codec for i in self._inputs):
            return None
        return sum(len(i.data) if i.kind == "text" else i.end - i.start for i in self._inputs)

    def plain_files(self) -> list[tuple[str, int]] | None:
        """(path, size) of every input when all are plain regular files (readable at any
        offset, each one document), else None."""
        if self.text_field is not None or any(i.kind != "file" or i.codec for i in self._inputs):
            return None
        return [(i.path, i.end) for i in self._inputs]

    # --------------------------------------------------------------------------- reading

    def pieces(self, piece_bytes: int | None = None, specials: Sequence[bytes] = ()) -> Iterator[Piece]:
        """Every non-empty document in pieces of about `piece_bytes` (None: each whole), cut only at
        `find_cut`'s safe places and never inside one of `specials`; a stretch with no safe place
        longer than MAX_UNCUT_BYTES is one line naming its document (TokenizerError)."""
        block = piece_bytes or BLOCK_BYTES
        for where, blocks in self._named_documents(block):
            first = True
            try:
                for data in cut_pieces(blocks, piece_bytes, specials):
                    yield Piece(data, first)
                    first = False
            except UncutStretch as err:
                raise TokenizerError(f"{where}: {err}") from None

    def documents(self) -> Iterator[bytes]:
        """Every non-empty document, whole (a large file is read into memory: prefer `pieces`)."""
        for blocks in self._documents(BLOCK_BYTES):
            data = b"".join(blocks)
            if data:
                yield data

    def grouped_documents(self) -> Iterator[tuple[str, bytes]]:
        """(group, document) for every non-empty document: the group is the string at `group_field`
        of the document's JSON line (a TokenizerError names the line where it is missing)."""
        if self.group_field is None:
            raise TokenizerError("grouped_documents needs a Corpus read with text_field and group_field")
        self._start_reading()
        for inp in self._inputs:
            if inp.kind == "text":
                raise TokenizerError(
                    f"{inp.name} is a text in memory, not JSON lines with a {self.group_field!r} field"
                )
            for group, doc in self._jsonl(inp):
                if doc:
                    yield group, doc

    def fingerprint(self) -> str:
        """sha256 (hex) of the documents: equal fingerprints, equal documents in the same order.

        One document alone hashes as its bytes (a plain file: its sha256sum; a compressed one:
        that of its text), several as the list of (sha256, length) of each. Reads the corpus
        (a stream can then not be read again).
        """
        digests = []
        for blocks in self._documents(BLOCK_BYTES):
            h, n = hashlib.sha256(), 0
            for data in blocks:
                h.update(data)
                n += len(data)
            if n:
                digests.append(h.digest() + n.to_bytes(8, "little"))
        if len(digests) == 1:
            return digests[0][:32].hex()
        outer = hashlib.sha256(b"tokenkit.corpus 1\n")
        for d in digests:
            outer.update(d)
        return outer.hexdigest()

    def _documents(self, block: int) -> Iterator[Iterator[bytes]]:
        """One iterator per document, of its bytes in blocks of exactly `block` (the last shorter)."""
        return (blocks for _, blocks in self._named_documents(block))

    def _named_documents(self, block: int) -> Iterator[tuple[str, Iterator[bytes]]]:
        """(where, blocks) of each document, as `_documents`; where names its file (and line)."""
        self._start_reading()
        for inp in self._inputs:
            if inp.kind == "text":
                yield inp.name, _slices(inp.data, block)
            elif self.text_field is not None:
                for lineno, (_, doc) in enumerate(self._jsonl(inp), 1):
                    yield f"{_place(inp)}, record {lineno}", _slices(doc, block)
            else:
                yield _place(inp), self._file_blocks(inp, block)

    def _start_reading(self) -> None:
        """Refuse a second reading of a corpus that holds a stream (stdin or a pipe)."""
        if any(i.kind == "stream" for i in self._inputs):
            if self._streams_read:
                raise TokenizerError(
                    "the corpus holds stdin or a pipe, which was read already; it can be read only once"
                )
            self._streams_read = True

    def _file_blocks(self, inp: Input, block: int) -> Iterator[bytes]:
        with Reader(inp, self.binary) as reader:
            data = reader.read(block)
            if inp.kind == "stream" and not self.binary:
                self._check_text(inp, data[:_SNIFF_BYTES], reader.codec)
            while data:
                yield data
                data = reader.read(block)

    def _jsonl(self, inp: Input) -> Iterator[tuple[str | None, bytes]]:
        """(group, document) of each line: the group at `group_field` (None without one)."""
        with Reader(inp, False) as reader:
            if inp.kind == "stream":
                head = reader.read(_SNIFF_BYTES)
                self._check_text(inp, head, reader.codec)
            else:
                head = b""
            for lineno, line in enumerate(_lines(head, reader, inp.name), 1):
                where = f"{_place(inp)}:{lineno}"
                if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):  # a byte order mark
                    line = line[3:]
                if not line.strip():
                    continue
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise TokenizerError(
                        f"{where}: not valid UTF-8 (byte 0x{line[err.start]:02x} at column {err.start + 1}); "
                        "JSON lines must be UTF-8"
                    ) from None
                try:
                    record = json.loads(text)
                except RecursionError:
                    raise TokenizerError(f"{where}: JSON nested too deep to read") from None
                except ValueError as err:
                    msg = f"{err.msg}, column {err.colno}" if isinstance(err, json.JSONDecodeError) else str(err)
                    raise TokenizerError(f"{where}: not valid JSON ({msg}); give one JSON object per line") from None
                value = _field(record, self.text_field, where)
                group = None if self.group_field is None else _field(record, self.group_field, where, "--group-by")
                try:
                    yield group, value.encode("utf-8")
                except UnicodeEncodeError as err:
                    raise TokenizerError(
                        f"{where}: field {self.text_field!r} holds a lone surrogate "
                        f"(\\u{ord(value[err.start]):04x}), which is not Unicode text"
                    ) from None

    def _check_text(self, inp: Input, head: bytes, codec: str | None) -> None:
        """Warn (or, for JSONL, refuse) when the start of an input does not look like text."""
        what = not_text(head)
        if what is None:
            return
        after = f" after {codec} decompression" if codec else ""
        if self.text_field is not None:
            raise TokenizerError(f"{inp.name} looks like {what}{after}, not JSON lines")
        if self._warn is not None:
            self._warn(
                f"{inp.name} looks like {what}{after}, not text; reading its bytes as they are "
                "(--binary reads files raw on purpose, without this warning)"
            )

    # ------------------------------------------------------------------------ resolving

    def _resolve(self, source: Source) -> list[Input]:
        if isinstance(source, (bytes, bytearray)):
            return [Input(f"text {len(self._inputs) + 1}", "text", data=bytes(source))]
        if isinstance(source, FileRange):
            return [
                Input(_shown(source.path), "range", path=os.fspath(source.path), start=source.start, end=source.end)
            ]
        if not isinstance(source, (str, os.PathLike)):
            raise TokenizerError(f"a corpus source must be a file path or bytes, got {type(source).__name__}")
        path = os.fspath(source)
        name = self._names.get(path) or _shown(path)
        if path == "-":
            if _is_terminal(sys.stdin):
                raise TokenizerError(
                    "stdin (-) is a terminal, and nothing is piped in; pipe a corpus into it "
                    "(`tk ... - < corpus.txt`) or give the file itself"
                )
            return [Input("stdin", "stream", path="-")]
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL byte, so certainly not a file
            hint = "; to train on a text itself, pass it as bytes" if isinstance(source, str) else ""
            raise TokenizerError(f"corpus file not found: {name}{hint}") from None
        except OSError as err:
            raise TokenizerError(f"cannot read corpus file {name}: {err.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            return self._walk(path, name)
        if stat.S_ISFIFO(st.st_mode):
            return [Input(name, "stream", path=path)]
        if not stat.S_ISREG(st.st_mode):
            kind = "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
            raise TokenizerError(f"{name} is {kind}; give text files, directories, - for stdin, or a pipe")
        return [self._file(path, name, st.st_size)]

    def _file(self, path: str, name: str, size: int) -> Input:
        """A regular file, its compression sniffed (and whether its text looks like text)."""
        inp = Input(name, "file", path=path, end=size)
        if self.binary or size == 0:
            return inp
        with Reader(inp, True) as raw:
            head = raw.read(_SNIFF_BYTES)
        codec = codec_of(head)
        if codec is not None:
            inp = inp._replace(codec=codec)
            with Reader(inp, False) as reader:
                head = reader.read(_SNIFF_BYTES)
        self._check_text(inp, head, codec)
        return inp

    def _walk(self, root: str, root_name: str) -> list[Input]:
        """The files below `root`: sorted by path, hidden names skipped, `glob` applied, each
        real directory and file once."""
        seen_dirs: set[tuple[int, int]] = set()
        found: list[tuple[bool, bytes, str, os.stat_result]] = []
        todo = [(root, "")]
        while todo:
            directory, rel = todo.pop()
            try:
                st = os.stat(directory)
                if (st.st_dev, st.st_ino) in seen_dirs:
                    continue  # a symlink loop, or a directory linked twice
                seen_dirs.add((st.st_dev, st.st_ino))
                entries = list(os.scandir(directory))
            except OSError as err:
                raise TokenizerError(f"cannot read directory {_shown(directory)}: {err.strerror}") from None
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                try:
                    st = entry.stat()  # follows symlinks
                except OSError:
                    continue  # a broken symlink
                if stat.S_ISDIR(st.st_mode):
                    todo.append((entry.path, rel + entry.name + "/"))
                elif stat.S_ISREG(st.st_mode):
                    below = rel + entry.name
                    if self.glob is None or fnmatchcase(below, self.glob) or fnmatchcase(entry.name, self.glob):
                        found.append((entry.is_symlink(), os.fsencode(below), entry.path, st))
        # The same file reached through links is read once, at the place of its real path (or,
        # when all are links, of the first link by path).
        found.sort()
        chosen: dict[tuple[int, int], tuple[bytes, str, int]] = {}
        for _, key, path, st in found:
            chosen.setdefault((st.st_dev, st.st_ino), (key, path, st.st_size))
        files = [self._file(path, _shown(path), size) for _, path, size in sorted(chosen.values())]
        if not files:
            matching = f" matching --glob {self.glob!r}" if self.glob is not None else ""
            raise TokenizerError(f"directory {root_name} holds no files{matching} (hidden ones are skipped)")
        return files


def as_corpus(sources: Corpus | Source | Iterable[Source], **options) -> Corpus:
    """`sources` as a Corpus (a Corpus is returned as it is)."""
    return sources if isinstance(sources, Corpus) else Corpus(sources, **options)


def _slices(data: bytes, block: int) -> Iterator[bytes]:
    for i in range(0, len(data), block):
        yield data[i : i + block]


def _lines(head: bytes, reader: Reader, name: str) -> Iterator[bytes]:
    """The lines of `head` + the rest of `reader`, without their b"\\n", each at most MAX_LINE_BYTES."""
    pending: list[bytes] = []  # the start of a line that continues in the next block
    pending_bytes = 0
    block = head or reader.read(BLOCK_BYTES)
    lineno = 0
    while block:
        cut = block.find(b"\n")
        if cut < 0:
            pending.append(block)
            pending_bytes += len(block)
        else:
            lines = block[cut + 1 :].split(b"\n")
            rest = lines.pop()
            yield b"".join(pending) + block[:cut]
            yield from lines
            lineno += 1 + len(lines)
            pending, pending_bytes = [rest], len(rest)
        if pending_bytes > MAX_LINE_BYTES:
            raise TokenizerError(
                f"{name}, line {lineno + 1}: a line longer than {MAX_LINE_BYTES >> 30} GiB; "
                "JSON lines hold one document per line"
            )
        block = reader.read(BLOCK_BYTES)
    if pending_bytes:
        yield b"".join(pending)


def _field(record, path: str, where: str, flag: str = "--text-field") -> str:
    """The string at `path` in a JSON record: a key, or a dotted path of keys and list indices
    (`flag`: the option that names another field, for the message when it is missing)."""
    if not isinstance(record, dict):
        raise TokenizerError(f"{where}: a JSON {_json_type(record)}, not an object with the field {path!r}")
    if path in record:
        value = record[path]
    else:
        value = record
        for part in path.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isascii() and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                fields = ", ".join(repr(k) for k in list(record)[:8]) + (", ..." if len(record) > 8 else "") or "none"
                raise TokenizerError(f"{where}: no field {path!r} (its fields: {fields}); give {flag} NAME")
    if not isinstance(value, str):
        raise TokenizerError(f"{where}: field {path!r} is a JSON {_json_type(value)}, not a string")
    return value


def _json_type(value) -> str:
    names = {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        type(None): "null",
        int: "number",
        float: "number",
    }
    return names.get(type(value), type(value).__name__)


def _place(inp: Input) -> str:
    """An input as the start of a "file:line" place: the path unquoted when it prints plainly
    (and the input has no name of its own)."""
    plain = (
        inp.path is not None
        and inp.path != "-"
        and inp.path.isprintable()
        and len(inp.path) <= 120
        and inp.name == _shown(inp.path)
    )
    return inp.path if plain else inp.name


def _is_terminal(stream) -> bool:
    """Whether `stream` (sys.stdin) is a terminal; a missing or closed one is not."""
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        return False


def _shown(path: str | os.PathLike) -> str:
    """A path for a one-line message: quoted and escaped, and cut short if it is long."""
    text = repr(os.fspath(path))
    return text if len(text) <= 120 else text[:100] + "...'"


def find_file_cut(
    path: str | os.PathLike, offset: int, end: int, specials: Sequence[bytes] = (), window: int = 1 << 16
) -> int | None:
    """The first safe place (`find_cut`'s rule) to cut the file at or after `offset`, before `end`, or None."""
    pad = max([CUT_CONTEXT] + [len(s) for s in specials])  # context on both sides of a cut
    with open(path, "rb") as f:
        pos = max(offset, 1)
        while pos < end:
            base = max(pos - pad, 0)
            f.seek(base)
            want = pos - base + window + pad
            buf = f.read(want)
            at_eof = len(buf) < want
            cut = find_cut(buf, pos - base, end - base, last=False, specials=specials)
            if cut >= 0:
                return base + cut
            if at_eof:
                return None
            pos = base + len(buf) - pad  # the next window sees the cuts that lacked context here
    return None


def read_range(path: str | os.PathLike, start: int, end: int) -> str:
    """Bytes [start, end) of a file as text (surrogateescape, so any bytes survive)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(end - start).decode("utf-8", errors="surrogateescape")
    except OSError as err:
        raise TokenizerError(f"cannot read corpus file {_shown(path)}: {err.strerror}") from None


def file_ranges(path: str, size: int, piece_bytes: int, specials: Sequence[bytes] = ()) -> list[tuple[int, int]]:
    """A file's bytes as ranges of about `piece_bytes` (one range under twice that), cut at
    `find_file_cut`'s places."""
    cuts = [0]
    while size >= 2 * piece_bytes:
        cut = find_file_cut(path, cuts[-1] + piece_bytes, size, specials)
        if cut is None:
            break
        cuts.append(cut)
    cuts.append(size)
    return list(pairwise(cuts))
