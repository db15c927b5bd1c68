"""common/signal_reads.py: a wait for input that a signal always ends (tk chat's Ctrl-C at the prompt)."""

import os
import random
import subprocess
import sys
import threading

from tokenkit.common.signal_reads import SignalReader

# `_thread.interrupt_main` from another thread marks SIGINT as arrived and writes the wakeup
# descriptor, as the C handler does, but brings no EINTR: the state of a signal that landed just
# before read() was entered, where a plain readline waits on.
WAIT_ON_A_NOTED_SIGNAL = """
import _thread, os, sys, threading
r, w = os.pipe()
threading.Timer(0.1, _thread.interrupt_main).start()
try:
    READ
except KeyboardInterrupt:
    print("interrupted")
"""


def run_child(read: str) -> str:
    code = WAIT_ON_A_NOTED_SIGNAL.replace("READ", read)
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3).stdout
    except subprocess.TimeoutExpired:
        return "waited"


def test_a_signal_noted_just_before_the_wait_ends_it():
    plain = "os.fdopen(r, 'rb').readline()"
    fixed = (
        "from tokenkit.common.signal_reads import SignalReader\n    with SignalReader(os.fdopen(r, 'rb')) as s:\n"
        "        s.readline()"
    )
    assert run_child(plain) == "waited"  # the race's state: a plain read never sees it
    assert run_child(fixed) == "interrupted\n"


def test_the_old_wakeup_descriptor_is_put_back():
    import signal

    r, w = os.pipe()
    with SignalReader(os.fdopen(r, "rb")):
        ours = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(ours)
        assert ours != -1
    assert signal.set_wakeup_fd(-1) == -1
    os.close(w)


def test_lines_are_readline_s_for_any_chunks_and_limits():
    rng = random.Random(0)
    for _ in range(200):
        data = bytes(rng.choice(b"ab\n") for _ in range(rng.randint(0, 40)))
        limits = [rng.choice([-1, 1, 2, 3, 5, 50]) for _ in range(60)]
        r, w = os.pipe()
        feeder = threading.Thread(target=_feed, args=(w, data, rng.randint(1, 7)))
        feeder.start()
        with SignalReader(os.fdopen(r, "rb")) as lines:
            got = [lines.readline(n) for n in limits]
        feeder.join()
        plain = __import__("io").BytesIO(data)
        assert got == [plain.readline(n) for n in limits]


def _feed(fd: int, data: bytes, size: int) -> None:
    for i in range(0, len(data), size):
        os.write(fd, data[i : i + size])
    os.close(fd)


def test_off_the_main_thread_it_polls():
    r, w = os.pipe()
    out = []

    def read():
        with SignalReader(os.fdopen(r, "rb")) as lines:
            out.append(lines._wake)
            out.append(lines.readline())

    thread = threading.Thread(target=read)
    thread.start()
    os.write(w, b"hi\n")
    thread.join(5)
    os.close(w)
    assert out == [None, b"hi\n"]
