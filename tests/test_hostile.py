"""Hostile input: files and flags that must end in one line and exit 1, never a hang, a huge
allocation or a traceback.

Two parts:
- A fuzzer for the three file formats tk reads: the tokenizer file (`Tokenizer.load`), the model
  file (`pipeline.checkpoint.load_model`) and the ids `.npy` (`bpe.io.load_ids`). Each valid file
  is truncated, has bytes flipped, and has its header rewritten (safetensors: the 8-byte length,
  dtypes, shapes, offsets, metadata values including JSON nested 100,000 deep and huge numbers;
  .npy: shapes, dtypes, versions, header text). Every case must load or raise one of the user
  error types, in well under a second. The loop runs in a child process whose address space is
  capped (RLIMIT_AS) at 1 GiB above what it uses at the start, so a huge allocation fails the
  test instead of the machine. The cases are seeded: a failure names the case to replay.
- One test per known attack: a regex bomb in a tokenizer file (alone or inside a model), a custom
  pattern that backtracks forever, a sinusoidal model with an absurd context, a model too big for
  memory, a .npy header declaring 1e11 ids, JSON nested too deep in every JSON a file carries,
  and flag values that used to end in tracebacks.

Run this file as a script (`python tests/test_hostile.py KIND FILE SEED N`) to fuzz one format by
hand; the tests do exactly that in a child process.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkit.bpe import Tokenizer, TokenizerError
from tokenkit.bpe import io as bpe_io
from tokenkit.bpe.pretokenize import GPT2_PATTERN, GPT4_PATTERN
from tokenkit.common import jsonsafe
from tokenkit.common.errors import FileError
from tokenkit.pipeline import PipelineError
from tokenkit.pipeline.config import MAX_WORKERS
from tokenkit.transformer import GPT, GPTConfig, ModelError

USER_ERRORS = (TokenizerError, ModelError, PipelineError, FileError)
HERE = Path(__file__).resolve()
PER_CASE_S = 1.0  # each fuzz case; they take milliseconds
FUZZ_HEADROOM = 1 << 30  # the fuzzing child may allocate this much beyond its start
BOMB = "(a|aa)+b"  # exponential backtracking on a run of a's (the regex module takes hours on 40)
DEEP = "[" * 100_000 + "]" * 100_000
TEXT = b"once upon a time there was a fox. the fox ran and ran. " * 60


# --------------------------------------------------------------------------- safetensors by hand
# Our own reader/writer of the container, so that the tests do not trust the code under test to
# build the hostile files.


def st_parse(data: bytes) -> tuple[dict, dict[str, str], dict[str, bytes]]:
    """(tensor entries, metadata, raw bytes of each tensor) of a valid safetensors file."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    metadata = header.pop("__metadata__", {})
    body = data[8 + n :]
    blobs = {name: body[e["data_offsets"][0] : e["data_offsets"][1]] for name, e in header.items()}
    return header, metadata, blobs


def st_build(entries: dict, metadata: dict | None, blobs: dict[str, bytes]) -> bytes:
    """A safetensors file with fresh, consistent data offsets (entries keep dtype and shape);
    laid out as tokenkit writes (sorted, compact JSON), so that a fingerprint can be recomputed."""
    header: dict = {} if metadata is None else {"__metadata__": dict(sorted(metadata.items()))}
    start = 0
    for name in sorted(entries):
        entry = dict(entries[name])
        entry["data_offsets"] = [start, start + len(blobs[name])]
        start += len(blobs[name])
        header[name] = entry
    return st_raw(header, b"".join(blobs[name] for name in sorted(entries)))


def st_raw(header, body: bytes) -> bytes:
    """A header exactly as given (any JSON, any offsets), then `body`."""
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def st_with_metadata(data: bytes, **changes) -> bytes:
    """The same file with some metadata values replaced (None deletes the key)."""
    entries, metadata, blobs = st_parse(data)
    for key, value in changes.items():
        key = key.replace("__", ".")  # tokenizer__pattern_regex -> tokenizer.pattern_regex
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    return st_build(entries, metadata, blobs)


def tokenizer_fingerprint(file_bytes: bytes) -> str:
    """What a model file records for its embedded tokenizer: sha256 of that tokenizer's file."""
    return hashlib.sha256(file_bytes).hexdigest()


def embedded_tokenizer_file(model_bytes: bytes) -> bytes:
    entries, metadata, blobs = st_parse(model_bytes)
    p = "tokenizer."
    return st_build(
        {k[len(p) :]: v for k, v in entries.items() if k.startswith(p)},
        {k[len(p) :]: v for k, v in sorted(metadata.items()) if k.startswith(p)},
        {k[len(p) :]: v for k, v in blobs.items() if k.startswith(p)},
    )


# --------------------------------------------------------------------------- mutations


def _deep(rng: random.Random) -> str:
    d = rng.choice([65, 1000, 100_000])
    return rng.choice(["[" * d + "]" * d, '{"a":' * d + "1" + "}" * d, "[" * d])


_JSON_VALUES = [
    lambda r: _deep(r),
    lambda r: "1e999999",
    lambda r: "9" * 5000,
    lambda r: str(2**64),
    lambda r: "-1",
    lambda r: "null",
    lambda r: "[]",
    lambda r: "{}",
    lambda r: '"text"',
    lambda r: "",
    lambda r: "{" + '"k":' * 3,
    lambda r: bytes(r.randrange(256) for _ in range(r.randrange(1, 40))).decode("latin1"),
    lambda r: json.dumps({str(i): i for i in range(r.choice([1, 1000]))}),
    lambda r: json.dumps({"<|x|>": r.choice([0, -1, 2**40, 10**30, 1.5, "1", None, [1]])}),
]
_NUMBERS = [0, -1, 1, 2, 3, 7, 10**12, 2**31, 2**63, 2**64, 10**30, 1.5, float("inf"), "8", None, True, [], {}]
_CONFIG_VALUES = _NUMBERS + ["learned", "sinusoidal", "gelu", "relu", "pre", "post", "x" * 1000]


def _config_value(r: random.Random, config: dict) -> str:
    """A model config with one or two fields changed, or something that is not one at all."""
    choice = r.randrange(6)
    if choice == 0:
        return r.choice(_JSON_VALUES)(r)
    c = dict(config)
    if choice == 1:  # the attack of the issue: sinusoidal positions, an absurd context
        c.update(positional="sinusoidal", context_length=r.choice([2**16, 2**16 + 1, 10**9, 2**40, 10**30]))
    elif choice == 2:
        c.update(d_model=r.choice([2**16, 2**20, 2**40]), n_heads=1)
    else:
        for _ in range(r.randint(1, 2)):
            key = r.choice(sorted(c) + ["unknown_field"])
            c[key] = r.choice(_CONFIG_VALUES)
    try:
        return json.dumps(c)
    except ValueError:
        return json.dumps(config)


def _pattern_values(r: random.Random) -> str:
    return r.choice(
        ["gpt2", "gpt4", "cl100k", "none", "", GPT2_PATTERN, GPT4_PATTERN, BOMB, "(", r"\w+|\W+", "x" * 5000]
    )


def safetensors_mutants(data: bytes, rng: random.Random, n: int, kind: str):
    """(label, bytes) of n hostile variants of a valid safetensors file."""
    entries, metadata, blobs = st_parse(data)
    (n_header,) = struct.unpack("<Q", data[:8])
    body = data[8 + n_header :]
    names = sorted(entries)
    config = json.loads(metadata["config"]) if "config" in metadata else {}
    for i in range(n):
        op = i % 8
        if op == 0:
            k = rng.randrange(len(data))
            yield f"truncate at {k}", data[:k]
        elif op == 1:
            b = bytearray(data)
            spots = []
            for _ in range(rng.randint(1, 8)):
                pos = rng.randrange(8 + n_header) if rng.random() < 0.7 else rng.randrange(len(b))
                b[pos] ^= rng.randrange(1, 256)
                spots.append(pos)
            yield f"flip bytes {spots}", bytes(b)
        elif op == 2:
            length = rng.choice(
                [0, 1, 7, n_header - 8, n_header + 8, len(data), 2**32, 2**63, 2**64 - 1, rng.randrange(2**40)]
            )
            yield f"header length {length}", struct.pack("<Q", length) + data[8:]
        elif op == 3:  # one tensor entry changed
            name = rng.choice(names)
            h = copy.deepcopy(entries)
            h["__metadata__"] = metadata
            field = rng.choice(["dtype", "shape", "shape", "data_offsets", "data_offsets", "drop", "extra"])
            value = None
            if field == "dtype":
                value = rng.choice(
                    [
                        "F32",
                        "F64",
                        "F16",
                        "BF16",
                        "I8",
                        "I32",
                        "I64",
                        "U8",
                        "U16",
                        "U64",
                        "BOOL",
                        "F8_E4M3",
                        "X",
                        "",
                        7,
                        None,
                    ]
                )
                h[name]["dtype"] = value
            elif field == "shape":
                dims = list(h[name]["shape"])
                value = rng.choice(
                    [
                        [],
                        [0],
                        [-1],
                        [2**63],
                        [2**64],
                        [10**30],
                        [1.5],
                        ["3"],
                        [3, 2**40],
                        [2**31, 2**31],
                        [1] * 9,
                        [d + rng.choice([-1, 1]) for d in dims] or [1],
                        dims[::-1],
                        dims + [1],
                        [10**11],
                        None,
                        "shape",
                    ]
                )
                h[name]["shape"] = value
            elif field == "data_offsets":
                a, b = h[name]["data_offsets"]
                value = rng.choice(
                    [
                        [0, 2**63],
                        [2**64, 2**64 + 4],
                        [-4, 0],
                        [b, a],
                        [a],
                        [a, b, b],
                        [float(a), float(b)],
                        None,
                        [a + 1, b + 1],
                        [a, b + 8],
                        [0, len(body) + 1],
                        [a, a],
                    ]
                )
                h[name]["data_offsets"] = value
            elif field == "drop":
                del h[name]
            else:
                value = {"dtype": "F32", "shape": [10**11], "data_offsets": [0, 4 * 10**11]}
                h["extra." + name] = value
            yield f"tensor {name} {field} = {str(value)[:60]}", st_raw(h, body)
        elif op in (4, 5):  # one metadata value changed (consistent offsets)
            key = "config" if config and rng.random() < 0.5 else rng.choice(sorted(metadata))
            if key == "config":
                value = _config_value(rng, config)
            elif key.endswith("pattern") or key.endswith("pattern_regex"):
                value = _pattern_values(rng)
            else:
                value = rng.choice(_JSON_VALUES)(rng)
            m = dict(metadata)
            m[key] = value
            yield f"metadata {key} = {value[:60]!r}", st_build(entries, m, blobs)
        elif op == 6:  # the header as a whole
            choice = rng.randrange(6)
            if choice == 0:
                yield "header nested 100k deep", st_raw(DEEP.encode(), body)
            elif choice == 1:
                yield "header not an object", st_raw(b"[1, 2, 3]", body)
            elif choice == 2:
                h = copy.deepcopy(entries)
                h["__metadata__"] = rng.choice([[1], "x", {"k": 1}, {"k": {"a": "b"}}, None])
                yield f"__metadata__ = {h['__metadata__']!r}", st_raw(h, body)
            elif choice == 3:
                yield "no metadata", st_build(entries, None, blobs)
            elif choice == 4:
                yield "header not UTF-8", st_raw(b'{"\xff\xfe": 1}', body)
            else:
                yield "header is whitespace", st_raw(b" " * 64, body)
        else:  # a key deleted, or a tensor's bytes swapped for another size
            if rng.random() < 0.5:
                key = rng.choice(sorted(metadata))
                m = {k: v for k, v in metadata.items() if k != key}
                yield f"metadata {key} deleted", st_build(entries, m, blobs)
            else:
                name = rng.choice(names)
                e = copy.deepcopy(entries)
                bl = dict(blobs)
                size = {"F32": 4, "I32": 4, "I64": 8, "U8": 1}[e[name]["dtype"]]
                count = len(bl[name]) // size // 2
                bl[name] = bl[name][: count * size]
                e[name]["shape"] = [count]  # consistent bytes, the wrong size for the rest of the file
                yield f"tensor {name} halved", st_build(e, metadata, bl)


def npy_mutants(data: bytes, rng: random.Random, n: int):
    """(label, bytes) of n hostile variants of a valid 1-D .npy file."""
    header_len = struct.unpack("<H", data[8:10])[0]
    body = data[10 + header_len :]
    count = len(body) // 2
    shapes = [
        (),
        (0,),
        (1,),
        (count,),
        (count + 1,),
        (count - 1,),
        (count // 2, 2),
        (10**11,),
        (2**62,),
        (2**63,),
        (-1,),
        (-count, -1),
        (3, 2**40),
        (1,) * 40,
        (2**31, 2**31, 2**31),
        (10**30,),
    ]
    descrs = [
        "'<u2'",
        "'<u4'",
        "'>u2'",
        "'<i8'",
        "'|u1'",
        "'<f8'",
        "'|O'",
        "'|b1'",
        "'<U3'",
        "'|V4'",
        "[('a', '<u2')]",
        "'<m8[s]'",
        "'<c16'",
        "'u2'",
        "'xyz'",
        "7",
    ]
    for i in range(n):
        op = i % 6
        if op == 0:
            k = rng.randrange(len(data))
            yield f"truncate at {k}", data[:k]
        elif op == 1:
            b = bytearray(data)
            spots = [
                rng.randrange(len(b)) if rng.random() < 0.3 else rng.randrange(10 + header_len)
                for _ in range(rng.randint(1, 6))
            ]
            for pos in spots:
                b[pos] ^= rng.randrange(1, 256)
            yield f"flip bytes {spots}", bytes(b)
        elif op in (2, 3):
            shape, descr = rng.choice(shapes), rng.choice(descrs) if op == 3 else "'<u2'"
            fortran = rng.choice(["False", "False", "True"])
            version = rng.choice([1, 1, 2])
            text = f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape!r}, }}"
            yield f"v{version} shape {shape} descr {descr} fortran {fortran}", _npy(text, body, version)
        elif op == 4:
            text = rng.choice(
                [
                    "{'descr': '<u2', 'fortran_order': False, 'shape': " + "(" * 5000 + ")" * 5000 + ", }",
                    f"{{'descr': '<u2', 'fortran_order': False, 'shape': ({count},), 'extra': 1}}",
                    f"{{'descr': '<u2', 'shape': ({count},)}}",
                    "__import__('os').system('echo pwned')",
                    "[1, 2, 3]",
                    f"{{'descr': '<u2', 'fortran_order': False, 'shape': [{count}], }}",
                    f"{{'descr': '<u2', 'fortran_order': 0, 'shape': ({count},), }}",
                    f"{{'descr': '<u2', 'fortran_order': False, 'shape': ({count}.0,), }}",
                    "".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(1, 200))),
                    f"{{'descr': '<u2', 'fortran_order': False, 'shape': ({'9' * 5000},), }}",
                ]
            )
            yield f"header text {text[:60]!r}", _npy(text, body, rng.choice([1, 2]))
        else:
            version = rng.choice([(1, 0), (2, 0), (3, 0), (1, 5), (0, 0), (255, 255)])
            b = bytearray(data)
            b[6:8] = bytes(version)
            if rng.random() < 0.5:
                b[8:10] = struct.pack("<H", rng.choice([0, 1, 65535, header_len + 16]))
            yield f"version {version}", bytes(b)


def _npy(text: str, body: bytes, version: int) -> bytes:
    raw = text.encode("latin1", "replace")
    if version == 1:
        pad = -(10 + len(raw) + 1) % 64
        raw = raw + b" " * pad + b"\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw) % 65536) + raw + body
    pad = -(12 + len(raw) + 1) % 64
    raw = raw + b" " * pad + b"\n"
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(raw)) + raw + body


# --------------------------------------------------------------------------- the fuzzing child


def _use(kind: str, path: Path) -> None:
    """Load a file as tk does, then use what loaded (so that a lazy failure is seen too)."""
    if kind in ("tokenizer", "listed"):
        tok = Tokenizer.load(path)
        tok.decode(tok.encode("hello world aaaa ünïcode"))
    elif kind == "model":
        from tokenkit.pipeline.checkpoint import load_model

        model, tok, _ = load_model(path)
        ids = tok.encode("once upon")[-model.config.context_length :] or [0]
        model.forward(np.asarray(ids)[None, :])
    else:
        ids = bpe_io.load_ids(path)
        np.asarray(ids[: 1 << 20]).sum()  # reads the mapped bytes: a file shorter than its header says would SIGBUS


def _vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def fuzz(kind: str, source: Path, seed: int, n: int) -> dict:
    """Run n seeded mutants of `source` through `_use` (see the module docstring)."""
    import resource

    import tokenkit.pipeline.checkpoint  # noqa: F401 — imported before the cap, like everything else
    from tokenkit.cli.main import main  # noqa: F401

    data = source.read_bytes()
    rng = random.Random(seed)
    mutants = npy_mutants(data, rng, n) if kind == "ids" else safetensors_mutants(data, rng, n, kind)
    work = source.parent / f"fuzz-{kind}-{os.getpid()}"
    work.mkdir(exist_ok=True)
    target = work / ("ids.npy" if kind == "ids" else "file.safetensors")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_bytes() + FUZZ_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    result = {"loaded": 0, "refused": 0, "bad": [], "slowest": [0.0, ""], "cases": 0}
    for i, (label, blob) in enumerate(mutants):
        target.write_bytes(blob)
        start = time.perf_counter()
        try:
            _use(kind, target)
            result["loaded"] += 1
        except USER_ERRORS as err:
            result["refused"] += 1
            if "\n" in str(err) or not str(err):
                result["bad"].append(f"case {i} ({label}): {type(err).__name__} is not one line: {str(err)[:200]!r}")
        except BaseException as err:  # noqa: BLE001 — MemoryError, RecursionError, anything: the finding
            result["bad"].append(f"case {i} ({label}): {type(err).__name__}: {str(err)[:200]}")
        seconds = time.perf_counter() - start
        result["cases"] += 1
        if seconds > result["slowest"][0]:
            result["slowest"] = [seconds, f"case {i} ({label})"]
    return result


def run_fuzz(kind: str, source: Path, seed: int, n: int, timeout: float = 60) -> dict:
    try:
        proc = subprocess.run(
            [sys.executable, str(HERE), kind, str(source), str(seed), str(n)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"fuzzing {kind} files hung for {timeout} s (replay: python {HERE} {kind} {source} {seed} {n})")
    assert proc.returncode == 0, f"the fuzzing child died ({proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A tokenizer file, a model file (tiny model trained through the pipeline), an ids file."""
    from tokenkit.pipeline import checkpoint
    from tokenkit.pipeline.config import TrainConfig
    from tokenkit.pipeline.start import train_model

    root = tmp_path_factory.mktemp("hostile")
    corpus = root / "corpus.txt"
    corpus.write_bytes(TEXT)
    tok = Tokenizer.train([TEXT], vocab_size=290, special_tokens=["<|endoftext|>"], workers=1, quiet=True)
    tok.save(root / "tok.safetensors")
    # the same vocabulary listed with its special token first (SmolLM's layout): a version 3 file
    Tokenizer([(a + 1, b + 1) for a, b in tok.merges], vocab=[None, *tok.vocab], special_tokens={"<|endoftext|>": 0},
              ignore_merges=True).save(root / "listed.safetensors")  # fmt: skip
    assert Tokenizer.load(root / "listed.safetensors").listed
    config = TrainConfig(
        n_layers=1,
        n_heads=2,
        d_model=8,
        context_length=8,
        batch_size=2,
        steps=2,
        eval_interval=1,
        eval_batches=1,
        warmup_steps=1,
        workers=1,
    )
    train_model(corpus, root / "run", tok, config, quiet=True)
    ids = root / "ids.npy"
    np.save(ids, np.asarray(tok.encode("once upon a time there was a fox"), dtype=np.uint16))
    return {
        "tokenizer": root / "tok.safetensors",
        "listed": root / "listed.safetensors",
        "model": root / "run" / checkpoint.MODEL_FILE,
        "ids": ids,
        "corpus": corpus,
        "run": root / "run",
        "root": root,
    }


def tk(*args, timeout: float = 30) -> tuple[int, str, str, float]:
    """`tk ARGS` in a child process (a hang must fail the test, not stall it): rc, stdout, stderr, seconds."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from tokenkit.cli.main import main; sys.exit(main(sys.argv[1:]))",
                *map(str, args),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"tk {' '.join(map(str, args))[:100]} hung for {timeout} s")
    return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start


def cli(capsys, *args) -> tuple[int, str, str]:
    from tokenkit.cli.main import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, fragment: str = "") -> str:
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert fragment in lines[0], lines[0]
    return lines[0]


@contextlib.contextmanager
def capped_memory(headroom: int = 2 << 30):
    """Cap this process's address space at `headroom` above its current size (Linux), so that an
    attempt to allocate gigabytes fails fast as MemoryError instead of taking the machine."""
    try:
        import resource

        vm = _vm_bytes()
    except (ImportError, OSError):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm + headroom if hard == resource.RLIM_INFINITY else min(vm + headroom, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def within(seconds: float):
    start = time.perf_counter()
    yield
    elapsed = time.perf_counter() - start
    assert elapsed < seconds, f"took {elapsed:.2f} s, more than {seconds} s"


# --------------------------------------------------------------------------- the fuzzers


@pytest.mark.parametrize("kind, n", [("tokenizer", 400), ("listed", 300), ("model", 240), ("ids", 400)])
def test_fuzzed_files_load_or_fail_in_one_line(files, kind, n):
    result = run_fuzz(kind, files[kind], seed=2024, n=n)
    assert result["cases"] == n
    assert result["bad"] == [], "\n".join(result["bad"][:20])
    seconds, case = result["slowest"]
    assert seconds < PER_CASE_S, f"{case} took {seconds:.2f} s"
    # the mutations must bite: most cases are refused, and some still load (e.g. a flipped byte in padding)
    assert result["refused"] > n // 2 and result["loaded"] > 0, result


def test_mutants_are_reproducible_and_start_from_a_valid_file(files):
    for kind in ("tokenizer", "listed", "model", "ids"):
        _use(kind, files[kind])  # the unmutated file loads
    data = files["tokenizer"].read_bytes()
    first = list(safetensors_mutants(data, random.Random(5), 40, "tokenizer"))
    assert first == list(safetensors_mutants(data, random.Random(5), 40, "tokenizer"))
    assert len({blob for _, blob in first}) > 30


# --------------------------------------------------------------------------- split patterns


def _tokenizer_bytes_with(files, **metadata) -> bytes:
    return st_with_metadata(files["tokenizer"].read_bytes(), **metadata)


def test_regex_bomb_under_a_builtin_name_is_refused_on_load(files, tmp_path):
    bomb = tmp_path / "bomb.safetensors"
    bomb.write_bytes(_tokenizer_bytes_with(files, pattern="gpt2", pattern_regex=BOMB))
    with within(1.0), pytest.raises(TokenizerError) as err:
        Tokenizer.load(bomb)
    assert "pattern_regex" in str(err.value) and "\n" not in str(err.value)
    code, _, stderr, seconds = tk("encode", "-t", bomb, "a" * 40)
    one_line_error(code, stderr, "pattern_regex")


@pytest.mark.parametrize(
    "pattern, regex",
    [
        ("gpt2", GPT4_PATTERN),
        ("gpt4", GPT2_PATTERN),
        ("cl100k", ""),
        ("none", r"\w+"),
        ("", r"\w+"),
        (r"\w+|\W+", r"\w+|\s+"),
        (r"\w+|\W+", ""),
        (r"\w+|\W+", GPT2_PATTERN),
    ],
    ids=[
        "gpt2-with-gpt4-regex",
        "gpt4-with-gpt2-regex",
        "cl100k-without-regex",
        "none-with-regex",
        "empty-with-regex",
        "custom-with-other-regex",
        "custom-without-regex",
        "custom-with-gpt2-regex",
    ],
)
def test_pattern_regex_must_be_what_the_pattern_names(files, tmp_path, pattern, regex):
    path = tmp_path / "t.safetensors"
    path.write_bytes(_tokenizer_bytes_with(files, pattern=pattern, pattern_regex=regex))
    with pytest.raises(TokenizerError, match="pattern_regex"):
        Tokenizer.load(path)


@pytest.mark.parametrize(
    "pattern, regex",
    [
        ("gpt2", GPT2_PATTERN),
        ("gpt4", GPT4_PATTERN),
        ("cl100k", GPT4_PATTERN),
        ("none", ""),
        (r"\w+|\W+", r"\w+|\W+"),
    ],
    ids=["gpt2", "gpt4", "cl100k", "none", "custom"],
)
def test_consistent_patterns_load_and_split_as_named(files, tmp_path, pattern, regex):
    path = tmp_path / "t.safetensors"
    path.write_bytes(_tokenizer_bytes_with(files, pattern=pattern, pattern_regex=regex))
    tok = Tokenizer.load(path)
    assert tok.pattern == pattern
    text = "Hello world, it's 2024!\n"
    assert tok.decode(tok.encode(text)) == text
    fresh = Tokenizer(tok.merges, pattern=pattern, special_tokens=tok.special_tokens)
    assert tok.encode(text) == fresh.encode(text)


def test_model_embedding_a_regex_bomb_is_refused(files, tmp_path):
    """The fingerprint is made to match, so only the pattern check can refuse it."""
    from tokenkit.pipeline.checkpoint import load_model

    model_bytes = st_with_metadata(
        files["model"].read_bytes(), tokenizer__pattern="gpt2", tokenizer__pattern_regex=BOMB
    )
    model_bytes = st_with_metadata(
        model_bytes, tokenizer_fingerprint=tokenizer_fingerprint(embedded_tokenizer_file(model_bytes))
    )
    path = tmp_path / "bomb-model.safetensors"
    path.write_bytes(model_bytes)
    with within(1.0), pytest.raises(USER_ERRORS) as err:
        load_model(path)
    assert "pattern_regex" in str(err.value) and "\n" not in str(err.value)
    code, _, stderr, _ = tk("generate", "-m", path, "a" * 40, "-n", "2")
    one_line_error(code, stderr, "pattern_regex")


def test_an_untouched_fingerprint_recipe_matches_the_real_one(files):
    """The recipe above is right: on the unmodified file it gives the recorded fingerprint."""
    data = files["model"].read_bytes()
    assert st_parse(data)[1]["tokenizer_fingerprint"] == tokenizer_fingerprint(embedded_tokenizer_file(data))


def test_custom_pattern_that_backtracks_is_stopped_with_one_line(files, tmp_path):
    """A custom regex is allowed (it is data, given on purpose), but runs under a time limit."""
    text = tmp_path / "a.txt"
    text.write_text("a" * 40 + "\n")
    code, _, stderr, seconds = tk(
        "bpe-train", text, "--pattern", BOMB, "--workers", "1", "-q", "-o", tmp_path / "t.safetensors"
    )
    one_line_error(code, stderr, "takes too long")
    assert "catastrophic backtracking" in stderr and seconds < 10
    # the same pattern stored consistently in a file loads, and fails on the text that triggers it
    path = tmp_path / "custom-bomb.safetensors"
    path.write_bytes(_tokenizer_bytes_with(files, pattern=BOMB, pattern_regex=BOMB))
    assert Tokenizer.load(path).encode("ab b") == Tokenizer(Tokenizer.load(path).merges, pattern=BOMB).encode("ab b")
    code, _, stderr, seconds = tk("encode", "-t", path, "a" * 40)
    one_line_error(code, stderr, "takes too long")
    assert seconds < 10


def test_custom_pattern_timeout_scales_with_the_text():
    from tokenkit.bpe.pretokenize import custom_pattern_timeout, split_text

    assert custom_pattern_timeout(0) == 1.0
    assert custom_pattern_timeout(10_000_000) == pytest.approx(41.0)
    text = "word, another; " * 70_000  # ~1 MB: a sane custom pattern ends inside its limit (no TokenizerError)
    assert "".join(split_text(text, r"\w+|[^\w\s]+|\s+")) == text


# --------------------------------------------------------------------------- models


def test_config_bounds():
    from tokenkit.transformer.config import MAX_CONTEXT_LENGTH

    for field, value in [
        ("context_length", MAX_CONTEXT_LENGTH + 1),
        ("context_length", 10**30),
        ("vocab_size", 2**40),
        ("d_model", 2**20),
        ("n_layers", 10**6),
        ("d_model", 10**5000),
    ]:
        with pytest.raises(ModelError, match=field) as err:
            GPTConfig(**{field: value, **({"n_heads": 1} if field == "d_model" else {})})
        assert "\n" not in str(err.value) and len(str(err.value)) < 200
    GPTConfig(
        positional="sinusoidal", context_length=MAX_CONTEXT_LENGTH, d_model=8, n_heads=1, n_layers=1, vocab_size=300
    )


def test_memory_estimate():
    from tokenkit.transformer.memory import available_bytes, estimate_bytes

    c = GPTConfig(vocab_size=300, context_length=64, d_model=32, n_layers=2, n_heads=4)
    params = 4 * sum(int(np.prod(p.shape)) for p in GPT(c).params.values())
    assert c.n_params() * 4 == params
    assert estimate_bytes(c, training=True) == 5 * params  # params, grads, two AdamW moments, its scratch
    assert estimate_bytes(c) == params + 2 * 4 * 2 * 64 * 32  # + K/V caches of generation
    s = GPTConfig(vocab_size=300, context_length=64, d_model=32, n_layers=2, n_heads=4, positional="sinusoidal")
    assert estimate_bytes(s) == 4 * s.n_params() + 4 * 64 * 32 + 2 * 4 * 2 * 64 * 32  # + the sinusoid table
    assert estimate_bytes(c, training=True, workers=3) == 7 * params
    from tokenkit.transformer.config import llama_config

    g = llama_config(vocab_size=300, context_length=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1)
    assert g.n_params() == sum(int(np.prod(p.shape)) for p in GPT(g).params.values())
    # K/V caches of 1 head of 8 per layer, and the rotary cos and sin tables (64 positions, 4 + 4 columns)
    assert estimate_bytes(g) == 4 * g.n_params() + 2 * 4 * 2 * 64 * 8 + 4 * 64 * 8
    assert available_bytes() is None or available_bytes() > 0
    import doctest

    import tokenkit.transformer.memory

    assert doctest.testmod(tokenkit.transformer.memory).failed == 0


def test_model_too_big_for_memory_is_one_line_before_any_allocation():
    with capped_memory(), within(1.0), pytest.raises(ModelError, match="GB") as err:
        GPT(GPTConfig(vocab_size=300, context_length=64, d_model=65536, n_heads=1, n_layers=2))
    assert "\n" not in str(err.value)


def _rewrite_model(data: bytes, config_changes: dict, drop: tuple[str, ...] = ()) -> bytes:
    entries, metadata, blobs = st_parse(data)
    config = json.loads(metadata["config"])
    config.update(config_changes)
    metadata["config"] = json.dumps(config)
    for name in drop:
        entries.pop(name)
        blobs.pop(name)
    return st_build(entries, metadata, blobs)


@pytest.mark.parametrize("context", [10**9, 2**17])
def test_sinusoidal_model_with_huge_context_is_refused(files, tmp_path, context):
    """No tensor backs a sinusoidal context: only the config bound stands between the file and
    gigabytes of sinusoid table and K/V caches."""
    from tokenkit.pipeline.checkpoint import load_model

    path = tmp_path / "huge-context.safetensors"
    path.write_bytes(
        _rewrite_model(
            files["model"].read_bytes(), {"positional": "sinusoidal", "context_length": context}, drop=("wpe.weight",)
        )
    )
    with capped_memory(), within(1.0), pytest.raises(USER_ERRORS, match="context_length") as err:
        load_model(path)
    assert "\n" not in str(err.value)
    code, _, stderr, _ = tk("predict-next", "-m", path, "once upon")
    one_line_error(code, stderr, "context_length")


def test_sinusoidal_model_within_bounds_still_loads(files, tmp_path):
    from tokenkit.pipeline.checkpoint import load_model

    path = tmp_path / "sinusoidal.safetensors"
    path.write_bytes(
        _rewrite_model(
            files["model"].read_bytes(), {"positional": "sinusoidal", "context_length": 64}, drop=("wpe.weight",)
        )
    )
    model, tok, _ = load_model(path)
    assert model.config.positional == "sinusoidal" and model.config.context_length == 64
    assert model.forward(np.asarray(tok.encode("once upon a time"))[None, :]).shape[-1] == tok.vocab_size


# --------------------------------------------------------------------------- ids files


def _npy_bomb(path: Path, n: int = 10**11) -> Path:
    text = f"{{'descr': '<u2', 'fortran_order': False, 'shape': ({n},), }}"
    path.write_bytes(_npy(text, b"\x00" * 64, 1))
    return path


def test_npy_header_declaring_1e11_ids_is_refused(files, tmp_path):
    bomb = _npy_bomb(tmp_path / "bomb.npy")
    assert bomb.stat().st_size < 300
    with capped_memory(), within(1.0), pytest.raises(TokenizerError, match="100,000,000,000") as err:
        bpe_io.load_ids(bomb)
    assert "\n" not in str(err.value)
    code, _, stderr, _ = tk("decode", "-t", files["tokenizer"], "-f", bomb)
    one_line_error(code, stderr, "truncated or corrupt")


def test_npy_pickles_and_non_integers_are_refused(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    np.save(tmp_path / "f.npy", np.zeros(3))
    np.save(tmp_path / "s.npy", np.zeros(3, dtype=[("a", "<u2")]))
    for name in ("obj.npy", "f.npy", "s.npy"):
        with pytest.raises(TokenizerError, match="expected integer token ids"):
            bpe_io.load_ids(tmp_path / name)


def test_valid_ids_load_memory_mapped_in_every_layout(tmp_path):
    arrays = {
        "u2.npy": np.arange(1000, dtype=np.uint16),
        "be.npy": np.arange(12, dtype=">u4").reshape(3, 4),
        "fortran.npy": np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
        "empty.npy": np.zeros(0, dtype=np.uint32),
    }
    for name, arr in arrays.items():
        np.save(tmp_path / name, arr)
        ids = bpe_io.load_ids(tmp_path / name)
        assert ids.ndim == 1 and ids.tolist() == arr.reshape(-1).tolist(), name
    assert isinstance(bpe_io.load_ids(tmp_path / "u2.npy"), np.memmap)
    # a big valid file costs what is read, not its size: mapped, not copied
    big = tmp_path / "big.npy"
    np.lib.format.open_memmap(big, mode="w+", dtype=np.uint16, shape=(50_000_000,)).flush()  # 100 MB, sparse
    import tracemalloc

    tracemalloc.start()
    ids = bpe_io.load_ids(big)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(ids) == 50_000_000 and peak < 10_000_000


# --------------------------------------------------------------------------- JSON nested too deep


def test_deep_json_in_tokenizer_metadata_is_one_error(files, tmp_path):
    for key in ("special_tokens", "training"):
        path = tmp_path / f"{key}.safetensors"
        path.write_bytes(_tokenizer_bytes_with(files, **{key: DEEP}))
        with pytest.raises(TokenizerError, match="nested deeper") as err:
            Tokenizer.load(path)
        assert key in str(err.value) and "\n" not in str(err.value)


def test_deep_json_in_model_metadata_is_one_line(files, tmp_path, capsys):
    data = files["model"].read_bytes()
    for key in ("config", "provenance", "tokenizer.special_tokens", "tokenizer.training"):
        path = tmp_path / f"deep-{key}.safetensors"
        path.write_bytes(st_with_metadata(data, **{key.replace(".", "__"): DEEP}))
        for command in (
            ["info", path],
            ["predict-next", "-m", path, "once"],
            ["generate", "-m", path, "once", "-n", "1"],
        ):
            code, out, err = cli(capsys, *command)
            if key == "provenance" and code == 0:  # provenance is only shown: `info` may show it raw
                continue
            one_line_error(code, err)


def test_deep_gpt2_vocab_json_is_one_line(tmp_path, capsys):
    (tmp_path / "vocab.json").write_text(DEEP)
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    code, _, err = cli(
        capsys, "bpe-import", tmp_path / "vocab.json", tmp_path / "merges.txt", "-o", tmp_path / "t.safetensors"
    )
    one_line_error(code, err, "nested deeper")
    (tmp_path / "vocab.json").write_bytes(b"\xff\xfe{}")
    code, _, err = cli(
        capsys, "bpe-import", tmp_path / "vocab.json", tmp_path / "merges.txt", "-o", tmp_path / "t.safetensors"
    )
    one_line_error(code, err)


# pieces of JSON and of damaged JSON: escapes, quotes and brackets inside and outside strings
JSON_BITS = ['"', "\\", '\\"', "\\\\", "[", "]", "{", "}", "a", " ", ",", "é", '"a"', '"[\\"]"', '"\\\\"']


@settings(max_examples=500, deadline=None)
@given(bits=st.lists(st.sampled_from(JSON_BITS), max_size=30))
def test_json_depth_found_at_once_is_the_plain_one(bits):
    text = "".join(bits)
    found = jsonsafe._depth_at_once(text.encode("utf-8"))
    assert found is None or found == jsonsafe._depth_plain(text)
    assert jsonsafe.depth(text) == jsonsafe.depth(text.encode("utf-8")) == jsonsafe._depth_plain(text)


JSON_VALUES = st.recursive(
    st.none() | st.integers() | st.text(st.sampled_from('"\\[]{}aé\n'), max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(st.sampled_from('"\\[]{}a'), max_size=3), inner)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES, ascii=st.booleans())
def test_json_depth_of_valid_json_is_found_at_once(value, ascii):
    text = json.dumps(value, ensure_ascii=ascii)
    assert jsonsafe._depth_at_once(text.encode("utf-8")) == jsonsafe._depth_plain(text)


def test_jsonsafe_docstring_examples():
    import doctest

    import tokenkit.common.jsonsafe

    result = doctest.testmod(tokenkit.common.jsonsafe)
    assert result.failed == 0 and result.attempted > 0


# --------------------------------------------------------------------------- flags


def test_decode_of_a_digit_that_int_refuses(files, capsys):
    for bad in ("²", "٣x", "1e5", "9" * 5000):
        code, _, err = cli(capsys, "decode", "-t", files["tokenizer"], "104", bad)
        one_line_error(code, err, "is not a token id")
    code, out, _ = cli(capsys, "decode", "-t", files["tokenizer"], "[104, 105]")
    assert code == 0 and out == "hi\n"


def test_generate_seed_out_of_range(files, capsys):
    code, _, err = cli(capsys, "generate", "-m", files["run"], "once", "--seed", "-1", "-n", "2")
    one_line_error(code, err, "seed")
    code, out, _ = cli(capsys, "generate", "-m", files["run"], "once", "--seed", str(2**80), "-n", "2")
    assert code == 0 and out.startswith("once")


def test_tiny_temperature_is_greedy_not_garbage(files, capsys):
    greedy = cli(capsys, "generate", "-m", files["run"], "once", "--temperature", "0", "-n", "5")
    tiny = cli(capsys, "generate", "-m", files["run"], "once", "--temperature", "1e-320", "-n", "5", "--seed", "1")
    assert greedy[0] == tiny[0] == 0 and tiny[1] == greedy[1] and tiny[2] == ""


def test_other_out_of_range_flags(files, capsys, tmp_path, monkeypatch):
    run = files["run"]
    for command, fragment in [
        (["generate", "-m", run, "once", "--top-k", "0"], "--top-k"),
        (["generate", "-m", run, "once", "--top-p", "nan"], "--top-p"),
        (["generate", "-m", run, "once", "--temperature", "-1"], "temperature"),
        (["generate", "-m", run, "once", "-n", "-1"], "max-new-tokens"),
        (["predict-next", "-m", run, "once", "--top-k", "0"], "top-k"),
        (["explain", "-m", run, "once", "--layer", "-1"], "layer"),
        (["explain", "-m", run, "once", "--head", "99"], "head"),
        (["explain", "-m", run, "once", "--top-k", "0"], "top-k"),
        (["bpe-train", files["corpus"], "--workers", "0", "-o", tmp_path / "t.safetensors", "-q"], "workers"),
        (["bpe-train", files["corpus"], "--vocab-size", "-5", "-o", tmp_path / "t.safetensors", "-q"], "vocab size"),
        (
            ["bpe-train", files["corpus"], "--min-frequency", "0", "-o", tmp_path / "t.safetensors", "-q"],
            "min-frequency",
        ),
        (["bpe-train", files["corpus"], "--pattern", "(", "-o", tmp_path / "t.safetensors", "-q"], "pattern"),
    ]:
        one_line_error(*cli(capsys, *command)[::2], fragment)
    # absurdly large values that are still meaningful work, bounded by what there is
    code, out, _ = cli(capsys, "predict-next", "-m", run, "once", "--top-k", str(10**30))
    assert code == 0
    # --workers at its most (MAX_WORKERS) must not fork that many processes: no more workers than pieces of text
    import tokenkit.bpe.pretokenize

    real = tokenkit.bpe.pretokenize._count_in_workers
    started = []

    def guarded(pieces, pattern, workers, total, quiet):
        started.append(workers)
        assert workers <= 4, f"would start {workers} counting processes for a {total}-byte corpus"
        return real(pieces, pattern, workers, total, quiet)

    monkeypatch.setattr(tokenkit.bpe.pretokenize, "_count_in_workers", guarded)
    code, _, err = cli(
        capsys,
        "bpe-train",
        files["corpus"],
        "--workers",
        str(MAX_WORKERS),
        "--vocab-size",
        str(10**30),
        "-o",
        tmp_path / "t.safetensors",
        "-q",
    )
    assert code == 0, err
    assert Tokenizer.load(tmp_path / "t.safetensors").vocab_size > 256


def test_train_model_too_big_for_memory_is_one_line(files, tmp_path, capsys):
    with capped_memory(), within(5.0):
        code, _, err = cli(
            capsys,
            "train-model",
            files["corpus"],
            "-t",
            files["tokenizer"],
            "-o",
            tmp_path / "big",
            "--d-model",
            "65536",
            "--n-heads",
            "1",
            "--steps",
            "1",
            "-q",
        )
    one_line_error(code, err, "GB")


if __name__ == "__main__":  # the fuzzing child: python tests/test_hostile.py KIND FILE SEED N
    kind_, source_, seed_, n_ = sys.argv[1:5]
    print(json.dumps(fuzz(kind_, Path(source_), int(seed_), int(n_))))
