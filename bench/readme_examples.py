"""Run every `$ tk ...` example of README.md and docs/*.md in a scratch directory and show (or write) its real output.

    python bench/readme_examples.py            # print each command and its fresh output
    python bench/readme_examples.py --write    # also rewrite the example blocks of every page with them
    python bench/readme_examples.py --keep     # leave the scratch directory (its path is printed) to look at
    python bench/readme_examples.py --check    # exit 1 when a line differs from the page, timings aside
    python bench/readme_examples.py --check --quick  # only the blocks that use no model (CI: ~1 min)

Each fenced example block holds `$ command` lines, each followed by its output. All pages run in
one scratch directory, with `corpora/` linked in and `../shared` beside it (blocks that need
`../shared/data` are skipped when it is absent), stdout and stderr merged as a terminal shows them.
The pages run in the order of PAGES (README.md first, then the docs pages in the order the manual
lists them, then any other docs/*.md by name), and each page's blocks in their order on the page,
except that the block holding FIRST (the pipeline, which writes runs/demo for the others) runs
before everything; so an example may use any file that an earlier one wrote. A command that
appears again (README.md's tour repeats examples of the manual's pages) runs once: every place
shows that run's output, as a second training run into the same directory would be refused.

Outputs a page shortens with `...` lines keep their shape: the part before the first `...`
is the new output's head, the part after the last one its tail, and a part between two `...`
is found in the new output by its first line with the numbers masked. `# ...` after a command
is a comment. The train-model example gets Ctrl-C (SIGINT) once its log reaches
INTERRUPT_AT[command], as a user pressed it. The line of each page that starts with MACHINE_LINE
is rewritten to say what machine and versions the outputs came from; every page with example
outputs has one (a warning names a page without). An output with a Python traceback (tk's errors
are one line, so the code is broken, or another edit is half done) makes the run fail, and
`--write` then writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The pages, in the order their examples run: README.md's tour, then the manual in the order of
# docs/README.md's list (tokenizer.md writes the tok.safetensors that corpora.md uses).
PAGES = [
    "README.md",
    "docs/README.md",
    "docs/tokenizer.md",
    "docs/corpora.md",
    "docs/models.md",
    "docs/evaluating.md",
    "docs/explain.md",
    "docs/mpi.md",
    "docs/gpu.md",
    "docs/files.md",
    "docs/python-api.md",
    "docs/layout.md",
    "docs/development.md",
]
SHARED = REPO.parent / "shared"
MACHINE_LINE = "The example outputs below were produced by"
INTERRUPT_AT = {
    "tk train-model corpora/tiny_tales.txt -t runs/demo/tokenizer.safetensors -o runs/tales --steps 400": 211
}
FIRST = "tk pipeline corpora/tiny_tales.txt -o runs/demo"
# --quick runs only blocks none of whose commands trains, reads or serves a model (their outputs
# are exact on any machine, and they take seconds): what .ci/run checks. The rest needs the
# pipeline's few minutes of training first; `--check` alone runs everything.
MODEL_WORDS = ("runs/", "model", "train-model", "pipeline", "predict-next", "generate", "explain", "serve", "chat",
               "export-hf", "import-hf", "mpirun", "eval -m", "--device", ".npy", "tk info")  # fmt: skip


def blocks(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line indices inside each plain ``` block that starts with a `$ ` command."""
    found: list[tuple[int, int]] = []
    start: int | None = None  # first line inside the open block; -1 inside a block with a language
    for i, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if start is None:
            start = i + 1 if line.strip() == "```" else -1
            continue
        if start >= 0 and start < i and lines[start].startswith("$ "):
            found.append((start, i))
        start = None
    return found


def commands(block: list[str]) -> list[tuple[str, list[str]]]:
    """[(command line after '$ ', its output lines)]."""
    out: list[tuple[str, list[str]]] = []
    for line in block:
        if line.startswith("$ "):
            out.append((line[2:], []))
        else:
            out[-1][1].append(line)
    return out


def masked(line: str) -> str:
    return re.sub(r"\d[\d,.]*", "#", line).strip()


# A timing and what follows it: seconds, milliseconds, any rate per second.
_TIMING = re.compile(r"\d[\d,.]*\s*(?:ms|s|[\w ]*/s)\b")


def untimed(line: str) -> str:
    """`line` with its timings masked: what `--check` compares (ids, counts, messages and, on the
    machine the pages name, losses are the same in every run). Runs of spaces count as one: a
    table's column is as wide as its widest timing."""
    return " ".join(_TIMING.sub("<time>", line).split())


def differences(old: list[str], new: list[str]) -> list[str]:
    """The lines of a block that differ from the page's, timings aside, as `- old` / `+ new`."""
    if [untimed(line) for line in old] == [untimed(line) for line in new]:
        return []
    return [f"- {line}" for line in old if line not in new] + [f"+ {line}" for line in new if line not in old]


def excerpt(old: list[str], new: list[str]) -> list[str]:
    """`new` shortened the way `old` is (see the module docstring)."""
    if "..." not in old:
        return new
    parts: list[list[str]] = [[]]
    for line in old:
        if line == "...":
            parts.append([])
        else:
            parts[-1].append(line)
    result: list[str] = []
    head, *middle, tail = parts
    result += new[: len(head)]
    pos = len(head)
    for part in middle:
        result.append("...")
        if not part:
            continue
        key = masked(part[0])
        hit = next((i for i in range(pos, len(new)) if masked(new[i]) == key), None)
        if hit is None:
            hit = next((i for i in range(pos, len(new)) if masked(new[i]).split()[:2] == key.split()[:2]), pos)
        result += new[hit : hit + len(part)]
        pos = hit + len(part)
    result.append("...")
    if tail:
        result += new[-len(tail) :]
    return result


def run(command: str, cwd: Path, env: dict[str, str]) -> list[str]:
    """The merged output lines of one shell command (Ctrl-C at INTERRUPT_AT's step, if listed)."""
    bare = command.split("  #")[0].strip()
    proc = subprocess.Popen(
        ["bash", "-c", bare + " 2>&1"], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    stop_at = INTERRUPT_AT.get(bare)
    if stop_at is not None:
        log = cwd / bare.split(" -o ")[1].split()[0] / "log.jsonl"
        while proc.poll() is None:
            try:
                steps = [json.loads(line).get("step", 0) for line in log.read_text(encoding="utf-8").splitlines()[-3:]]
            except (OSError, ValueError):
                steps = []
            if steps and max(steps) >= stop_at:
                os.killpg(proc.pid, signal.SIGINT)
                break
            time.sleep(0.005)
    text, _ = proc.communicate()
    return text.rstrip("\n").splitlines()


def machine() -> str:
    import numpy

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{MACHINE_LINE} `python bench/readme_examples.py --write` on {cpu}, {cores} cores, "
        f"{platform.system()}, Python {platform.python_version()}, NumPy {numpy.__version__} "
        f"({time.strftime('%Y-%m-%d')}); timings and the model's numbers differ on other machines."
    )


def pages() -> list[Path]:
    """PAGES that exist, then any other docs/*.md by name."""
    listed = [REPO / name for name in PAGES]
    others = sorted(path for path in (REPO / "docs").glob("*.md") if path not in listed)
    return [path for path in listed if path.exists()] + others


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the example blocks of README.md and docs/*.md")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory and print its path")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when an output differs from its page, timings aside"
    )
    parser.add_argument("--quick", action="store_true", help="only the blocks that use no model (see MODEL_WORDS)")
    args = parser.parse_args()
    if args.quick and args.write:
        parser.error("--quick is for --check: --write rewrites every block")
    texts = {path: path.read_text(encoding="utf-8").splitlines() for path in pages()}
    found = [(path, k, a, b) for path, lines in texts.items() for k, (a, b) in enumerate(blocks(lines))]
    if args.quick:
        found = [
            f for f in found if not any(w in c for c, _ in commands(texts[f[0]][f[2] : f[3]]) for w in MODEL_WORDS)
        ]
    for path, lines in texts.items():
        if blocks(lines) and not any(line.startswith(MACHINE_LINE) for line in lines):
            print(
                f"warning: {path.relative_to(REPO)} has example outputs but no line starting with {MACHINE_LINE!r}",
                file=sys.stderr,
            )
    first = next((i for i, (path, _, a, b) in enumerate(found) if "$ " + FIRST in texts[path][a:b]), 0)
    order = [first] + [i for i in range(len(found)) if i != first] if found else []
    scratch = Path(tempfile.mkdtemp(prefix="tk-readme-"))
    work = scratch / "main"
    work.mkdir()
    (work / "corpora").symlink_to(REPO / "corpora")
    if SHARED.exists():
        (scratch / "shared").symlink_to(SHARED)
    shim = scratch / "bin"
    shim.mkdir()
    (shim / "tk").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tokenkit.cli.main "$@"\n', encoding="utf-8")
    (shim / "tk").chmod(0o755)
    # tokenkit comes from this interpreter's install (editable or not): the repo's tokenkit/ folder on
    # PYTHONPATH would shadow the mapped subpackages. Its bin/ (mpirun from the mpich wheel) on PATH.
    bin_dirs = os.pathsep.join([str(shim), str(Path(sys.executable).parent)])
    env = {**os.environ, "PATH": f"{bin_dirs}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    new_blocks: dict[tuple[Path, int], list[str]] = {}
    ran: dict[str, list[str]] = {}  # bare command -> its output, for commands that appear again
    broken: list[str] = []  # commands that printed a traceback: tk never does, so the tree is broken
    try:
        for i in order:
            path, k, a, b = found[i]
            block = texts[path][a:b]
            name = path.relative_to(REPO)
            if "../shared/data" in "\n".join(block) and not SHARED.exists():
                print(f"skipped (no ../shared/data): {name}: {block[0]}", file=sys.stderr)
                continue
            print(f"--- {name}, line {a + 1}", flush=True)
            rebuilt = []
            for command, old in commands(block):
                bare = command.split("  #")[0].strip()
                again = bare in ran
                if not again:
                    ran[bare] = run(command, work, env)
                    if any(line.startswith("Traceback (most recent call last)") for line in ran[bare]):
                        broken.append(f"{name}: {command}")
                shown = excerpt(old, ran[bare])
                if old and old[-1] == "" and (not shown or shown[-1] != ""):
                    shown.append("")  # the blank line that separates it from the next command
                note = "    [ran above; the same output]" if again else ""
                print(f"$ {command}{note}\n" + "\n".join(shown) + "\n", flush=True)
                rebuilt += ["$ " + command, *shown]
            new_blocks[path, k] = rebuilt
    finally:
        if args.keep:
            print(f"kept the scratch directory {work}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if broken:
        print("a traceback (tk prints one-line errors, so the code is broken or half edited) from:", file=sys.stderr)
        print("\n".join("  " + where for where in broken), file=sys.stderr)
        if args.write:
            print("nothing written", file=sys.stderr)
        return 1
    if args.check:
        changed = []
        for (path, k), rebuilt in new_blocks.items():
            a, b = blocks(texts[path])[k]
            diff = differences(texts[path][a:b], rebuilt)
            if diff:
                changed.append(f"{path.relative_to(REPO)}, line {a + 1}:\n" + "\n".join("  " + d for d in diff))
        if changed:
            print("outputs that differ from their pages (timings aside):\n" + "\n".join(changed), file=sys.stderr)
            return 1
        print("every example's output is its page's, timings aside", file=sys.stderr)
    if args.write:
        stamp = machine()
        for path, lines in texts.items():
            out: list[str] = []
            pos = 0
            for k, (a, b) in enumerate(blocks(lines)):
                out += lines[pos:a]
                out += new_blocks.get((path, k), lines[a:b])
                pos = b
            out += lines[pos:]
            out = [stamp if text.startswith(MACHINE_LINE) else text for text in out]
            if out != lines:
                path.write_text("\n".join(out) + "\n", encoding="utf-8")
                print(f"wrote {path.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
