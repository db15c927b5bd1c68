"""A run directory's evaluations, `eval.json`: what `tk eval -m RUN_DIR` measured, one entry per corpus.

`EvalRecord.open(model, inputs, ...)` names the corpus and, for a run directory (a model file
records nothing), reads the eval.json there before anything is scored; `write(score, ...)` then
adds the corpus's entry, or replaces the one an earlier evaluation of the same corpus left,
under the run directory's lock (pipeline/rundir.py: one process per run directory), reading the
file again there and writing it whole through the one atomic writer (common/atomic.py).

Recording is a side effect of an evaluation, never a reason to lose it: when the file cannot be
written (the run directory is in use by a training run, is read-only, or its eval.json is
damaged), `write` says so in one warning and the evaluation stands. A damaged eval.json (not
tk's, not JSON, too big, not a regular file) is never replaced: tk does not overwrite what it
cannot read; `open` warns about it at once, before the scoring.

The file:

    {"format": "tokenkit.evaluations", "version": 1,
     "evaluations": {KEY: {"corpus": [...], "glob", "text_field", "binary", "specials",
                           "tokens", "bytes", "loss", "bits_per_byte", "perplexity", "documents",
                           "skipped_documents", "stride", "context", "step", "utc"}}}

KEY names the corpus as a command line would: its inputs as absolute paths ("-" for stdin), then
the flags that change what is read (`--glob`, `--text-field`, `--binary`, `--allow-special`,
`--specials-as-text`). `step` is the model file's step when it was evaluated; `utc` when.
`evaluations(run_dir)` lists the entries for the page (`views.training_view`).

What it deliberately does not do: score (pipeline/evaluate.py) or read a corpus (bpe.corpus).
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tokenkit.common import FileError, jsonsafe, readfile
from tokenkit.pipeline import checkpoint, rundir
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.names import SPECIALS

FORMAT = "tokenkit.evaluations"
VERSION = 1
MAX_EVAL_FILE = 4 << 20  # an entry is ~500 bytes: thousands of corpora
MAX_ITEMS = 200_000
ADVICE = "move it away: tk eval keeps a run directory's evaluations there"
FLAGS = {"allow": "--allow-special", "text": "--specials-as-text"}  # the special-token policies' flags
# an entry's fields as the page shows them: numbers (finite, else None) and the rest
NUMBERS = ("tokens", "bytes", "loss", "bits_per_byte", "perplexity", "documents", "stride", "context", "step")


def corpus_key(
    inputs: Iterable[str | os.PathLike],
    *,
    glob: str | None = None,
    text_field: str | None = None,
    binary: bool = False,
    specials: str = "refuse",
) -> str:
    """The corpus as a command line names it: the inputs made absolute, then the reading flags.

    >>> corpus_key(["/data/a b.txt", "-"], glob="*.txt", specials="allow")
    "'/data/a b.txt' - --glob '*.txt' --allow-special"
    """
    words = [shlex.quote(p if p == "-" else os.path.abspath(p)) for p in map(str, inputs)]
    if glob is not None:
        words += ["--glob", shlex.quote(glob)]
    if text_field is not None:
        words += ["--text-field", shlex.quote(text_field)]
    if binary:
        words.append("--binary")
    if specials in FLAGS:
        words.append(FLAGS[specials])
    return " ".join(words)


def read_evaluations(path: Path) -> dict[str, Any]:
    """The entries of an eval.json by key ({} when there is none); one-line PipelineError when it is
    damaged (not a regular file, over MAX_EVAL_FILE, not JSON, not tk's evaluations)."""
    if not os.path.lexists(path):
        return {}
    try:
        raw = readfile.read_bytes(path, MAX_EVAL_FILE, "a run's evaluations file", ADVICE)
        doc = jsonsafe.loads(raw, str(path), max_items=MAX_ITEMS)
    except FileError as err:
        raise PipelineError(f"{err}; {ADVICE}" if ADVICE not in str(err) else str(err)) from None
    ours = isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("version") == VERSION
    entries = doc.get("evaluations") if ours else None
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise PipelineError(f"{path} is not an evaluations file this tk reads ({FORMAT} version {VERSION}); {ADVICE}")
    return entries


def evaluations(run_dir: Path) -> tuple[list[dict[str, Any]], str | None]:
    """(the run's evaluations, sorted by corpus, each {"corpus": KEY, NUMBERS..., "utc"} with finite
    numbers or None; why they cannot be read, or None) for the page."""
    try:
        entries = read_evaluations(Path(run_dir) / checkpoint.EVAL_FILE)
    except PipelineError as err:
        return [], str(err)
    rows = []
    for key in sorted(entries):
        entry = entries[key]
        row: dict[str, Any] = {"corpus": key}
        for name in NUMBERS:
            value = entry.get(name)
            row[name] = value if type(value) in (int, float) and math.isfinite(value) else None
        row["utc"] = entry["utc"] if isinstance(entry.get("utc"), str) else None
        rows.append(row)
    return rows, None


@dataclass
class EvalRecord:
    """Where `tk eval -m MODEL` records its result: the run directory's eval.json under `key`, or
    nowhere (`run_dir` None: a model file, or a run directory whose eval.json is damaged)."""

    run_dir: Path | None
    key: str
    reading: dict[str, Any]
    step: int | None = None

    @classmethod
    def open(
        cls,
        model: str | os.PathLike,
        inputs: Iterable[str | os.PathLike],
        glob: str | None = None,
        text_field: str | None = None,
        binary: bool = False,
        policy: Mapping[str, Any] | None = None,
        *,
        warn: Callable[[str], None] = lambda message: None,
    ) -> EvalRecord:
        """The record of an evaluation of `model` on the corpus `inputs` read with these flags
        (`policy`: the special-token policy, one of names.SPECIALS). A run directory's eval.json
        is read now: a damaged one is said in one `warn` line, before any scoring, and left alone."""
        inputs = [str(p) for p in inputs]
        specials = next((name for name, p in SPECIALS.items() if p == dict(policy or SPECIALS["refuse"])), "refuse")
        reading = {"corpus": inputs, "glob": glob, "text_field": text_field, "binary": binary, "specials": specials}
        key = corpus_key(inputs, glob=glob, text_field=text_field, binary=binary, specials=specials)
        if not Path(model).is_dir():
            return cls(None, key, reading)
        run_dir = Path(model)
        reading["corpus"] = [p if p == "-" else os.path.abspath(p) for p in inputs]
        try:
            read_evaluations(run_dir / checkpoint.EVAL_FILE)
        except PipelineError as err:
            warn(f"{err}; this evaluation will not be recorded")
            return cls(None, key, reading)
        return cls(run_dir, key, reading, _model_step(run_dir))

    def write(
        self,
        score,
        *,
        stride: int,
        context: int,
        say: Callable[[str], None] = lambda line: None,
        warn: Callable[[str], None] = lambda message: None,
    ) -> bool:
        """Add this corpus's entry (a `pipeline.evaluate.Score` scored with `stride` windows of
        `context`) to the run's eval.json; True when it was written. `say` is told where, `warn`
        why not (in use by another process, not writable, damaged since `open`)."""
        if self.run_dir is None:
            return False
        path = self.run_dir / checkpoint.EVAL_FILE
        entry = {**self.reading, **score.to_dict(), "stride": stride, "context": context, "step": self.step}
        entry["utc"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            with rundir.RunDir(self.run_dir):  # one process per run directory: read, add, write under its lock
                entries = read_evaluations(path)
                entries[self.key] = entry
                checkpoint.write_json(path, {"format": FORMAT, "version": VERSION, "evaluations": entries})
        except rundir.RunDirBusy as err:
            warn(
                f"{self.run_dir} is in use by {err.who} (a training run, or another tk eval): this evaluation "
                f"is not recorded in {path}; run tk eval again when it is done"
            )
            return False
        except PipelineError as err:
            warn(f"{err}; this evaluation is not recorded")
            return False
        say(f"recorded in {path}")
        return True


def _model_step(run_dir: Path) -> int | None:
    """The step of the run's model file (what is evaluated), None when its header does not say."""
    try:
        step = checkpoint.decode_metadata(checkpoint.read_header(run_dir / checkpoint.MODEL_FILE, "model file"))
    except PipelineError:
        return None
    return step.get("step") if type(step.get("step")) is int else None
