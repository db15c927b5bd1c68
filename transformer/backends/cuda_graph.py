"""CUDA graphs through CuPy: a step's kernels recorded once, then replayed in one launch.

    replay = capture(step)   # step() -> array; it reads inputs the caller rewrites in place
    ids[...] = next_ids      # the next step's inputs, written on the current stream
    out = replay()           # every kernel step() launched, again; `out` is the same array each time

Generation at batch 1 is launch-bound: a GPT-2 step is ~170 small kernels, each paying Python's
and the driver's cost of a launch. A graph pays it once.

`capture` runs `step` twice on a stream of its own: once to warm up (CuPy's pool gets the blocks
the step allocates, cuBLAS its workspace, kernels compile), once recorded. So `step` must launch
the same work whatever its inputs hold and never wait on the host: no `.get()`, no float() of a
device value, no host-side indexing by device values (a generation step reads its position from
device memory for this, see device_ops.decode_position_on_device).

Why a stream of its own: CuPy's memory pool keeps an arena per stream, so the blocks that the
step's intermediates had while it was recorded stay out of other work's reach (nothing else runs on
that stream), and each replay writes where the recording wrote. Events order a replay after the
current stream's work (the inputs' writes) and the current stream's later work after the replay.

What this module deliberately does not do: decide what to capture (transformer/model.py), or
capture anything that syncs with the host.
"""

from __future__ import annotations

from collections.abc import Callable

import cupy


class CapturedStep:
    """`step`'s kernels as one CUDA graph (see the module docstring); call it to replay."""

    def __init__(self, step: Callable[[], cupy.ndarray]):
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self._inputs_ready = cupy.cuda.Event(disable_timing=True)
        self._done = cupy.cuda.Event(disable_timing=True)
        self._follow(cupy.cuda.get_current_stream(), self._stream, self._inputs_ready)
        with self._stream:
            step()  # warm-up: allocations from this stream's arena, cuBLAS set up, kernels loaded
            self._stream.begin_capture()
            try:
                out = step()
            finally:
                graph = self._stream.end_capture()
        self._graph, self._out = graph, out

    @staticmethod
    def _follow(first, then, event) -> None:
        """Make stream `then` wait for the work queued so far on stream `first`."""
        event.record(first)
        then.wait_event(event)

    def __call__(self) -> cupy.ndarray:
        current = cupy.cuda.get_current_stream()
        self._follow(current, self._stream, self._inputs_ready)
        self._graph.launch(self._stream)
        self._follow(self._stream, current, self._done)
        return self._out

    def close(self) -> None:
        """Give the graph's memory back to the pool (the step must not be replayed after this)."""
        self._stream.synchronize()
        self._graph = self._out = None
        cupy.get_default_memory_pool().free_all_blocks(stream=self._stream)


def capture(step: Callable[[], cupy.ndarray]) -> CapturedStep:
    """Record `step`'s kernels as a CUDA graph: the Backend's `capture` on a GPU."""
    return CapturedStep(step)
