"""Reading input that a stop signal always interrupts (`tk chat` waiting for the next line).

A plain blocking read has a race: Python runs a signal's handler between bytecodes, but the C
code of `readline` goes on to the read() system call after its last check. A signal that lands
in those few instructions (more likely on a loaded machine, where the process is switched out
there) is noted by the C handler, and then read() waits for input with the handler not yet run:
Ctrl-C at `tk chat`'s prompt was lost about once in six tries under load.

`SignalReader` waits in select() on the input and on the signal wakeup descriptor
(`signal.set_wakeup_fd`), to which the C handler writes a byte, then reads only what is there.
A signal in the window ends the wait at once, and the handler runs as soon as Python code
resumes. Where no wakeup descriptor can be set (not the main thread), the wait wakes every
`POLL_S` instead.

What it deliberately does not do: text decoding or line limits beyond `readline`'s (the caller's),
or any terminal handling (the terminal's line discipline edits the line).
"""

from __future__ import annotations

import os
import select
import signal
import threading

POLL_S = 0.2  # without a wakeup descriptor: how late a signal in the window may be seen
CHUNK = 1 << 16

__all__ = ["SignalReader"]


class SignalReader:
    """`stream`'s lines (a binary file with a descriptor), each read a signal interrupts; a
    context manager that sets the wakeup descriptor for its duration and puts the old one back.

    >>> r, w = os.pipe(); _ = os.write(w, b"one\\ntwo"); os.close(w)
    >>> with SignalReader(os.fdopen(r, "rb")) as lines:
    ...     [lines.readline(10), lines.readline(2), lines.readline(10), lines.readline(10)]
    [b'one\\n', b'tw', b'o', b'']
    """

    def __init__(self, stream):
        self.stream = stream  # held: a file object freed would close the descriptor
        self.fd = stream.fileno()
        self.buffer = bytearray()
        self.ended = False
        self._wake: tuple[int, int] | None = None
        self._previous = -1

    def __enter__(self) -> SignalReader:
        if threading.current_thread() is threading.main_thread():
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            try:
                self._previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
                self._wake = (r, w)
            except ValueError:
                os.close(r)
                os.close(w)
        return self

    def __exit__(self, *exc) -> None:
        if self._wake is not None:
            signal.set_wakeup_fd(self._previous)
            for fd in self._wake:
                os.close(fd)
            self._wake = None

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def readline(self, limit: int = -1) -> bytes:
        """Bytes up to and including the next b"\\n", at most `limit` of them (all when -1); b"" at the end."""
        while True:
            end = self.buffer.find(b"\n")
            size = end + 1 if end >= 0 else len(self.buffer)
            if 0 <= limit < size:
                size = limit
            if end >= 0 or (0 <= limit <= len(self.buffer)) or (self.ended and self.buffer):
                line = bytes(self.buffer[:size])
                del self.buffer[:size]
                return line
            if self.ended:
                return b""
            self._fill()

    def _fill(self) -> None:
        """Wait for input or a signal; add what the input holds (end of input: `ended`)."""
        waits = [self.fd] if self._wake is None else [self.fd, self._wake[0]]
        ready, _, _ = select.select(waits, [], [], None if self._wake is not None else POLL_S)
        if self._wake is not None and self._wake[0] in ready:
            try:
                os.read(self._wake[0], CHUNK)  # the signal's byte; its handler runs once this returns
            except BlockingIOError:
                pass
        if self.fd in ready:
            chunk = os.read(self.fd, CHUNK)
            if chunk:
                self.buffer += chunk
            else:
                self.ended = True
