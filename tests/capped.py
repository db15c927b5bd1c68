"""Commands run in one child process whose address space is capped at 2 GiB above its size, each
under an alarm: for each argv, (exit code or "hung" or "raised", stdout, stderr, seconds, growth of
the peak resident size in bytes, bytes read by read()). test_reliability_hangs reads the first
three; test_reliability_sizes all six, after a first argv run as a warm-up whose imports and caches
the others' growth does not count."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, resource, signal, sys, time, traceback
    from tokenkit.cli.main import main

    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))

    class Hung(BaseException):
        pass

    def hung(signum, frame):
        raise Hung

    def read_bytes():
        with open("/proc/self/io") as f:
            return int(next(line for line in f if line.startswith("rchar:")).split()[1])

    signal.signal(signal.SIGALRM, hung)
    results = []
    for argv in json.load(sys.stdin):
        out, err = io.StringIO(), io.StringIO()
        peak, got, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, read_bytes(), time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            signal.alarm(int(sys.argv[1]))
            try:
                code = main(argv)
            except Hung:
                code = "hung"
            except BaseException:
                code = "raised"
                traceback.print_exc()
            finally:
                signal.alarm(0)
        seconds, got = time.perf_counter() - start, read_bytes() - got
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) * 1024
        results.append([code, out.getvalue(), err.getvalue(), seconds, grew, got])
    json.dump(results, sys.__stdout__)
    """
)


def run_capped(calls: list[list], seconds: int) -> list[tuple]:
    """DRIVER's six results for each argv of `tk ARGV`, in one child process."""
    argvs = [[str(a) for a in argv] for argv in calls]
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(seconds)],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=seconds * len(argvs) + 60,
    )
    assert proc.returncode == 0, f"the child died ({proc.returncode}): {proc.stderr[-3000:]}"
    return [tuple(r) for r in json.loads(proc.stdout)]


def one_line(result: tuple, *fragments: str) -> str:
    """The one error line of a result that exited 1, holding each fragment."""
    code, err = result[0], result[2]
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), f"exit {code}:\n{err[-3000:]}"
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
