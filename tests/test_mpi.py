"""`mpirun -n N tk bpe-train` / `tk encode -f` give the files one process gives, byte for byte.

The MPI runs are subprocesses (`mpirun -n N python -m tokenkit.cli.main ...`); they skip when mpirun or
mpi4py is missing (`pip install -e '.[mpi]'`). The splitting and the count packing are also
tested in this process, without MPI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tokenkit.bpe.distributed import _blocks, pack_counts, split_files, unpack_counts
from tokenkit.bpe.pretokenize import count_chunks
from tokenkit.cli.main import main

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _mpirun() -> str:
    pytest.importorskip("mpi4py", reason="pip install -e '.[mpi]'")
    exe = shutil.which("mpirun")
    if exe is None:
        pytest.skip("no mpirun on PATH (pip install -e '.[mpi]')")
    return exe


def _tk_on_ranks(n: int, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [_mpirun(), "-n", str(n), sys.executable, "-m", "tokenkit.cli.main", *args]
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[Path]:
    """Three files, ~3 MB: English-like words and punctuation, accents, a stretch of CJK without
    spaces (no safe cut for a while), CRLF lines, and an empty file."""
    rng = np.random.default_rng(10)
    words = [
        "the",
        "fox",
        "Once",
        "upon",
        "a",
        "time",
        "naïve",
        "café",
        "1984",
        "it's",
        "don't",
        "über",
        "—",
        "(quoted)",
        "x=y+1;",
        "Ελλάδα",
        "ok!",
        "\t",
        "end.\n",
        "\n\n",
        "  ",
    ]
    root = tmp_path_factory.mktemp("mpi_corpus")
    files = []
    for i, n_words in enumerate((260_000, 120_000, 0, 90_000)):
        text = " ".join(rng.choice(words, size=n_words))
        if i == 1:
            cjk = "\n".join(["漢字仮名交じり文の一行です。"] * 20_000)  # 560 kB without an ASCII space
            text = text[: len(text) // 2] + cjk + text[len(text) // 2 :].replace("\n", "\r\n")
        path = root / f"part{i}.txt"
        path.write_bytes(text.encode("utf-8"))
        files.append(path)
    return files


# ------------------------------------------------------------------------------ without MPI


def test_counts_pack_into_arrays_and_back():
    counts = {b"": 1, b" the": 7, bytes(range(256)): 2, "漢".encode(): 3}
    data, offsets, values = pack_counts(counts)
    assert data.dtype == np.uint8 and offsets.dtype == np.int64 and values.dtype == np.int64
    assert unpack_counts([data, offsets, values]) == counts
    assert unpack_counts(pack_counts({})) == {}


@pytest.mark.parametrize("n", [1, 2, 3, 7, 50])
@pytest.mark.parametrize("cuttable", [True, False])
def test_the_ranks_shares_count_as_the_whole_corpus(corpus, n, cuttable):
    paths = [str(p) for p in corpus]
    sizes = [p.stat().st_size for p in corpus]
    shares = split_files(paths, sizes, n, cuttable)
    assert len(shares) == n
    flat = [r for share in shares for r in share]
    for path, size in zip(paths, sizes, strict=True):  # each file's ranges tile it, in order
        mine = [(r.start, r.end) for r in flat if r.path == path]
        assert [a for a, _ in mine[1:]] == [b for _, b in mine[:-1]]
        assert (mine[0][0], mine[-1][1]) == (0, size) if size else mine == []
    if not cuttable:
        assert all((r.start, r.end) == (0, Path(r.path).stat().st_size) for r in flat)
    if n <= 3:
        pattern = "gpt4" if cuttable else None
        whole = count_chunks(paths, pattern, workers=1, quiet=True)
        parts = Counter()
        for share in shares:
            if share:
                parts.update(count_chunks(share, pattern, workers=1, quiet=True))
        assert dict(parts) == whole


def test_encode_blocks_are_contiguous_and_balanced():
    ranges = [(i * 10, i * 10 + 10) for i in range(10)]
    blocks = _blocks(ranges, 3)
    assert [r for b in blocks for r in b] == ranges
    assert [len(b) for b in blocks] == [3, 4, 3]
    assert _blocks([(0, 0)], 2) == [[(0, 0)], []]


@pytest.mark.parametrize("command", ["bpe-train", "train-model"])
def test_a_plain_run_never_imports_mpi4py(corpus, tmp_path, command):
    args = {
        "bpe-train": [
            "bpe-train",
            str(corpus[3]),
            "--vocab-size",
            "260",
            "-q",
            "--workers",
            "1",
            "-o",
            str(tmp_path / "t.safetensors"),
        ],
        "train-model": [
            "train-model",
            str(corpus[3]),
            "-o",
            str(tmp_path / "run"),
            "--steps",
            "2",
            "--d-model",
            "16",
            "--n-heads",
            "2",
            "--n-layers",
            "1",
            "--context-length",
            "8",
            "--batch-size",
            "2",
            "-q",
        ],
    }[command]
    code = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tokenkit.cli.main import main; assert main(sys.argv[1:]) == 0; "
            "assert 'mpi4py' not in sys.modules",
            *args,
        ],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert code.returncode == 0, code.stderr


def test_under_a_launcher_without_mpi4py_one_line_says_how_to_install(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now fails
    assert main(["bpe-train", str(corpus[0]), "-o", str(tmp_path / "t.safetensors")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'tokenkit[mpi]'" in err
    monkeypatch.setenv("PMI_RANK", "1")  # the other ranks exit quietly
    assert main(["bpe-train", str(corpus[0]), "-o", str(tmp_path / "t.safetensors")]) == 1
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------ with mpirun


def test_reduce_to_root_sums_every_ranks_counts_on_rank_0():
    """Three ranks (an odd number: rank 2 has no partner in the first round), counts in arrays."""
    script = (
        "import numpy as np\n"
        "from mpi4py import MPI\n"
        "from bpe.distributed import _COUNT_DTYPES, _add_counts, pack_counts, unpack_counts\n"
        "from common.mpi import reduce_to_root\n"
        "comm = MPI.COMM_WORLD\n"
        "rank = comm.Get_rank()\n"
        "mine = {b'all': 1, bytes([rank]) * (rank + 1): 10 ** rank, b'big': 2 ** 40}\n"
        "total = reduce_to_root(comm, mine, _add_counts, pack_counts, unpack_counts, _COUNT_DTYPES)\n"
        "if rank:\n"
        "    assert total is None\n"
        "else:\n"
        "    print(sorted(total.items()))\n"
    )
    proc = subprocess.run(
        [_mpirun(), "-n", "3", sys.executable, "-c", script],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    expected = [(b"\x00", 1), (b"\x01\x01", 10), (b"\x02\x02\x02", 100), (b"all", 3), (b"big", 3 * 2**40)]
    assert proc.stdout.strip() == str(expected)


@pytest.mark.parametrize("n, pattern", [(2, "gpt2"), (3, "gpt4")])
def test_bpe_train_on_ranks_writes_the_one_process_file(corpus, tmp_path, n, pattern):
    args = [*map(str, corpus), "--vocab-size", "500", "--pattern", pattern, "--special", "<|endoftext|>", "-q"]
    assert main(["bpe-train", *args, "--workers", "1", "-o", str(tmp_path / "one.safetensors")]) == 0
    proc = _tk_on_ranks(n, "bpe-train", *args, "-o", str(tmp_path / "many.safetensors"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "many.safetensors").read_bytes() == (tmp_path / "one.safetensors").read_bytes()
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("wrote ") and sum(line.startswith("wrote ") for line in lines) == 1  # rank 0 alone
    assert lines[-1].startswith(f"counted on {n} MPI ranks, bytes per rank: ")
    per_rank = [int(b.replace(",", "")) for b in lines[-1].split(": ")[1].split(" / ")]
    assert sum(per_rank) == sum(p.stat().st_size for p in corpus) and min(per_rank) > 0


def test_bpe_train_on_ranks_with_no_split_pattern_shares_whole_files(corpus, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    files = []
    for i, p in enumerate(corpus):
        files.append(small / p.name)
        files[-1].write_bytes(p.read_bytes()[: 3000 * (i + 1)])
    args = [*map(str, files), "--vocab-size", "400", "--pattern", "none", "-q"]
    assert main(["bpe-train", *args, "-o", str(tmp_path / "one.safetensors")]) == 0
    proc = _tk_on_ranks(2, "bpe-train", *args, "-o", str(tmp_path / "many.safetensors"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "many.safetensors").read_bytes() == (tmp_path / "one.safetensors").read_bytes()


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mpi_tok") / "tok.safetensors"
    assert (
        main(
            [
                "bpe-train",
                *map(str, corpus),
                "--vocab-size",
                "500",
                "--special",
                "<|endoftext|>",
                "-q",
                "--workers",
                "1",
                "-o",
                str(path),
            ]
        )
        == 0
    )
    return path


@pytest.mark.parametrize("n", [2, 3])
def test_encode_on_ranks_writes_the_one_process_ids(corpus, tokenizer, tmp_path, n):
    big = tmp_path / "big.txt"
    big.write_bytes(b"".join(p.read_bytes() for p in corpus))
    assert (
        main(["encode", "-t", str(tokenizer), "-f", str(big), "-o", str(tmp_path / "one.npy"), "-q", "--workers", "1"])
        == 0
    )
    proc = _tk_on_ranks(n, "encode", "-t", str(tokenizer), "-f", str(big), "-o", str(tmp_path / "many.npy"), "-q")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "many.npy").read_bytes() == (tmp_path / "one.npy").read_bytes()
    assert proc.stdout.splitlines()[-1].startswith(f"encoded on {n} MPI ranks, bytes per rank: ")
    assert sorted(os.listdir(tmp_path)) == ["big.txt", "many.npy", "one.npy"]  # no temporary files left


def test_an_error_on_one_rank_ends_the_job_in_one_line(corpus, tokenizer, tmp_path):
    """The special token sits in the last rank's share only: that rank reports it, rank 0 (waiting
    for it) is ended too, and no output file or temporary file is left."""
    text = tmp_path / "special.txt"
    text.write_bytes(corpus[0].read_bytes() + b" The end.<|endoftext|>")
    start = time.monotonic()
    proc = _tk_on_ranks(
        2, "encode", "-t", str(tokenizer), "-f", str(text), "-o", str(tmp_path / "ids.npy"), "-q", timeout=30
    )
    assert time.monotonic() - start < 15
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "special token '<|endoftext|>'" in ours[0] and ours[0].endswith("(rank 1 of 2)")
    assert os.listdir(tmp_path) == ["special.txt"]


def test_a_mistake_every_rank_makes_is_one_message_led_by_rank_0(tmp_path):
    """Rank 0 reports at once and the others a second later, so the job usually shows one line;
    on a loaded machine another rank may also get to say it (the same message, with its rank)."""
    proc = _tk_on_ranks(
        3, "bpe-train", str(tmp_path / "missing.txt"), "-o", str(tmp_path / "t.safetensors"), timeout=30
    )
    assert proc.returncode != 0
    expected = "error: corpus file not found: '" + str(tmp_path / "missing.txt") + "'"
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert expected in ours
    assert {re.sub(r" \(rank \d+ of 3\)$", "", line) for line in ours} == {expected}


@pytest.mark.parametrize("flags", [["--nonsense"], ["--steps", "abc"]])
def test_a_usage_error_under_mpirun_is_said_once(tmp_path, flags):
    # click rejects these before any MPI code runs; rank 0 alone prints the line
    proc = _tk_on_ranks(3, "train-model", str(tmp_path / "c.txt"), "-o", str(tmp_path / "run"), *flags, timeout=30)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "--help" in ours[0], proc.stderr


# --- the training executor ----------------------------------------------------------------------

_STEPS_ON_RANKS = """
import sys
import numpy as np
from mpi4py import MPI
from tokenkit.transformer import AdamW, GPT, GPTConfig
from tokenkit.transformer.parallel import MPIDataParallel

workers, B = int(sys.argv[2]), int(sys.argv[3])
config = GPTConfig(vocab_size=23, context_length=8, d_model=16, n_layers=2, n_heads=2)
model = MPIDataParallel(GPT(config, seed=4), MPI.COMM_WORLD, workers=workers)
opt = AdamW(model.params, lr=1e-2)
rng = np.random.default_rng(0)
losses = []
for step in range(4):
    ids, targets = rng.integers(0, 23, (B, 8)), rng.integers(0, 23, (B, 8))
    if step % 2:  # the whole batch given
        loss, grads = model.loss_and_grads(ids, targets)
    else:  # only this rank's rows, as the training loop reads them
        rows = model.local_rows(B)
        loss, grads = model.loss_and_grads(ids[rows], targets[rows], batch_rows=B)
    opt.step(grads)
    losses.append((loss, model.loss(ids, targets)))
model.close()
if model.rank == 0:
    np.savez(sys.argv[1], losses=np.array(losses), **model.params)
"""


@pytest.mark.parametrize("ranks, workers, rows", [(2, 1, 7), (3, 1, 7), (2, 2, 7), (3, 3, 5)])
def test_mpi_executor_is_bit_identical_to_data_parallel_in_one_process(tmp_path, ranks, workers, rows):
    """mpirun -n N with MPIDataParallel(workers=W) trains to the same bits as DataParallel(workers=N*W),
    uneven shards included; 3 ranks of 3 workers over 5 rows leave the last rank without a shard."""
    from tokenkit.transformer import GPT, AdamW, GPTConfig
    from tokenkit.transformer.parallel import DataParallel

    out = tmp_path / "ranks.npz"
    cmd = [_mpirun(), "-n", str(ranks), sys.executable, "-c", _STEPS_ON_RANKS, str(out), str(workers), str(rows)]
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = np.load(out)

    config = GPTConfig(vocab_size=23, context_length=8, d_model=16, n_layers=2, n_heads=2)
    model = DataParallel(GPT(config, seed=4), workers=ranks * workers)
    opt = AdamW(model.params, lr=1e-2)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(4):
        ids, targets = rng.integers(0, 23, (rows, 8)), rng.integers(0, 23, (rows, 8))
        loss, grads = model.loss_and_grads(ids, targets)
        opt.step(grads)
        losses.append((loss, model.loss(ids, targets)))
    model.close()
    assert got["losses"].tolist() == [list(pair) for pair in losses]
    for name, p in model.params.items():
        np.testing.assert_array_equal(got[name], p, err_msg=name)


def test_sum_of_shards_is_what_data_parallel_computes():
    """The plain version beside the executors: shards one after the other, summed in shard order."""
    from tokenkit.transformer import GPT, GPTConfig
    from tokenkit.transformer.parallel import DataParallel, sum_of_shards

    config = GPTConfig(vocab_size=23, context_length=8, d_model=16, n_layers=2, n_heads=2)
    rng = np.random.default_rng(1)
    ids, targets = rng.integers(0, 23, (7, 8)), rng.integers(0, 23, (7, 8))
    model = DataParallel(GPT(config, seed=4), workers=3)
    loss, grads = model.loss_and_grads(ids, targets)
    plain_loss, plain = sum_of_shards(GPT(config, seed=4), ids, targets, 3)
    model.close()
    assert plain_loss == loss and list(plain) == list(grads)
    for name, g in grads.items():
        np.testing.assert_array_equal(plain[name], g, err_msg=name)


# --- the training executor on GPUs: one shard per rank, reduced through the host ------------------

# argv: OUT DEVICE MODE ROWS. DEVICE "twin" stands the CUDA kernels' NumPy twins in for a GPU (the
# device branch without one), "cuda" is the GPU. MODE "ranks": MPIDataParallel on COMM_WORLD, each
# rank on GPU (local rank % GPUs); "alone:N": one process, no MPI, sum_of_shards over N shards.
# Four steps of loss, gradients, clipping and AdamW; rank 0 saves (loss, evaluated loss, norm) and the weights.
DEVICE_STEPS = """
import sys
import numpy as np
from tokenkit.transformer import AdamW, GPT, GPTConfig, backends, clip_grad_norm
from tokenkit.transformer.parallel import MPIDataParallel, shard_rows, sum_of_shards

out, device, mode, B = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if device == "twin":
    from tokenkit.transformer.backends.cuda_twins import twin_backend
    backends._BACKENDS["cuda"] = twin_backend()
config = GPTConfig(vocab_size=23, context_length=8, d_model=16, n_layers=2, n_heads=2)
if mode == "ranks":
    from mpi4py import MPI
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    backends.use_gpu(node.Get_rank())
    node.Free()
    model = MPIDataParallel(GPT(config, seed=4, device="cuda"), MPI.COMM_WORLD)
    gpt, rank = model.model, model.rank
    n = model.shards
else:
    gpt, rank, n = GPT(config, seed=4, device="cuda"), 0, int(mode.split(":")[1])
assert gpt.device != "cpu"
opt = AdamW(gpt.params, lr=1e-2)
rng = np.random.default_rng(0)
losses = []
for step in range(4):
    ids, targets = rng.integers(0, 23, (B, 8)), rng.integers(0, 23, (B, 8))
    if mode != "ranks":
        loss, grads = sum_of_shards(gpt, ids, targets, n)
    elif step % 2:  # the whole batch given
        loss, grads = model.loss_and_grads(ids, targets)
    else:  # only this rank's rows, as the training loop reads them
        rows = model.local_rows(B)
        loss, grads = model.loss_and_grads(ids[rows], targets[rows], batch_rows=B)
    assert all(type(g) is type(gpt.params[k]) for k, g in grads.items())  # on the device
    norm = clip_grad_norm(grads, 0.5)  # a whole training step: the norm's dot products too
    opt.step(grads)
    if mode == "ranks":
        evaluated = model.loss(ids, targets)
    else:
        evaluated = float(sum(gpt.shard_loss(ids[r], targets[r], B) for r in shard_rows(B, n)))
    losses.append((loss, evaluated, norm))
if rank == 0:
    np.savez(out, losses=np.array(losses), **gpt.host_params())
"""


def device_steps(tmp_path: Path, device: str, ranks: int, rows: int, timeout: float = 120) -> tuple[dict, dict]:
    """The arrays DEVICE_STEPS saves: on `ranks` ranks (mpirun) and in one process over as many shards."""
    got = {}
    for mode in ("ranks", f"alone:{ranks}"):
        out = tmp_path / f"{mode.replace(':', '')}.npz"
        script = [sys.executable, "-c", DEVICE_STEPS, str(out), device, mode, str(rows)]
        cmd = [_mpirun(), "-n", str(ranks), *script] if mode == "ranks" else script
        proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stderr
        got[mode] = dict(np.load(out))
    return got["ranks"], got[f"alone:{ranks}"]


@pytest.mark.parametrize("ranks, rows", [(2, 7), (3, 7), (3, 2)])
def test_device_model_on_ranks_is_bit_identical_to_its_shards_in_one_process(tmp_path, ranks, rows):
    """The device branch (kernels' NumPy twins for the GPU): each rank's gradients through the host,
    summed in shard order, train to the bits of one process computing the same shards in turn;
    3 ranks over 2 rows leave the last rank without a shard."""
    on_ranks, alone = device_steps(tmp_path, "twin", ranks, rows)
    assert on_ranks["losses"].tolist() == alone["losses"].tolist()
    assert on_ranks.keys() == alone.keys()
    for name, p in alone.items():
        np.testing.assert_array_equal(on_ranks[name], p, err_msg=name)


def test_a_device_model_takes_one_shard_per_rank():
    from tokenkit.transformer import GPT, GPTConfig, ModelError
    from tokenkit.transformer.backends.cuda_twins import twin_backend
    from tokenkit.transformer.parallel import MPIDataParallel

    model = GPT(GPTConfig(vocab_size=23, context_length=8, d_model=16, n_layers=1, n_heads=2))
    model.to(twin_backend())
    with pytest.raises(ModelError, match=r"one shard per rank on a GPU, .* on cuda-twin; use workers=1"):
        MPIDataParallel(model, comm=None, workers=2)
