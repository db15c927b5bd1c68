"""CUDA C++ kernels run on the CPU, for tests: `EmulatedModule` has cupy.RawModule's interface, so
a kernel source written for NVRTC is launched exactly as on a GPU, grid, block and argument
tuple alike, over NumPy arrays.

    module = EmulatedModule(src.SOURCE, src.OPTIONS, src.EXPRESSIONS)
    kernels = CudaKernels(np, module)  # transformer/backends/cuda_launch.py's launches, unchanged
    module.get_function("adamw<float>")((4,), (256,), (p, g, m, v, np.int64(p.size), ...))

How: the source, with cuda_emulator.h in front of it, is compiled by g++ into a shared library,
one per module and its name expressions (cached on disk by a hash of all that goes into it), which
holds a table of the kernels; ctypes calls its launcher. The header runs each thread of a block
as a fiber and says what it emulates and what not (no timing, no races, no memory model beyond
the block's barriers).

Around each launch this module checks what a GPU would not: each argument's type against the
kernel's parameter (a np.int64 passed for an `int` is a TypeError naming it, where a GPU reads
half of it), that arrays are C-contiguous, the grid and block against CUDA's limits, and writes
out of bounds. Each array is copied into a buffer between guard bytes, the kernel runs there, the
guards are checked (an AssertionError names the argument) and the bytes are copied back, so that
kernels write in place as on a GPU; arrays that share memory share one buffer.

What it does not do: speed (a thread switch costs about a microsecond), Python scalars as
arguments (their C type would be CuPy's guess: pass np.int32, np.float32, ...), dynamic shared
memory, catch reads out of bounds (they read guard bytes), or guard arrays that a kernel reaches
through a table of addresses (adamw_multi's): those it reads and writes where they lie.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

CXX = shutil.which("g++")  # None: the tests that need the emulator skip
HEADER = Path(__file__).with_name("cuda_emulator.h")
CACHE = Path(tempfile.gettempdir()) / "tk-cuda-emulator"
FLAGS = ("-std=c++17", "-O1", "-fPIC", "-shared", "-fno-strict-aliasing", "-ffp-contract=off", "-DTK_CPU_EMULATION")
GUARD = 4096  # bytes before and after each array
CANARY = np.random.default_rng(0xC0DA).integers(0, 256, GUARD, dtype=np.uint8)

C_NAMES = {
    np.dtype(t): name
    for t, name in [(np.float32, "float"), (np.float64, "double"), (np.int32, "int"), (np.int64, "long long"),
                    (np.uint32, "unsigned"), (np.uint64, "unsigned long long"), (np.bool_, "bool"),
                    (np.int8, "signed char"), (np.uint8, "unsigned char"), (np.int16, "short"),
                    (np.uint16, "unsigned short")]
}  # fmt: skip
C_TYPES = {
    "float": ctypes.c_float, "double": ctypes.c_double, "int": ctypes.c_int32, "long long": ctypes.c_int64,
    "unsigned": ctypes.c_uint32, "unsigned long long": ctypes.c_uint64, "bool": ctypes.c_bool,
    "signed char": ctypes.c_int8, "unsigned char": ctypes.c_uint8, "short": ctypes.c_int16,
    "unsigned short": ctypes.c_uint16,
}  # fmt: skip

EXPORTS = """
extern "C" const char* tk_emu_signature(int i) { return tk_emu_entries[i].signature(); }
extern "C" int tk_emu_launch(int i, const unsigned* grid, const unsigned* block, void** args, char* error,
                             unsigned long error_size) {
    return tk_emu::launch(tk_emu_entries[i], tk_emu_names[i], grid, block, args, error, error_size);
}
"""


class CompileError(RuntimeError):
    """g++ refused the source (or a name expression); the message is its output."""


class EmulatedModule:
    """cupy.RawModule(code=..., options=..., name_expressions=...) on the CPU. `get_function`
    compiles, on first use, every name expression at once; one not among them gets a library
    of its own. Of NVRTC's options only -D, -U and -I apply; the source is always compiled
    without contracting multiply-adds (as --fmad=false)."""

    def __init__(self, code: str, options=(), name_expressions=()):
        self.code = code
        self.options = tuple(o for o in options if o[:2] in ("-D", "-U", "-I"))
        self.name_expressions = tuple(name_expressions)
        self._functions: dict[str, EmulatedFunction] = {}

    def get_function(self, name_expression: str) -> EmulatedFunction:
        """The kernel `name_expression` ("adamw<float>", "flash_forward<64>", "my_kernel")."""
        fn = self._functions.get(name_expression)
        if fn is None:
            group = self.name_expressions if name_expression in self.name_expressions else (name_expression,)
            library = _library(self.code, self.options, group)
            fn = self._functions[name_expression] = EmulatedFunction(
                library, group.index(name_expression), name_expression
            )
        return fn


class EmulatedFunction:
    """One kernel of a compiled library, called as CuPy calls a RawKernel: f(grid, block, args)."""

    def __init__(self, library: ctypes.CDLL, index: int, name: str):
        self.name = name
        self._library = library
        self._index = index
        signature = library.tk_emu_signature(index).decode()
        self.parameters = signature.split(",") if signature else []

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        grid, block = _dims(grid, "grid"), _dims(block, "block")
        _check_launch(self.name, grid, block)
        if shared_mem:
            raise NotImplementedError(f"{self.name}: dynamic shared memory ({shared_mem} bytes) is not emulated")
        args = tuple(args)
        if len(args) != len(self.parameters):
            raise TypeError(f"{self.name} takes {len(self.parameters)} arguments, the launch passes {len(args)}")
        values: list = [None] * len(args)
        arrays = []
        for i, (arg, want) in enumerate(zip(args, self.parameters, strict=True)):
            got = _c_name(self.name, i, arg)
            if got != want:
                raise TypeError(f"{self.name}: argument {i} is {got}, but the kernel's parameter is {want}")
            if isinstance(arg, np.ndarray):
                arrays.append((i, arg))
            else:
                values[i] = C_TYPES[got](arg.item())
        regions = _guarded(arrays, values)
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        error = ctypes.create_string_buffer(1024)
        failed = self._library.tk_emu_launch(
            self._index, (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), pointers, error, len(error)
        )
        if failed:
            raise AssertionError(error.value.decode(errors="replace"))
        for region in regions:
            region.check(self.name)
        for region in regions:
            region.copy_back(self.name)


def _c_name(kernel: str, i: int, arg) -> str:
    """The C type a GPU launch passes for `arg`: "float*" for a float32 array, "int" for np.int32."""
    if isinstance(arg, np.ndarray):
        if not arg.flags.c_contiguous:
            raise TypeError(f"{kernel}: argument {i} is not C-contiguous; a kernel reads its memory as if it were")
        base = C_NAMES.get(arg.dtype)
        return f"{base}*" if base else f"{arg.dtype} array"
    if isinstance(arg, np.generic):
        return C_NAMES.get(arg.dtype, str(arg.dtype))
    raise TypeError(f"{kernel}: argument {i} is a {type(arg).__name__}; pass NumPy arrays and NumPy scalars")


def _dims(dims, what: str) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in dims)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {dims}")
    return dims + (1,) * (3 - len(dims))


def _check_launch(kernel: str, grid, block) -> None:
    """CUDA's limits, which a GPU launch would refuse (invalid configuration argument)."""
    if min(grid) < 1 or grid[0] >= 1 << 31 or max(grid[1:]) > 65535:
        raise ValueError(f"{kernel}: grid {grid} is outside CUDA's limits (x < 2^31, y and z <= 65535, all >= 1)")
    if min(block) < 1 or max(block[:2]) > 1024 or block[2] > 64 or block[0] * block[1] * block[2] > 1024:
        raise ValueError(f"{kernel}: block {block} is outside CUDA's limits (x, y <= 1024, z <= 64, 1024 threads)")


class _Region:
    """Host memory [start, stop) of one or more array arguments, copied into a buffer between
    guard bytes; the kernel gets pointers into the copy."""

    def __init__(self, start: int, stop: int, members: list[tuple[int, np.ndarray]]):
        self.start, self.members = start, members
        size = stop - start
        self.original = np.frombuffer((ctypes.c_ubyte * size).from_address(start), np.uint8) if size else None
        buffer = np.empty(size + 2 * GUARD + 64, np.uint8)
        shift = (start - buffer.ctypes.data - GUARD) % 64  # the copy keeps the original's alignment
        self.before = buffer[shift : shift + GUARD]
        self.data = buffer[shift + GUARD : shift + GUARD + size]
        self.after = buffer[shift + GUARD + size : shift + 2 * GUARD + size]
        self.before[...] = CANARY
        self.after[...] = CANARY
        if size:
            self.data[...] = self.original

    def pointer(self, array: np.ndarray) -> ctypes.c_void_p:
        return ctypes.c_void_p(self.data.ctypes.data + array.ctypes.data - self.start)

    def _names(self) -> str:
        named = ", ".join(f"{i} ({a.dtype}{list(a.shape)})" for i, a in self.members)
        return f"argument {named}" if len(self.members) == 1 else f"arguments {named}, which share memory"

    def check(self, kernel: str) -> None:
        """AssertionError when a guard byte changed: a write out of bounds."""
        bad_before = np.flatnonzero(self.before != CANARY)
        bad_after = np.flatnonzero(self.after != CANARY)
        if bad_before.size:
            where = f"{GUARD - bad_before[0]} bytes before the start of"
        elif bad_after.size:
            where = f"{bad_after[-1] + 1} bytes past the end of"
        else:
            return
        raise AssertionError(f"{kernel} wrote out of bounds: up to {where} {self._names()}")

    def copy_back(self, kernel: str) -> None:
        """The kernel's writes into the caller's arrays (only where it wrote: read-only arrays stay)."""
        if self.original is None or np.array_equal(self.data, self.original):
            return
        if not all(a.flags.writeable for _, a in self.members):
            raise AssertionError(f"{kernel} wrote into read-only memory: {self._names()}")
        self.original[...] = self.data


def _guarded(arrays: list[tuple[int, np.ndarray]], values: list) -> list[_Region]:
    """One _Region per run of overlapping arrays; values[i] := the pointer of array argument i."""
    spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes, i, a) for i, a in arrays)
    groups: list[list] = []
    for start, stop, i, a in spans:
        if groups and start < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], stop)
            groups[-1][2].append((i, a))
        else:
            groups.append([start, stop, [(i, a)]])
    regions = [_Region(start, stop, members) for start, stop, members in groups]
    for region in regions:
        for i, a in region.members:
            values[i] = region.pointer(a)
    return regions


def _library(code: str, options: tuple[str, ...], expressions: tuple[str, ...]) -> ctypes.CDLL:
    """The shared library of `code` with a table of `expressions`, compiled once per content."""
    table = "".join(f"    tk_emu::entry(&{e}),\n" for e in expressions)
    names = "".join(f'    "{e}",\n' for e in expressions)
    text = (
        f"{code}\n\nstatic const tk_emu::Entry tk_emu_entries[] = {{\n{table}}};\n"
        f"static const char* const tk_emu_names[] = {{\n{names}}};\n{EXPORTS}"
    )
    command = [CXX, *FLAGS, *options, "-include", str(HEADER)]
    key = hashlib.sha256("\0".join([HEADER.read_text(encoding="utf-8"), text, *command]).encode()).hexdigest()[:24]
    path = CACHE / f"{key}.so"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            source = Path(tmp) / "kernels.cpp"
            source.write_text(text, encoding="utf-8")
            done = subprocess.run(
                [*command, "-o", str(Path(tmp) / "k.so"), str(source)], capture_output=True, text=True
            )
            if done.returncode:
                raise CompileError(f"g++ could not compile {', '.join(expressions)}:\n{done.stderr[-6000:]}")
            os.replace(Path(tmp) / "k.so", path)  # atomic: another process may be compiling the same
    library = ctypes.CDLL(str(path))
    library.tk_emu_signature.restype = ctypes.c_char_p
    library.tk_emu_signature.argtypes = [ctypes.c_int]
    library.tk_emu_launch.restype = ctypes.c_int
    library.tk_emu_launch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p,
                                      ctypes.c_ulong]  # fmt: skip
    return library
