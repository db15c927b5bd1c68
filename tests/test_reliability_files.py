"""Files a user loses or finds mixed (issue 20): each class of failure attacked from several sides.

- `--overwrite` keeps the old run whole until the new run's first checkpoint, the memory check
  counts activations and refuses before any file is touched, and a killed run leaves nothing
  that blocks the next command.
- An export directory (`tk export-hf`, `tk bpe-export`) is replaced as a whole: interrupted at
  any file, or killed at any moment, it holds the complete old export or the complete new one.
- `tk import-hf` refuses, in one line, a checkpoint it would import wrongly: an output head that
  differs from the embedding (transformers unties them), NaN or infinite weights.

Every model and corpus is tiny and made here; docs/files.md names these tests.
"""

from __future__ import annotations

import errno
import hashlib
import json
import random
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from conftest import random_model as tiny_model  # test_hf's random model, of other widths here
from test_hf import _write_checkpoint as write_checkpoint  # one hand-made safetensors writer
from test_run_dir import TINY as RUN_TINY
from test_run_dir import write_words  # the same corpus

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main
from tokenkit.common import FileError, atomic, atomic_dir, safetensors_file
from tokenkit.pipeline import checkpoint, trainlog
from tokenkit.pipeline.checkpoint import STAGED_DIR, load_model
from tokenkit.pipeline.rundir import RUN_FILES, RunDir
from tokenkit.pipeline.train_state import load_train_state
from tokenkit.transformer import GPT, GPTConfig, memory
from tokenkit.transformer.config import llama_config

TEXT = "Once upon a time, there was a brave fox named Max. He lived in a cave near the pond. " * 20
PROMPT = "Once upon a time, there was a"


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, *fragments: str) -> str:
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train([TEXT.encode()], vocab_size=300, special_tokens=["<|endoftext|>"])


# --- 3. silent wrong imports -------------------------------------------------------------------


def edit_config(hf: Path, **changes) -> None:
    config = json.loads((hf / "config.json").read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (hf / "config.json").write_text(json.dumps(config), encoding="utf-8")


@pytest.fixture
def hf_dir(tok, tmp_path, capsys) -> tuple[Path, dict[str, np.ndarray]]:
    """A transformers GPT-2 directory that tk exported, and its tensors (float32)."""
    tiny_model(tmp_path / "m.safetensors", tok)
    assert cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")[0] == 0
    return tmp_path / "hf", safetensors_file.read(tmp_path / "hf" / "model.safetensors")[0]


@pytest.mark.parametrize("tie", [True, None, False])  # said, left to the default (tied), said untied
def test_import_refuses_an_output_head_that_differs_from_the_embedding(hf_dir, tmp_path, capsys, tie):
    hf, tensors = hf_dir
    edit_config(hf, tie_word_embeddings=tie)
    wte = tensors["transformer.wte.weight"]
    out = tmp_path / "imported.safetensors"
    for head, fragment in [
        (wte + np.float32(0.5), "lm_head.weight differs from"),
        (wte[:, :-1], "lm_head.weight has shape"),
        (np.concatenate([wte, wte[:1]]), "lm_head.weight has shape"),
    ]:
        write_checkpoint(hf, {**{n: ("F32", a) for n, a in tensors.items()}, "lm_head.weight": ("F32", head)})
        one_line_error(*cli(capsys, "import-hf", hf, "-o", out)[::2], fragment, "ties")
        assert not out.exists()
    # a head that is the embedding, stored twice, is what tk's GPT computes
    write_checkpoint(hf, {**{n: ("F32", a) for n, a in tensors.items()}, "lm_head.weight": ("F32", wte.copy())})
    code, _, err = cli(capsys, "import-hf", hf, "-o", out)
    assert code == 0, err
    np.testing.assert_array_equal(checkpoint.load_model(out).model.params["wte.weight"], wte)


def _bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize(
    "name, dtype, bad",
    [
        ("transformer.h.1.mlp.c_fc.weight", "F32", np.nan),
        ("transformer.wpe.weight", "F16", np.inf),
        ("transformer.ln_f.bias", "BF16", -np.inf),
        ("transformer.h.0.attn.c_attn.bias", "F64", np.nan),
        ("transformer.wte.weight", "F32", np.inf),
        ("lm_head.weight", "F32", np.nan),  # a tied copy of the embedding, but for one value
    ],
)
def test_import_refuses_nan_or_inf_weights_naming_the_tensor(hf_dir, tmp_path, capsys, name, dtype, bad):
    hf, tensors = hf_dir
    tensors = {**tensors, "lm_head.weight": tensors["transformer.wte.weight"].copy()}
    poisoned = tensors[name].copy()
    poisoned.reshape(-1)[poisoned.size // 2] = bad
    tensors[name] = poisoned
    convert = {"F32": lambda a: a, "F16": lambda a: a.astype(np.float16), "F64": lambda a: a.astype(np.float64)}
    write_checkpoint(hf, {n: (dtype, convert[dtype](a) if dtype in convert else _bf16(a)) for n, a in tensors.items()})
    out = tmp_path / "imported.safetensors"
    what = "NaN" if np.isnan(bad) else "infinite"
    line = one_line_error(*cli(capsys, "import-hf", hf, "-o", out)[::2], name.removeprefix("transformer."), what)
    assert "1 of" in line  # how many values, so a user can tell one bad value from a broken file
    assert not out.exists()


def test_transformers_unties_a_differing_head_and_tk_refuses_it(tok, tmp_path, capsys):
    """What transformers does with a tied config and a differing lm_head in the file: it keeps the
    file's head (untied), so a model importing the embedding alone would predict otherwise."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=tok.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None
    )
    hf = tmp_path / "hf"
    transformers.GPT2LMHeadModel(config).save_pretrained(hf)
    tok.export_hf(hf)
    assert json.loads((hf / "config.json").read_text(encoding="utf-8")).get("tie_word_embeddings", True) is True
    tensors, meta = safetensors_file.read(hf / "model.safetensors")
    head = np.random.default_rng(1).normal(0.0, 0.3, tensors["transformer.wte.weight"].shape).astype(np.float32)
    (hf / "model.safetensors").write_bytes(safetensors_file.serialize({**tensors, "lm_head.weight": head}, meta))
    loaded = transformers.GPT2LMHeadModel.from_pretrained(hf).eval()
    np.testing.assert_array_equal(loaded.lm_head.weight.detach().numpy(), head)  # the file's head, untied
    assert not np.array_equal(loaded.transformer.wte.weight.detach().numpy(), head)
    capsys.readouterr()  # transformers' progress bars and its warning about the untied head
    one_line_error(
        *cli(capsys, "import-hf", hf, "-o", tmp_path / "m.safetensors")[::2], "lm_head.weight differs", "transformers"
    )
    assert not (tmp_path / "m.safetensors").exists()


# --- 2. export directories are replaced as a whole -----------------------------------------------

EXPORT_FILES = (
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.tiktoken",
    "tokenizer_tiktoken.json",
)


def export_state(d: Path) -> dict[str, str]:
    """The export files of `d` and their sha256."""
    return {name: hashlib.sha256((d / name).read_bytes()).hexdigest() for name in EXPORT_FILES if (d / name).exists()}


def users_files(d: Path) -> None:
    """What a user keeps beside an export (a clone of a model repository has both)."""
    (d / "notes.txt").write_text("mine", encoding="utf-8")
    (d / ".git").mkdir()
    (d / ".git" / "HEAD").write_text("ref: refs/heads/main\n", encoding="utf-8")


def assert_users_files(d: Path) -> None:
    assert (d / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert (d / ".git" / "HEAD").read_text(encoding="utf-8") == "ref: refs/heads/main\n"


def no_leftovers(d: Path) -> None:
    left = [p.name for p in d.parent.iterdir() if p.name.startswith(f".{d.name}.tk-")]
    assert left == [], left


def read_like_transformers(d: Path) -> tuple[int, int]:
    """(vocab, width) as a transformers loader sees them, checking config.json, the weights and
    tokenizer.json against each other: files of two exports never pass together."""
    config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    header, _ = safetensors_file.read_header(d / "model.safetensors")
    assert tuple(header["transformer.wte.weight"]["shape"]) == (config["vocab_size"], config["n_embd"])
    assert tuple(header["transformer.h.0.mlp.c_fc.weight"]["shape"]) == (config["n_embd"], 4 * config["n_embd"])
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    assert len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"]) == config["vocab_size"]
    return config["vocab_size"], config["n_embd"]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory) -> dict[str, tuple[Path, dict[str, str]]]:
    """Two tk models unlike in vocabulary and width, and the export each gives."""
    base = tmp_path_factory.mktemp("models")
    made = {}
    for name, vocab, width in (("old", 300, 32), ("new", 280, 64)):
        tok = Tokenizer.train([TEXT.encode()], vocab_size=vocab, special_tokens=["<|endoftext|>"])
        tiny_model(base / f"{name}.safetensors", tok, seed=vocab, d_model=width)
        assert main(["export-hf", str(base / f"{name}.safetensors"), "-o", str(base / f"{name}-hf")]) == 0
        made[name] = base / f"{name}.safetensors", export_state(base / f"{name}-hf")
    return made


class Interrupt:
    """`common.atomic.create_temp` failing at its (n+1)-th call, as a full disk or Ctrl-C would:
    the export interrupted after n files."""

    def __init__(self, monkeypatch, n: int, error: BaseException) -> None:
        self.left = n
        real = atomic.create_temp

        def create_temp(tmp):
            if self.left == 0:
                raise error
            self.left -= 1
            return real(tmp)

        monkeypatch.setattr(atomic, "create_temp", create_temp)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_export_hf_interrupted_at_each_file_leaves_the_old_export_whole(
    two_models, tmp_path, capsys, monkeypatch, error
):
    (old_model, old_state), (new_model, new_state) = two_models["old"], two_models["new"]
    d = tmp_path / "export"
    assert cli(capsys, "export-hf", old_model, "-o", d)[0] == 0
    users_files(d)
    for n in range(20):
        with monkeypatch.context() as m:
            Interrupt(m, n, error)
            code, _, err = cli(capsys, "export-hf", new_model, "-o", d)
        if code == 0:
            break
        if isinstance(error, OSError):
            one_line_error(code, err, "disk is full")
        else:
            assert code == 130, err
        assert export_state(d) == old_state, f"interrupted after {n} files"
        assert read_like_transformers(d) == (300, 32)
        assert_users_files(d)
        no_leftovers(d)
    assert n > 5  # every file of the export was interrupted once
    assert export_state(d) == new_state and read_like_transformers(d) == (280, 64)
    assert_users_files(d)
    no_leftovers(d)
    assert cli(capsys, "import-hf", d, "-o", tmp_path / "back.safetensors")[0] == 0


KILLED_EXPORTER = """
import sys
from tokenkit.pipeline import hf_export
d, models = sys.argv[1], sys.argv[2:]
hf_export.export_hf(models[0], d)
print("exporting", flush=True)
while True:
    for model in models[::-1] + models:
        hf_export.export_hf(model, d)
"""


def test_export_hf_killed_at_random_moments_is_all_old_or_all_new(two_models, tmp_path, capsys):
    """A process exporting the two models into one directory over and over, killed at random
    moments: the directory is always one whole export, the user's files come back, and the next
    export and import work."""
    (old_model, old_state), (new_model, new_state) = two_models["old"], two_models["new"]
    d = tmp_path / "export"
    assert cli(capsys, "export-hf", old_model, "-o", d)[0] == 0
    users_files(d)
    rng = random.Random(20)
    seen = set()
    for _ in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED_EXPORTER, str(d), str(old_model), str(new_model)], stdout=subprocess.PIPE
        )
        assert proc.stdout.readline() == b"exporting\n"
        time.sleep(rng.uniform(0.0, 0.4))
        proc.kill()
        proc.wait()
        state = export_state(d)
        assert state in (old_state, new_state)
        seen.add(read_like_transformers(d))
        assert cli(capsys, "import-hf", d, "-o", tmp_path / "back.safetensors", "--overwrite")[0] == 0
        atomic_dir.recover_replacements(d)  # what the next export does first
        assert_users_files(d)
        no_leftovers(d)
    assert cli(capsys, "export-hf", new_model, "-o", d)[0] == 0
    assert export_state(d) == new_state
    assert_users_files(d)


KILLED_MIDWAY = """
import os, sys
from pathlib import Path
from tokenkit.common import atomic_dir
d, when = Path(sys.argv[1]).resolve(), sys.argv[2]
if when == "aside":
    atomic_dir._exchange = lambda a, b: False  # a system without RENAME_EXCHANGE: two renames
real = os.rename
def rename(src, dst):
    real(src, dst)
    if when == "aside" and Path(src) == d:  # the old directory is aside, the new one not yet in
        os._exit(9)
    if when == "moving" and Path(src).parent == d:  # one of the user's entries is in the new directory
        os._exit(9)
os.rename = rename
atomic_dir.replace_files(d, {"a": b"new a", "b": b"new b"})
"""


@pytest.mark.parametrize("when", ["moving", "aside"])
def test_a_replacement_killed_midway_is_undone_by_the_next_one(tmp_path, when):
    """Killed while the user's files move to the new directory, or (without RENAME_EXCHANGE)
    between the two renames: the old set is whole or the directory briefly absent, never mixed,
    and the next call for the directory puts everything back before it starts."""
    d = tmp_path / "d"
    atomic_dir.replace_files(d, {"a": b"old a", "b": b"old b"})
    users_files(d)
    assert subprocess.run([sys.executable, "-c", KILLED_MIDWAY, str(d), when]).returncode == 9
    if when == "aside":
        assert not d.exists()
    else:
        assert (d / "a").read_bytes() == b"old a" and (d / "b").read_bytes() == b"old b"
        assert not (d / ".git").exists()  # moved across, and left there by the kill
    atomic_dir.recover_replacements(d)
    assert (d / "a").read_bytes() == b"old a" and (d / "b").read_bytes() == b"old b"
    assert_users_files(d)
    no_leftovers(d)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(atomic_dir, "_exchange", lambda a, b: False)
        assert atomic_dir.replace_files(d, {"a": b"new a"}, remove=["b", "c"]) == ["b"]
    assert sorted(p.name for p in d.iterdir()) == [".git", "a", "notes.txt"] and (d / "a").read_bytes() == b"new a"
    assert_users_files(d)
    no_leftovers(d)


def test_replace_files_keeps_the_directory_and_refuses_a_directory_in_the_way(tmp_path):
    d = tmp_path / "d"
    atomic_dir.replace_files(d, {"a": b"1"})
    d.chmod(0o750)
    link = tmp_path / "link"
    link.symlink_to(d)
    atomic_dir.replace_files(link, {"a": b"2"})
    assert link.is_symlink() and (d / "a").read_bytes() == b"2" and d.stat().st_mode & 0o777 == 0o750
    (d / "b").mkdir()
    with pytest.raises(FileError, match="is a directory where a file goes"):
        atomic_dir.replace_files(d, {"a": b"3", "b": b"3"})
    assert (d / "a").read_bytes() == b"2" and (d / "b").is_dir()
    no_leftovers(d)
    with pytest.raises(FileError, match="not a directory"):
        atomic_dir.replace_files(d / "a", {"x": b""})
    deep = tmp_path / "new" / "deeper" / "d"
    with pytest.MonkeyPatch.context() as m:
        Interrupt(m, 0, OSError(errno.ENOSPC, "No space left on device"))
        with pytest.raises(FileError, match="disk is full"):
            atomic_dir.replace_files(deep, {"x": b""})
    assert not (tmp_path / "new").exists()  # a failed first write leaves no directory it made


@pytest.mark.parametrize("fmt", ["gpt2", "hf", "tiktoken"])
def test_bpe_export_replaces_only_with_overwrite_and_as_one(fmt, tmp_path, capsys, monkeypatch):
    old, new = (Tokenizer.train([TEXT.encode()], vocab_size=v, special_tokens=["<|endoftext|>"]) for v in (300, 280))
    for name, tok in (("old", old), ("new", new)):
        tok.save(tmp_path / f"{name}.safetensors")
        assert (
            cli(capsys, "bpe-export", tmp_path / f"{name}.safetensors", "--format", fmt, "-o", tmp_path / name)[0] == 0
        )
    d = tmp_path / "old"
    old_state, new_state = export_state(d), export_state(tmp_path / "new")
    users_files(d)
    line = one_line_error(*cli(capsys, "bpe-export", tmp_path / "new.safetensors", "--format", fmt, "-o", d)[::2])
    assert "--overwrite" in line and all(name in line for name in old_state)
    assert export_state(d) == old_state
    argv = ("bpe-export", tmp_path / "new.safetensors", "--format", fmt, "-o", d, "--overwrite")
    for n in range(len(old_state)):
        with monkeypatch.context() as m:
            Interrupt(m, n, OSError(errno.ENOSPC, "No space left on device"))
            one_line_error(*cli(capsys, *argv)[::2], "disk is full")
        assert export_state(d) == old_state
        no_leftovers(d)
    assert cli(capsys, *argv)[0] == 0
    assert export_state(d) == new_state
    assert_users_files(d)
    no_leftovers(d)
    # another format beside it is not a replacement: no flag needed, nothing removed
    other = "hf" if fmt != "hf" else "gpt2"
    assert cli(capsys, "bpe-export", tmp_path / "new.safetensors", "--format", other, "-o", d)[0] == 0
    assert new_state.items() <= export_state(d).items()


# --- 1. --overwrite keeps the old run until the new one's first checkpoint -------------------------

TINY = [*RUN_TINY, "--workers", "1"]  # test_run_dir's tiny model, in one process


@pytest.fixture(scope="module")
def words(tmp_path_factory) -> Path:
    return write_words(tmp_path_factory.mktemp("corpus") / "words.txt")


@pytest.fixture(scope="module")
def old_run(words, tmp_path_factory) -> Path:
    """A finished run as a user has it: its own tokenizer, tokens, model, state and log."""
    run = tmp_path_factory.mktemp("old") / "run"
    assert main(["train-model", str(words), "-o", str(run), *TINY, "--steps", "6", "--eval-interval", "3"]) == 0
    return run


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def a_users_run(old_run: Path, d: Path) -> dict[str, bytes]:
    shutil.copytree(old_run, d)
    (d / "notes.txt").write_text("mine", encoding="utf-8")
    return snapshot(d)


def new_run_argv(words: Path, d: Path, *extra: str) -> list[str]:
    return ["train-model", str(words), "-o", str(d), "--overwrite", *TINY, "--seed", "2", *extra]


def test_overwrite_that_needs_more_memory_than_is_free_is_one_line_before_any_file_is_touched(
    words, old_run, tmp_path, capsys, monkeypatch
):
    """Parameters that fit, activations that do not: refused up front, naming both and what is free."""
    d = tmp_path / "run"
    before = a_users_run(old_run, d)
    big = ["--batch-size", "64", "--context-length", "64"]
    config = GPTConfig(vocab_size=300, context_length=64, d_model=32, n_layers=1, n_heads=2)
    free = memory.estimate_bytes(config, training=True, workers=1) + (1 << 20)  # the weights' state and 1 MB
    monkeypatch.setattr(memory, "available_bytes", lambda: free)
    for argv in (
        new_run_argv(words, d, *big),
        ["pipeline", str(words), "-o", str(d), "--overwrite", *TINY, "--vocab-size", "300", *big],
    ):
        line = one_line_error(*cli(capsys, *argv)[::2], "activations of a batch of 64 x 64 tokens", "available")
        assert f"than the {free / 1e9:,.1f} GB available" in line
        assert snapshot(d) == before
    monkeypatch.undo()
    assert cli(capsys, *new_run_argv(words, d, "--steps", "2", "--eval-interval", "2", *big))[0] == 0  # it does fit


@pytest.mark.parametrize(
    "config, rows",
    [
        (GPTConfig(vocab_size=300, context_length=64, d_model=64, n_layers=2, n_heads=4), 16),
        (GPTConfig(vocab_size=512, context_length=128, d_model=32, n_layers=2, n_heads=8), 8),  # tiled attention
        (GPTConfig(vocab_size=300, context_length=64, d_model=64, n_layers=2, n_heads=4, norm="post", bias=False), 16),
        (llama_config(vocab_size=300, context_length=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2), 16),
        (llama_config(vocab_size=300, context_length=64, d_model=64, n_layers=2, n_heads=8, n_kv_heads=1), 16),
    ],
)
def test_training_memory_estimate_covers_the_measured_peak_within_a_factor_of_two(config, rows):
    """tracemalloc's peak over building the model and optimizer and two training steps with
    evaluation, against `estimate_bytes`: never below, at most twice."""
    from tokenkit.transformer import AdamW
    from tokenkit.transformer.parallel import DataParallel

    rng = np.random.default_rng(0)
    x, y = (rng.integers(0, config.vocab_size, (rows, config.context_length)) for _ in range(2))
    tracemalloc.start()
    try:
        model = DataParallel(GPT(config, seed=0), workers=1)
        opt = AdamW(model.params, lr=1e-3)
        for _ in range(2):
            _, grads = model.loss_and_grads(x, y, batch_rows=rows)
            opt.step(grads, lr=1e-3)
            model.loss(x, y, batch_rows=rows)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimate = memory.estimate_bytes(config, training=True, workers=1, batch_rows=rows)
    assert peak <= estimate <= 2 * peak, f"estimate {estimate / 1e6:.2f} MB, measured peak {peak / 1e6:.2f} MB"


class FailAtStep:
    """DataParallel.loss_and_grads failing at `step` (1-based): MemoryError, or a NaN loss."""

    def __init__(self, monkeypatch, step: int, how: str) -> None:
        from tokenkit.transformer.parallel import DataParallel

        real, calls = DataParallel.loss_and_grads, [0]

        def loss_and_grads(model, x, y, **kw):
            calls[0] += 1
            if calls[0] == step and how == "memory":
                raise MemoryError
            loss, grads = real(model, x, y, **kw)
            return (float("nan") if calls[0] == step else loss), grads

        monkeypatch.setattr(DataParallel, "loss_and_grads", loss_and_grads)


def run_files(d: Path) -> dict[str, bytes]:
    """The run's files (what a reader of the run sees) and the user's."""
    return {name: (d / name).read_bytes() for name in (*RUN_FILES, "notes.txt") if (d / name).exists()}


def test_overwrite_keeps_the_old_run_whole_until_the_new_runs_first_checkpoint(
    words, old_run, tmp_path, capsys, monkeypatch
):
    d = tmp_path / "run"
    before = a_users_run(old_run, d)
    checkpointed = ["--steps", "8", "--eval-interval", "4"]
    for how, fragment in (("memory", "out of memory"), ("nan", "keeps the run it held")):
        with monkeypatch.context() as m:
            FailAtStep(m, 3, how)
            one_line_error(*cli(capsys, *new_run_argv(words, d, *checkpointed))[::2], fragment)
        assert snapshot(d) == before, how
    # the pipeline retraining its tokenizer (another vocabulary) over a pipeline's directory
    p = tmp_path / "pipe"
    flags = ["pipeline", str(words), "-o", str(p), *TINY, "--steps", "4", "--eval-interval", "2", "-n", "2"]
    assert cli(capsys, *flags, "--vocab-size", "300")[0] == 0
    pipe_before = snapshot(p)
    with monkeypatch.context() as m:
        FailAtStep(m, 1, "memory")
        one_line_error(*cli(capsys, *flags, "--vocab-size", "280", "--overwrite")[::2], "out of memory")
    assert snapshot(p) == pipe_before
    # past its first checkpoint the directory is the new run's, whole: model, state, log, tokens
    with monkeypatch.context() as m:
        FailAtStep(m, 6, "memory")
        one_line_error(*cli(capsys, *new_run_argv(words, d, *checkpointed))[::2], "out of memory")
    assert_new_run(d, first_checkpoint=4)
    assert (d / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert cli(capsys, "train-model", "--resume", d, "-q")[0] == 0
    assert load_train_state(d / "train_state.safetensors").step == 8


def assert_new_run(d: Path, first_checkpoint: int) -> None:
    """`d` holds the new run (seed 2) at a checkpoint, every file of it, none of the old one's."""
    state = load_train_state(d / "train_state.safetensors")
    model, tok, meta = load_model(d)
    assert state.train_config["seed"] == 2 and meta["provenance"]["train_config"]["seed"] == 2
    assert state.step >= first_checkpoint and meta["step"] <= state.step
    assert (
        tok.fingerprint() == state.tokenizer.fingerprint() == Tokenizer.load(d / "tokenizer.safetensors").fingerprint()
    )
    tokens = json.loads((d / "tokens.json").read_text(encoding="utf-8"))["tokens.npy"]
    assert tokens["tokenizer_fingerprint"] == tok.fingerprint()
    sessions = [r for r in trainlog.read_log(d / "log.jsonl") if r["type"] == "session"]
    assert sessions[0]["step"] == 0
    assert not (d / STAGED_DIR).exists()


KILL_FLAGS = [
    *("--n-layers", "2", "--n-heads", "4", "--d-model", "128", "--context-length", "64", "--batch-size", "16"),
    *("--eval-batches", "1", "--steps", "20", "--eval-interval", "10"),
]


def _ready(when: str, d: Path, before: dict[str, bytes]) -> bool:
    """The new run has started writing, or (when="checkpointed") its first checkpoint is in."""
    if when == "checkpointed":
        return not (d / STAGED_DIR).exists() and (d / "model.safetensors").read_bytes() != before["model.safetensors"]
    return (d / STAGED_DIR).exists() or (d / "log.jsonl").read_bytes() != before["log.jsonl"]


def test_sigkill_during_an_overwrite_leaves_the_old_run_or_the_new_first_checkpoint(words, old_run, tmp_path):
    """A retrain over a run, killed as it starts, at random moments, and just after its first
    checkpoint: the directory holds the old run byte for byte or the new run's checkpoint, never a
    mix; the dead process's lock, temps and staged files do not block the next command, which
    finds everything whole."""
    rng = random.Random(5)
    outcomes = []
    for attempt, when in enumerate(("started", "random", "random", "checkpointed")):
        d = tmp_path / f"run{attempt}"
        a_users_run(old_run, d)
        before = run_files(d)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenkit.cli.main", *new_run_argv(words, d, *KILL_FLAGS)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not _ready(when, d, before):
            time.sleep(0.001)
        if when == "random":
            time.sleep(rng.uniform(0.0, 0.5))
        proc.kill()
        proc.wait()
        assert proc.returncode == -9, "the run ended before it was killed"
        assert (d / ".tk.lock").exists()  # a dead process's lock, left behind
        if not (d / STAGED_DIR / ".commit").exists() and run_files(d) == before:
            outcomes.append("old")
        else:
            with RunDir(d):  # what the next command does first, holding the lock
                pass
            assert_new_run(d, first_checkpoint=10)
            outcomes.append("new")
        result = subprocess.run(
            [sys.executable, "-m", "tokenkit.cli.main", "train-model", "--resume", str(d), "-q"],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
        assert load_train_state(d / "train_state.safetensors").step == (6 if outcomes[-1] == "old" else 20)
        if outcomes[-1] == "old":
            assert run_files(d) == before  # finished already: nothing to do, nothing changed
        assert not (d / STAGED_DIR).exists() and not list(d.glob(".*.tmp")) and not (d / ".tk.lock").exists()
        assert (d / "notes.txt").read_text(encoding="utf-8") == "mine"
    print("outcomes:", outcomes)
    assert outcomes[0] == "old" and outcomes[-1] == "new", outcomes


KILLED_IN_THE_SWITCH = """
import os, sys
from tokenkit.common import staging
def finish(directory, staged, note):  # killed after moving two of the new run's files in
    for name in note["move"][:2]:
        os.replace(staged / name, directory / name)
    os._exit(9)
staging.finish_staged = finish
from tokenkit.cli.main import main
main(sys.argv[1:])
"""


def test_a_kill_inside_the_switch_is_finished_by_the_next_command(words, old_run, tmp_path, capsys):
    d = tmp_path / "run"
    a_users_run(old_run, d)
    argv = new_run_argv(words, d, "--steps", "4", "--eval-interval", "2")
    assert subprocess.run([sys.executable, "-c", KILLED_IN_THE_SWITCH, *argv]).returncode == 9
    assert (d / STAGED_DIR / ".commit").exists()  # two files moved, the rest still staged
    load_model(d)  # a reader that takes no lock reads one whole model file, the old or the new
    assert cli(capsys, "train-model", "--resume", d, "-q")[0] == 0  # the lock's recovery moved the rest in
    assert_new_run(d, first_checkpoint=2)
    assert load_train_state(d / "train_state.safetensors").step == 4
    assert (d / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_overwrite_under_mpi_reads_the_staged_tokens(words, old_run, tmp_path):
    """Ranks other than 0 open the new run's token files where they wait for its first checkpoint,
    and the files are those of the one-process run with as many shards."""
    from test_mpi import _mpirun  # mpirun's path, or a skip without mpi4py or mpirun

    other = tmp_path / "other.txt"
    other.write_text(words.read_text(encoding="utf-8")[:9000][::-1], encoding="utf-8")  # new tokens, new tokenizer
    runs = []
    for ranks in (2, 1):
        d = tmp_path / f"run{ranks}"
        a_users_run(old_run, d)
        argv = new_run_argv(other, d, "--steps", "4", "--eval-interval", "2")
        argv[argv.index("--workers") + 1] = str(2 // ranks)
        mpi = [_mpirun(), "-n", "2"] if ranks == 2 else []
        result = subprocess.run(
            [*mpi, sys.executable, "-m", "tokenkit.cli.main", *argv], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        assert_new_run(d, first_checkpoint=2)
        runs.append(d)
    for name in ("model.safetensors", "train_state.safetensors", "tokens.npy"):
        assert (runs[0] / name).read_bytes() == (runs[1] / name).read_bytes(), name
