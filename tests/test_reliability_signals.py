"""Ctrl-C (and SIGTERM) at any moment: one line, exit 128 + N, no traceback, nothing left behind.

A terminal sends SIGINT to the whole foreground process group, workers included. Each command
here runs as a real process in a session of its own and gets the signal on its whole group
(os.killpg) after a random delay drawn per seed: during the interpreter's start, the imports,
click's parsing, the worker pools (bpe-train's counting, encode -f, train-model's forked shard
workers) or after the end. Every run must end with exit code 130 (143 for SIGTERM), or 0 when it
finished first; stderr holds at most that one line (`interrupted`, `terminated (SIGTERM)`, or
training's `interrupted at step ...`), never "Traceback", "Process ForkProcess" or
"KeyboardInterrupt"; no temp file (`.*.tk-*.tmp`) or lock is left; and within a few seconds no
process of the group is alive (read from /proc: a zombie that PID 1 does not reap counts as gone).

One moment is outside tk's reach: the interpreter's own start, before the first line of tokenkit
runs (Python's `site`, which in an editable install imports setuptools' finder: ~20 ms). A signal
then either kills Python before it installed its handler (no output, killed by SIGINT, which a
shell reports as 130) or is Python's own "Fatal Python error: init_import_site". Those outcomes
are accepted only for delays under START_S and only with no frame of tk's code in the report.

Under `mpirun -n 2` (skipped without mpirun or mpi4py) the launcher forwards the signal to each
rank (each in a group of its own): the same one line and exit code, no "BAD TERMINATION" or
"MPI_ABORT" banner; an error on one rank is its one line and exit code 1. Delays there start
after the ranks' interpreters started (a rank dying in its start leaves the others waiting in
MPI_Init: the launcher's behaviour, not tk's).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_MODEL  # the tiny model of runs that only start, stop or repeat
from test_children import _random_words_text  # the same corpus maker

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; process groups")

REPO = Path(__file__).resolve().parents[1]
TK = [sys.executable, "-m", "tokenkit.cli.main"]
TK_SCRIPT = Path(sys.executable).parent / "tk"
START_S = 0.25  # the interpreter's start lies well within this, even on a loaded machine
GONE_WITHIN_S = 3.0
FORBIDDEN = (
    "Traceback",
    "Process ForkProcess",
    "KeyboardInterrupt",
    "Exception ignored",
    "BAD TERMINATION",
    "MPI_ABORT",
    "MPI_Abort",
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("signals")
    big = root / "big.txt"  # ~3 MB: bpe-train and encode -f with 2 workers take ~2-3 s
    big.write_text(_random_words_text(480_000, seed=0))
    small = root / "small.txt"  # one piece: encoded in the parent, then training forks its workers
    small.write_text(_random_words_text(40_000, seed=1))
    tok = root / "tok.safetensors"
    proc = subprocess.run(
        [*TK, "bpe-train", str(small), "--vocab-size", "400", "--special", "<|endoftext|>", "-o", str(tok), "-q"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return {"big": big, "small": small, "tok": tok}


def _command(files, out: Path, name: str, workers: int = 2) -> list:
    """`name`'s flags, writing into `out`, `workers` processes (per rank under mpirun)."""
    w = ["--workers", str(workers), "-q"]
    training = ["--steps", "3000", "--eval-interval", "100", *TINY_MODEL, *w]
    return {
        "bpe-train": ["bpe-train", files["big"], "--vocab-size", "600", "-o", out / "t.safetensors", *w],
        "encode": ["encode", "-t", files["tok"], "-f", files["big"], "-o", out / "ids.npy", *w],
        "train-model": ["train-model", files["small"], "-t", files["tok"], "-o", out / "run", *training],
        "pipeline": ["pipeline", files["small"], "-o", out / "run", "--vocab-size", "300", *training],
    }[name]


# --- processes, read from /proc -----------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a live or zombie process, None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[2])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _alive_where(match) -> list[int]:
    pids = (int(e) for e in os.listdir("/proc") if e.isdigit())
    return [pid for pid in pids if (st := _stat(pid)) is not None and st[0] != "Z" and match(pid, st)]


def _assert_all_gone(match, what: str) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := _alive_where(match)) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in left:  # leave nothing behind for the next test, then fail
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes {left} of {what} outlived it: {[_cmdline(p) for p in left]}"


# --- one interrupted run ------------------------------------------------------------------------


def _interrupt(cmd: list, delay: float, tmp_path: Path, sig: int = signal.SIGINT) -> tuple[int, str]:
    """Start `cmd` in a session of its own, send `sig` to its process group after `delay`
    seconds; returns (exit code, stderr) once every process of the group is gone."""
    err_path = tmp_path / f"stderr-{time.monotonic_ns()}.txt"
    with open(err_path, "wb") as err:  # a file, not a pipe: a straggler holding a pipe would block the reading
        proc = subprocess.Popen(
            [str(a) for a in cmd],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        time.sleep(delay)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # finished (and reaped) already
            pass
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _assert_all_gone(lambda pid, st: st[1] == proc.pid, f"{cmd[:4]}'s process group")
    return code, err_path.read_text(errors="replace")


def _started_before_tk(code: int, err: str, delay: float, sig: int) -> bool:
    """Whether the signal came before tk's entry function ran: in the interpreter's start
    (Python's `site`), or while it imported the entry module itself (no frame of a tokenkit
    function in the report, only module-level imports)."""
    if delay >= START_S:
        return False
    if code == -sig and not err:  # before Python installed its handler: the default action
        return True
    site = code == 1 and err.startswith("Fatal Python error: init_import_site")
    imports = code == -sig and err.startswith("Traceback")
    if not (site or imports) or not err.rstrip().endswith("KeyboardInterrupt"):
        return False
    frames = re.findall(r'File "([^"]*)", line \d+, in (\S+)', err)
    ours = [name for path, name in frames if path.startswith(str(REPO)) or path.endswith("/bin/tk")]
    return set(ours) <= {"<module>"}


def _assert_stopped_well(code: int, err: str, out: Path, sig: int, delay: float, what: str) -> None:
    if _started_before_tk(code, err, delay, sig):
        return
    context = f"{what} after {delay:.3f} s ({signal.Signals(sig).name}): exit code {code}, stderr:\n{err[-2000:]}"
    assert code in (0, 128 + sig), context
    for word in FORBIDDEN:
        assert word not in err, context
    if code:
        lines = err.splitlines()
        expected = "interrupted" if sig == signal.SIGINT else f"terminated ({signal.Signals(sig).name})"
        assert len(lines) == 1, context
        assert lines[0] == expected or re.fullmatch(r"interrupted at step \d+/\d+; state saved in .*", lines[0]), (
            context
        )
    left = [p for p in out.rglob("*") if re.search(r"\.tk-.*\.tmp$", p.name) or p.name == ".tk.lock"]
    assert not left, f"{context}\nleft behind: {left}"


def _delays(n: int, seed: str, high: float = 1.5) -> list[float]:
    """n delays: one at once (the exec), one within the imports, the rest anywhere in [0, high]."""
    rng = random.Random(seed)
    return [0.0, rng.uniform(0.05, 0.5)] + [rng.uniform(0.0, high) for _ in range(n - 2)]


@pytest.mark.parametrize(
    "command, n, sig",
    [
        ("bpe-train", 5, signal.SIGINT),
        ("encode", 5, signal.SIGINT),
        ("train-model", 4, signal.SIGINT),
        ("pipeline", 4, signal.SIGINT),
        ("bpe-train", 2, signal.SIGTERM),
        ("encode", 2, signal.SIGTERM),
        ("train-model", 3, signal.SIGTERM),
    ],
    ids=lambda v: v.name if isinstance(v, signal.Signals) else str(v),
)
def test_a_signal_at_a_random_moment_is_one_line_and_leaves_nothing(files, tmp_path, command, n, sig):
    for k, delay in enumerate(_delays(n, seed=f"{command} {sig}")):
        out = tmp_path / f"out{k}"
        out.mkdir()
        code, err = _interrupt([*TK, *_command(files, out, command)], delay, tmp_path, sig)
        _assert_stopped_well(code, err, out, sig, delay, f"tk {command}")


def test_the_tk_script_is_one_line_from_its_first_moment(files, tmp_path):
    """The installed entry point: its handlers come before click and NumPy are imported."""
    if not TK_SCRIPT.exists():
        pytest.skip(f"no tk script beside {sys.executable} (pip install -e .)")
    for k, delay in enumerate([0.0, 0.05, 0.1, 0.2, 0.35, 0.6]):
        out = tmp_path / f"out{k}"
        out.mkdir()
        code, err = _interrupt([TK_SCRIPT, *_command(files, out, "bpe-train")], delay, tmp_path)
        _assert_stopped_well(code, err, out, signal.SIGINT, delay, "the tk script")


def test_signals_held_reach_the_parent_after_and_never_the_worker_forked_meanwhile():
    """What each pool does around its forks (common.processes.signals_held): a Ctrl-C held back
    while a worker is forked reaches the parent right after; the worker, which gets its own
    while blocked, ignores it once die_with_parent ran (a KeyboardInterrupt in it would be a
    "Process ForkProcess" traceback)."""
    from tokenkit.common.processes import die_with_parent, signals_held

    read, write = os.pipe()
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            pid = os.fork()
            if pid == 0:  # the worker
                try:
                    os.close(read)
                    os.kill(os.getpid(), signal.SIGINT)  # blocked: it waits
                    die_with_parent(os.getppid())  # ignores SIGINT, then unblocks
                    os.write(write, b"alive")
                finally:
                    os._exit(0)
            os.kill(os.getpid(), signal.SIGINT)  # the parent's own: held until the block ends
            time.sleep(0.05)
    os.close(write)
    assert os.read(read, 16) == b"alive"
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0


# --- under mpirun ---------------------------------------------------------------------------------


def _mpirun() -> str:
    from test_mpi import _mpirun as found  # mpirun's path, or a skip without mpi4py or mpirun

    return found()


def _ranks_of(out: Path):
    return lambda pid, st: str(out) in _cmdline(pid) and "tokenkit.cli.main" in _cmdline(pid)


@pytest.mark.parametrize("command", ["bpe-train", "encode", "train-model"])
def test_ctrl_c_under_mpirun_is_one_line_and_the_code_tk_meant(files, tmp_path, command):
    mpirun = _mpirun()
    rng = random.Random(command)
    for k, delay in enumerate([rng.uniform(0.4, 1.2), rng.uniform(1.2, 2.5)]):
        out = tmp_path / f"out{k}"
        out.mkdir()
        code, err = _interrupt([mpirun, "-n", "2", *TK, *_command(files, out, command, workers=1)], delay, tmp_path)
        _assert_all_gone(_ranks_of(out), "mpirun")
        _assert_stopped_well(code, err, out, signal.SIGINT, delay, f"mpirun -n 2 tk {command}")


def test_an_error_on_one_rank_is_its_one_line_and_exit_code_1(files, tmp_path):
    """The special token sits in the last rank's share only: rank 1 says so, rank 0 (waiting for
    its ids) learns it and unwinds; both exit 1 without MPI_Abort."""
    mpirun = _mpirun()
    text = tmp_path / "special.txt"
    text.write_bytes(files["big"].read_bytes() + b" The end.<|endoftext|>")
    cmd = [mpirun, "-n", "2", *TK, "encode", "-t", str(files["tok"]), "-f", str(text), "-o", "ids.npy", "-q"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "special token '<|endoftext|>'" in lines[0], proc.stderr
    assert lines[0].startswith("error: ") and lines[0].endswith("(rank 1 of 2)")
    for word in FORBIDDEN:
        assert word not in proc.stdout + proc.stderr
    assert os.listdir(tmp_path) == ["special.txt"]  # no ids.npy, no temp file


_LATE_SIGNAL = """
import os, signal, sys, time
from contextlib import contextmanager
from tokenkit.cli.main import entry
from tokenkit.common import mpi

agreed = mpi.end_together
signalled = int(sys.argv[1])

@contextmanager
def then_a_signal(comm, describe):  # the ranks agree the command is over; then one rank gets a Ctrl-C
    with agreed(comm, describe):
        yield
    if comm.Get_rank() == signalled:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)

mpi.end_together = then_a_signal
sys.argv = ["tk", *sys.argv[2:]]
entry()
"""


@pytest.mark.parametrize("rank", [0, 1])
def test_a_signal_after_the_ranks_agreed_they_finished_is_too_late_to_count(files, tmp_path, rank):
    """The moment CI once met at random: rank 1 interrupted after the last agreement, while rank 0
    was already exiting 0, ended the job 130 without a word. Once every rank agreed the command
    is over, its code stands: 0, silent, the output written."""
    mpirun = _mpirun()
    script = tmp_path / "late.py"
    script.write_text(_LATE_SIGNAL)
    out = tmp_path / "ids.npy"
    cmd = [mpirun, "-n", "2", sys.executable, str(script), str(rank)]
    cmd += ["encode", "-t", str(files["tok"]), "-f", str(files["small"]), "-o", str(out), "-q"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stdout + proc.stderr
    assert out.is_file()


def test_a_signal_delivered_again_wakes_a_main_thread_blocked_in_a_read():
    """An interrupt raised inside a finalizer cannot propagate, so `cli.main` delivers it again
    from a timer thread. Found under load in `tk chat`: if the main thread has gone on to block
    in a read (waiting for the next line), only a real signal wakes it; `_thread.interrupt_main`
    only flagged it, and tk waited for a line that never came."""
    from tokenkit.cli import main as cli_main

    def stop(signum, frame):
        raise KeyboardInterrupt

    def too_late(signum, frame):
        raise TimeoutError

    read, write = os.pipe()
    previous = signal.signal(signal.SIGINT, stop), signal.signal(signal.SIGALRM, too_late)
    try:
        signal.alarm(5)  # the guard: a read the delivery does not wake ends here
        start = time.monotonic()
        cli_main._deliver_again(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            os.read(read, 1)  # nothing is ever written: only a signal ends this
        assert time.monotonic() - start < 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGALRM, previous[1])
        os.close(read)
        os.close(write)
