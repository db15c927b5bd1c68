"""Files read for more than is asked of them, or past what they can hold (issue 36), each class
attacked from several sides:

2. A model file used only for its tokenizer or its description (`tk info`, `encode -t`, `decode
   -t`, `serve -t`) is read for those alone: its header and its `tokenizer.*` tensors, never the
   weights. Checked on a model of ~340 MB of weights (a sparse file: no disk used): the
   commands' peak memory and the bytes they read stay far below the weights, and their output
   is the one the tokenizer's own file, or a full load, gives; the tokenizer's tensors are
   bounded as a tokenizer file is, from the header.
3. A model larger than the memory available is refused in one line from its header, before a
   weight is read (`predict-next`, `explain`, `export-hf`, `--init-from`, `import-hf`, `serve`),
   quickly and without growing; a model that fits is mapped from its file, not copied.
8. transformers' small JSON files (config.json, tokenizer_config.json) are bounded at
   `readfile.HF_CONFIG_LIMIT` (4 MiB) and refused past it before a byte is read; those tk never
   reads (generation_config.json, special_tokens_map.json) cost nothing at any size; a
   tokenizer.json or vocab.json is bounded at `readfile.TOKENIZER_JSON_LIMIT` (128 MiB), and its
   parse by the values it would make (`library_files.TOKENIZER_JSON_ITEMS`) and by its first
   bytes, each refused before the text is decoded.

The commands run in child processes (`run_many`) under a 20 s alarm and a cap on their address
space: before these fixes they read gigabytes or grew until the cap, and here that fails the test
instead of taking the machine. docs/files.md names these tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from capped import one_line, run_capped
from conftest import HILL_WORDS, random_model

from tokenkit.bpe import Tokenizer
from tokenkit.bpe.library_files import TOKENIZER_JSON_ITEMS
from tokenkit.cli.main import main
from tokenkit.common import readfile, safetensors_file
from tokenkit.pipeline import checkpoint, train_state
from tokenkit.transformer import GPTConfig
from tokenkit.transformer.config import param_shapes

MB = 1 << 20
SECONDS = 20
# ~340 MB of float32 weights over a 300-token vocabulary: big enough that reading them shows, small
# enough for a sparse file anywhere
BIG = GPTConfig(vocab_size=300, context_length=32, d_model=1536, n_layers=3, n_heads=8)
# ~3.2 GB: more than a child capped at 2 GiB above its size can hold (`run_many`)
HUGE = GPTConfig(vocab_size=300, context_length=32, d_model=4096, n_layers=4, n_heads=32)


def run_many(calls: list[list]) -> list[tuple]:
    """`capped.DRIVER`'s six results for each argv, the first (the warm-up) included."""
    results = run_capped(calls, SECONDS)
    assert results[0][0] == 0, f"the warm-up failed: {results[0][2][-2000:]}"
    return results


def sparse_model(path: Path, like: Path, config: GPTConfig) -> int:
    """A model file at `path` with `like`'s metadata and embedded tokenizer but `config`'s
    weights, all zeros and never written (a sparse file: the size without the disk). Returns the
    weights' bytes."""
    st_tensors, meta = safetensors_file.read(like)
    meta["config"] = json.dumps(config.to_dict(), sort_keys=True)
    kept = {name: a for name, a in st_tensors.items() if name.startswith(checkpoint.TOKENIZER_PREFIX)}
    zeros = {name: np.broadcast_to(np.float32(0), shape) for name, shape in param_shapes(config).items()}
    return _sparse(path, {**zeros, **kept}, meta, kept)


def _sparse(path: Path, tensors: dict, meta: dict, written: dict) -> int:
    """Header for `tensors`, the bytes of `written` alone at their offsets, the rest holes."""
    head = safetensors_file.header_bytes(tensors, meta)
    offset = 0
    with open(path, "wb") as f:
        f.write(head)
        for name in sorted(tensors):  # header_bytes' order
            if name in written:
                f.seek(len(head) + offset)
                f.write(np.ascontiguousarray(written[name]).tobytes())
            offset += tensors[name].nbytes
        f.truncate(len(head) + offset)
    return sum(a.nbytes for name, a in tensors.items() if name not in written)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    """A corpus, a tokenizer, a small model over it and its transformers export, and a model of
    ~340 MB of (sparse) weights with the same tokenizer embedded."""
    root = tmp_path_factory.mktemp("sizes")
    rng = np.random.default_rng(5)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(HILL_WORDS, size=10)) for _ in range(300)) + "\n", encoding="utf-8")
    tok = Tokenizer.train([corpus.read_bytes()], vocab_size=BIG.vocab_size, special_tokens=["<|endoftext|>"])
    tok.save(root / "tok.safetensors")
    random_model(root / "small.safetensors", tok)
    assert main(["export-hf", str(root / "small.safetensors"), "-o", str(root / "hf")]) == 0
    assert main(["bpe-export", str(root / "tok.safetensors"), "-o", str(root / "gpt2")]) == 0
    weights = sparse_model(root / "big.safetensors", root / "small.safetensors", BIG)
    assert weights == 4 * BIG.n_params() > 300 * MB
    return {
        "root": root,
        "corpus": corpus,
        "tok": root / "tok.safetensors",
        "small": root / "small.safetensors",
        "big": root / "big.safetensors",
        "hf": root / "hf",
        "gpt2": root / "gpt2",
    }


# --- 2. a model file used for its tokenizer or its description ------------------------------------


def test_a_model_used_for_its_tokenizer_or_description_is_not_read_whole(base):
    weights = 4 * BIG.n_params()
    text = "the fox ran up a hill and down again"
    ids = " ".join(str(i) for i in Tokenizer.load(base["tok"]).encode(text))
    calls = {
        "encode -t": (["encode", "-t", base["tok"], text], ["encode", "-t", base["big"], text]),
        "decode -t": (["decode", "-t", base["tok"], ids], ["decode", "-t", base["big"], ids]),
        "info": (["info", base["small"]], ["info", base["big"]]),
    }
    for label, (small, big) in calls.items():  # each in its own child: a peak is the process's
        (_, reference, *_), (code, out, err, _, grew, got) = run_many([small, big])
        assert code == 0, f"{label}: {err[-2000:]}"
        assert grew < weights / 8 and got < weights / 16, f"{label}: grew {grew / MB:.0f} MB, read {got / MB:.0f} MB"
        if label != "info":  # the model's tokenizer gives what the tokenizer's own file gives
            assert out == reference, label
        else:
            rows = dict(line.split(":", 1) for line in out.splitlines())
            loaded = checkpoint.load_model(base["big"])  # the reference: every weight loaded (mapped)
            assert rows["parameters"].strip() == f"{sum(int(p.size) for p in loaded.model.params.values()):,}"
            assert rows["config"].strip() == json.dumps(loaded.model.config.to_dict())
            assert rows["vocab size"].strip().startswith(f"{BIG.vocab_size} (tokenizer ")
            assert "model + embedded tokenizer" in rows["format"]


def test_an_embedded_tokenizer_past_a_tokenizers_bound_is_one_line_before_reading(base, tmp_path):
    """A model file's `tokenizer.*` tensors are bounded as a tokenizer file is (1 GiB), from the header."""
    tensors, meta = safetensors_file.read(base["small"])
    huge = readfile.TOKENIZER_LIMIT + 1
    tensors["tokenizer.vocab_bytes"] = np.broadcast_to(np.uint8(0), (huge,))
    model = tmp_path / "m.safetensors"
    _sparse(model, tensors, meta, {k: v for k, v in tensors.items() if k != "tokenizer.vocab_bytes"})
    calls = [["info", model], ["encode", "-t", model, "the fox"], ["predict-next", "-m", model, "the fox"]]
    for result in run_many([["info", base["tok"]], *calls])[1:]:
        one_line(result, str(model), "embedded tokenizer", "bytes, more than a tokenizer can (1 GiB at most)")
        _, _, _, seconds, grew, got = result
        assert seconds < 5 and grew < 32 * MB and got < 32 * MB


def _serve_peak(*argv) -> int:
    """The peak resident size (bytes) of `tk serve ARGV` once it listens; then it is stopped."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkit", "serve", *map(str, argv), "--no-browser", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving http"), (line, proc.stderr.read() if proc.poll() is not None else "")
        with open(f"/proc/{proc.pid}/status", encoding="ascii") as f:
            return next(int(row.split()[1]) * 1024 for row in f if row.startswith("VmHWM:"))
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak from /proc")
def test_serve_with_a_model_file_as_its_tokenizer_does_not_read_the_weights(base):
    alone = _serve_peak("-t", base["tok"])
    with_model = _serve_peak("-t", base["big"])
    assert with_model - alone < 4 * BIG.n_params() / 8, f"{(with_model - alone) / MB:.0f} MB more"


# --- 3. a model larger than memory, and one that fits ---------------------------------------------


def _huge_hf(base, where: Path) -> None:
    """A transformers directory of HUGE's shape: the small export's tokenizer, a sparse checkpoint."""
    shutil.copytree(base["hf"], where)
    hf = json.loads((where / "config.json").read_text(encoding="utf-8"))
    hf.update(n_embd=HUGE.d_model, n_inner=4 * HUGE.d_model, n_layer=HUGE.n_layers, n_head=HUGE.n_heads)
    (where / "config.json").write_text(json.dumps(hf), encoding="utf-8")
    shapes = param_shapes(GPTConfig.from_dict({**HUGE.to_dict(), "bias": True}))
    tensors = {"transformer." + name: np.broadcast_to(np.float32(0), shape) for name, shape in shapes.items()}
    _sparse(where / "model.safetensors", tensors, {"format": "pt"}, {})


def test_a_model_larger_than_memory_is_one_line_before_its_weights_are_read(base, tmp_path):
    huge = tmp_path / "huge.safetensors"
    assert sparse_model(huge, base["small"], HUGE) > 3 << 30
    _huge_hf(base, tmp_path / "huge-hf")
    calls = {
        "predict-next": ["predict-next", "-m", huge, "the fox"],
        "explain": ["explain", "-m", huge, "the fox"],
        "export-hf": ["export-hf", huge, "-o", tmp_path / "out-hf"],
        "--init-from": ["train-model", base["corpus"], "--init-from", huge, "-o", tmp_path / "run", "--steps", "1"],
        "import-hf": ["import-hf", tmp_path / "huge-hf", "-o", tmp_path / "imported.safetensors"],
        "serve": ["serve", huge, "--no-browser", "--port", "0"],
    }
    results = run_many([["predict-next", "-m", base["small"], "the fox"], *calls.values()])[1:]
    for label, result in zip(calls, results, strict=True):
        line = one_line(result, "GB of memory", "more than the", "available")
        assert str(huge) in line or "huge-hf" in line, f"{label}: {line}"
        _, _, _, seconds, grew, got = result
        assert seconds < 5 and grew < 64 * MB and got < 64 * MB, f"{label}: {seconds:.1f} s, grew {grew / MB:.0f} MB"
    assert not (tmp_path / "out-hf").exists() and not (tmp_path / "run").exists()
    assert not (tmp_path / "imported.safetensors").exists()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the memory from /proc")
def test_a_model_that_fits_is_mapped_not_copied(base):
    """The weights are views of the file mapped copy-on-write: the process's own memory grows by
    a fraction of them (before: by all of them), and their values are the file's."""
    probe = textwrap.dedent(
        """
        import sys
        from tokenkit.pipeline import checkpoint

        def anon():
            with open("/proc/self/status") as f:
                return next(int(r.split()[1]) * 1024 for r in f if r.startswith("RssAnon:"))

        before = anon()
        model = checkpoint.load_model(sys.argv[1]).model
        print(anon() - before, sum(p.nbytes for p in model.params.values()))
        """
    )
    grew, weights = map(int, subprocess.check_output([sys.executable, "-c", probe, str(base["big"])]).split())
    assert weights == 4 * BIG.n_params()
    assert grew < weights / 8, f"the load took {grew / MB:.0f} MB of its own for {weights / MB:.0f} MB of weights"
    mapped = checkpoint.load_model(base["small"]).model.params
    read, _ = safetensors_file.read(base["small"])
    for name, value in mapped.items():
        assert not value.flags.owndata and np.array_equal(value, read[name]), name
        value += 1  # copy-on-write: the process's copy changes, never the file
    assert all(np.array_equal(read[n], safetensors_file.read(base["small"])[0][n]) for n in mapped)


def _sparse_state(path: Path, like: Path, config: GPTConfig) -> int:
    """A train_state.safetensors at `path` for `config`'s weights and AdamW moments, all zeros and
    never written, with `like`'s embedded tokenizer; returns its tensors' bytes."""
    from tokenkit.pipeline import data
    from tokenkit.transformer import AdamW

    small = checkpoint.load_model(like)
    params = {name: np.broadcast_to(np.float32(0), shape) for name, shape in param_shapes(config).items()}
    kept = AdamW(small.model.params, lr=1e-3).state_dict()  # AdamW's state: its step and betas,
    moments = {k: v for k, v in kept.items() if k.partition(".")[0] not in ("m", "v")}
    moments.update({f"{kind}.{name}": zeros for name, zeros in params.items() for kind in ("m", "v")})  # two moments
    state = train_state.TrainState(
        step=3,
        params=params,
        optimizer=moments,
        rng=data.rng_to_array(np.random.default_rng(0)),
        best_val_loss=1.5,
        best_step=2,
        train_config={"steps": 10},
        model_config=config.to_dict(),
        data={"corpus": "c"},
        tokenizer=small.tokenizer,
    )
    staged = path.with_suffix(".staged")
    tensors, meta = train_state.train_state_tensors(state)
    written = {n: a for n, a in tensors.items() if a.ndim == 0 or any(a.strides)}  # the zeros are broadcast: holes
    _sparse(staged, tensors, meta, written)
    staged.rename(path)
    return sum(a.nbytes for a in tensors.values())


def test_a_train_state_is_described_from_its_header_and_refused_before_reading_when_too_large(base, tmp_path):
    """`tk info STATE` reads no tensor; `--resume` of a state larger than memory is one line before
    a tensor is read (its weights and AdamW moments: three times the model)."""
    state = tmp_path / "big" / checkpoint.STATE_FILE
    state.parent.mkdir()
    nbytes = _sparse_state(state, base["small"], BIG)
    assert nbytes > 3 * 4 * BIG.n_params()
    huge = tmp_path / "huge" / checkpoint.STATE_FILE
    huge.parent.mkdir()
    assert _sparse_state(huge, base["small"], HUGE) > 9 << 30
    resume = ["train-model", "--resume", huge.parent]
    (_, _, _, _, _, _), info, refused = run_many([["info", base["small"]], ["info", state], resume])
    code, out, err, _, grew, got = info
    assert code == 0, err[-2000:]
    assert grew < nbytes / 16 and got < nbytes / 16, f"grew {grew / MB:.0f} MB, read {got / MB:.0f} MB"
    rows = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in out.splitlines())}
    assert rows["parameters"] == f"{BIG.n_params():,}" and rows["training step"] == "3 of 10"
    assert rows["best val loss"] == "1.5000 at step 2"
    line = one_line(refused, str(huge), "GiB, more than the", "available")
    assert "weights and optimizer state" in line
    _, _, _, seconds, grew, got = refused
    assert seconds < 5 and grew < 64 * MB and got < 64 * MB, f"{seconds:.1f} s, grew {grew / MB:.0f} MB"


# --- 8. JSON files bounded by what they can hold --------------------------------------------------


def _sparse_file(path: Path, size: int) -> None:
    if path.exists():
        path.unlink()
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: no disk used, and reading it whole would allocate the lot


def test_transformers_small_json_files_past_their_bound_are_one_line_before_reading(base, tmp_path):
    over = readfile.HF_CONFIG_LIMIT + 1
    calls, expected = [], []
    for name in ("config.json", "tokenizer_config.json"):
        for command in ("bpe-import", "import-hf"):
            where = tmp_path / f"{command}-{name}"
            shutil.copytree(base["hf"], where)
            _sparse_file(where / name, over)
            calls.append([command, where, "-o", where / "out.safetensors"])
            expected.append(where / name)
    results = run_many([["info", base["tok"]], *calls])[1:]
    for path, result in zip(expected, results, strict=True):
        one_line(result, str(path), f"{over:,} bytes, more than", "4 MiB at most")
        _, _, _, seconds, grew, got = result
        assert seconds < 5 and grew < 32 * MB and got < 32 * MB, f"{path}: {seconds:.1f} s, grew {grew / MB:.0f} MB"
        assert not (path.parent / "out.safetensors").exists()


def test_transformers_json_files_tk_never_reads_cost_nothing_at_any_size(base, tmp_path):
    where = tmp_path / "hf"
    shutil.copytree(base["hf"], where)
    for name in ("generation_config.json", "special_tokens_map.json"):
        _sparse_file(where / name, 20 << 30)
    results = run_many(
        [["info", base["tok"]], ["bpe-import", where, "-o", tmp_path / "t.safetensors"]]
        + [["import-hf", where, "-o", tmp_path / "m.safetensors"]]
    )[1:]
    for code, _, err, seconds, grew, _ in results:
        assert code == 0 and seconds < 10 and grew < 64 * MB, err[-2000:]


def test_a_tokenizer_json_is_bounded_by_its_size_its_first_bytes_and_its_values(base, tmp_path):
    """Each refused in one line before the text is decoded: past 128 MiB (sparse), zeros within
    it (what json.loads says of the first byte), and a structure of more values than any real
    tokenizer.json makes (`[[],[],...]`: 20 times its size as Python objects)."""
    cases = {}
    for name in ("tokenizer.json", "vocab.json"):
        past, zeros, lists = (tmp_path / kind / name for kind in ("past", "zeros", "lists"))
        for path in (past, zeros, lists):
            path.parent.mkdir(exist_ok=True)
        _sparse_file(past, readfile.TOKENIZER_JSON_LIMIT + 1)
        _sparse_file(zeros, 64 * MB)
        lists.write_bytes(b"[" + b"[]," * TOKENIZER_JSON_ITEMS + b"[]]")
        for path, fragments in (
            (past, (f"{readfile.TOKENIZER_JSON_LIMIT + 1:,} bytes, more than", "128 MiB at most")),
            (zeros, ("not valid JSON (Expecting value: line 1 column 1 (char 0))",)),
            (lists, (f"{TOKENIZER_JSON_ITEMS + 1:,} JSON values or more",)),
        ):
            merges = [base["gpt2"] / "merges.txt"] if name == "vocab.json" else []
            cases[path] = (["bpe-import", path, *merges, "-o", path.parent / "o.safetensors"], fragments)
    results = run_many([["info", base["tok"]], *(argv for argv, _ in cases.values())])[1:]
    for (path, (_, fragments)), result in zip(cases.items(), results, strict=True):
        one_line(result, str(path), *fragments)
        _, _, _, seconds, grew, _ = result
        size = min(path.stat().st_size, 1 << 30)
        assert seconds < 5, f"{path}: {seconds:.1f} s"
        assert grew < (2 * size if "lists" in str(path) else 32 * MB) + 16 * MB, f"{path}: grew {grew / MB:.0f} MB"


def test_real_tokenizer_files_stay_far_inside_the_bounds(base):
    """The bounds' own reference: tk's export of a tokenizer makes a small share of the values and
    bytes allowed (a 300-token tokenizer.json here; GPT-2's: 2 MB and 100k values of the 128 MiB
    and 8M), and reads back as the tokenizer it was."""
    from tokenkit.common import jsonsafe

    data = (base["hf"] / "tokenizer.json").read_bytes()
    assert jsonsafe.items(data) < TOKENIZER_JSON_ITEMS / 100 and len(data) < readfile.TOKENIZER_JSON_LIMIT / 100
    text = "the fox ran up a hill"
    assert Tokenizer.from_hf(base["hf"]).encode(text) == Tokenizer.load(base["tok"]).encode(text)
