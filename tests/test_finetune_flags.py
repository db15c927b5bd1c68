"""Fine-tuning as people do it: `--dropout`, `--grad-accum N` and `--freeze PATTERN`.

Dropout's ops against their plain twins (transformer/reference.py) and the whole model's
gradient by finite differences with a fixed mask; masks that depend on the row alone (so a
shard, a worker or a micro-batch draws the same ones), none at evaluation; gradient
accumulation bit for bit the larger batch where the shards cut alike; frozen weights
bit-identical and no moments kept for them; exact resume with all three; one-line errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import signal_at_step

from tokenkit.cli.main import main
from tokenkit.pipeline import PipelineError, trainlog
from tokenkit.pipeline.checkpoint import load_model
from tokenkit.pipeline.config import TrainConfig, frozen_names
from tokenkit.pipeline.train_memory import check_fine_tuning_flags
from tokenkit.pipeline.train_state import load_train_state
from tokenkit.transformer import GPT, GPTConfig, reference
from tokenkit.transformer.config import llama_config, param_shapes
from tokenkit.transformer.dropout import ATTN_WEIGHTS, MLP_OUT, Dropout
from tokenkit.transformer.memory import estimate_bytes
from tokenkit.transformer.ops import attention_backward, attention_forward
from tokenkit.transformer.parallel import DataParallel, sum_of_shards

REPO = Path(__file__).resolve().parents[1]
KINDS = {
    "gpt2": GPTConfig(vocab_size=23, context_length=8, d_model=16, n_layers=2, n_heads=2),
    "post-norm relu": GPTConfig(
        vocab_size=23, context_length=8, d_model=16, n_layers=2, n_heads=2, norm="post", activation="relu"
    ),
    "llama gqa": llama_config(vocab_size=23, context_length=8, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2),
}


def _batch(rows: int, T: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 23, (rows, T)), rng.integers(0, 23, (rows, T))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# --- the masks and the ops --------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_masks_are_zero_or_scaled_at_rate_p_and_depend_on_the_row_alone(p):
    d = Dropout(p, seed=3, step=11)
    whole = d.mask(1, MLP_OUT, 6, (50, 40), np.float32)
    assert set(np.unique(whole).tolist()) == {0.0, np.float32(1 / (1 - p))}
    assert abs((whole == 0).mean() - p) < 0.02
    for cut in (1, 2, 5):  # a later shard's rows are the whole batch's rows
        assert np.array_equal(d.shifted(cut).mask(1, MLP_OUT, 6 - cut, (50, 40), np.float32), whole[cut:])
    others = [Dropout(p, 4, 11), Dropout(p, 3, 12)]
    assert all(not np.array_equal(o.mask(1, MLP_OUT, 6, (50, 40), np.float32), whole) for o in others)
    assert not np.array_equal(d.mask(0, MLP_OUT, 6, (50, 40), np.float32), whole)  # another layer


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [(2, None), (4, 2), (4, 1)])
def test_attention_with_a_dropout_mask_matches_the_reference(causal, heads):
    n_heads, n_kv = heads
    kv = n_heads if n_kv is None else n_kv
    B, T, hd = 2, 7, 3
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((B, T, (n_heads + 2 * kv) * hd))
    drop = Dropout(0.4, 0, 0).mask(0, ATTN_WEIGHTS, B, (n_heads, T, T), np.float64)
    out, cache = attention_forward(qkv, n_heads, causal, None, n_kv, drop=drop)
    np.testing.assert_allclose(out, reference.attention(qkv, n_heads, causal, n_kv, drop=drop), atol=1e-12)
    dout = rng.standard_normal(out.shape)
    want = reference.attention_backward(dout, qkv, n_heads, causal, n_kv, drop=drop)
    np.testing.assert_allclose(attention_backward(dout, cache), want, atol=1e-12)
    # the reference itself, by finite differences on a few inputs
    eps = 1e-6
    for idx in [(0, 1, 2), (1, 6, qkv.shape[2] - 1), (1, 3, n_heads * hd + 1)]:
        plus, minus = qkv.copy(), qkv.copy()
        plus[idx] += eps
        minus[idx] -= eps
        fd = (reference.attention(plus, n_heads, causal, n_kv, drop=drop) * dout).sum()
        fd -= (reference.attention(minus, n_heads, causal, n_kv, drop=drop) * dout).sum()
        assert abs(fd / (2 * eps) - want[idx]) < 1e-6


def test_reference_dropout_backward_is_the_same_mask():
    rng = np.random.default_rng(0)
    x, dout = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    mask = Dropout(0.5, 1, 2).mask(0, MLP_OUT, 3, (4,), np.float64)
    assert np.array_equal(reference.dropout(x, mask), x * mask)
    assert np.array_equal(reference.dropout_backward(dout, mask), dout * mask)


@pytest.mark.parametrize("kind", list(KINDS))
def test_model_gradient_with_a_fixed_mask_matches_finite_differences(kind):
    model = GPT(KINDS[kind], seed=2)
    model.params = {k: v.astype(np.float64) for k, v in model.params.items()}
    x, y = _batch(3)
    d = Dropout(0.3, seed=7, step=5)
    _, grads = model.loss_and_grads(x, y, dropout=d)
    rng = np.random.default_rng(3)
    eps = 1e-6
    for name, p in model.params.items():
        for _ in range(2):
            idx = tuple(int(rng.integers(0, n)) for n in p.shape)
            old = p[idx]
            p[idx] = old + eps
            up = model.loss_and_grads(x, y, dropout=d)[0]
            p[idx] = old - eps
            down = model.loss_and_grads(x, y, dropout=d)[0]
            p[idx] = old
            scale = max(1.0, float(np.abs(grads[name]).max()))
            assert abs((up - down) / (2 * eps) - grads[name][idx]) < 1e-6 * scale, (name, idx)


@pytest.mark.parametrize("kind", list(KINDS))
def test_dropout_zero_and_evaluation_are_the_plain_models_bits(kind):
    model = GPT(KINDS[kind], seed=2)
    x, y = _batch(4)
    loss, grads = model.loss_and_grads(x, y)
    loss0, grads0 = model.loss_and_grads(x, y, dropout=Dropout(0.0, 1, 1))
    assert loss0 == loss and _same(grads0, grads)
    dropped, _ = model.loss_and_grads(x, y, dropout=Dropout(0.5, 1, 1))
    assert dropped != loss  # the masks do act in training
    logits = model.forward(x)
    assert model.loss(x, y) == model.loss_and_grads(x, y)[0]  # evaluation takes no mask
    assert np.array_equal(model.forward(x), logits)


# --- shards, workers, micro-batches -----------------------------------------------------------


@pytest.mark.parametrize("micro", [1, 2])
def test_workers_and_micro_batches_give_the_in_order_sum_of_the_same_shards(micro):
    """Each shard draws its own rows' masks, so where it runs changes nothing: 2 workers (with
    2 micro-batches each) are bit for bit 2 x micro shards computed in turn in one process."""
    cfg = KINDS["gpt2"]
    x, y = _batch(8)
    d = Dropout(0.3, seed=1, step=4)
    plain = sum_of_shards(GPT(cfg, seed=1), x, y, 2 * micro, dropout=d)
    pool = DataParallel(GPT(cfg, seed=1), workers=2)
    try:
        loss, grads = pool.loss_and_grads(x, y, dropout=d, micro_batches=micro)
    finally:
        pool.close()
    assert loss == plain[0] and _same(grads, plain[1])
    one = DataParallel(GPT(cfg, seed=1), workers=1).loss_and_grads(x, y, dropout=d, micro_batches=2 * micro)
    assert one[0] == plain[0] and _same(one[1], plain[1])
    # and each row has the whole batch's masks: one shard of all 8 rows gives the same numbers
    # but for the order of the sums
    whole = GPT(cfg, seed=1).loss_and_grads(x, y, dropout=d)
    assert abs(whole[0] - loss) < 1e-6
    assert all(np.allclose(whole[1][k], grads[k], rtol=1e-4, atol=1e-7) for k in grads)


def test_micro_batches_that_do_not_cut_evenly_are_refused():
    x, y = _batch(5)
    with pytest.raises(Exception, match="equal micro-batches"):
        DataParallel(GPT(KINDS["gpt2"]), workers=1).loss_and_grads(x, y, micro_batches=2)


# --- through the CLI --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "tales.txt"
    path.write_bytes((REPO / "corpora" / "tiny_tales.txt").read_bytes()[:60_000])
    return path


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory) -> Path:
    from tokenkit.bpe import Tokenizer

    path = tmp_path_factory.mktemp("tok") / "tokenizer.safetensors"
    Tokenizer.train([corpus.read_bytes()[:20_000]], vocab_size=300, workers=1, quiet=True).save(path)
    return path


SHAPE = ["--n-layers", "2", "--n-heads", "2", "--d-model", "32", "--context-length", "12", "--warmup-steps", "1",
         "--eval-batches", "1", "--quiet"]  # fmt: skip


def _train(capsys, corpus, tokenizer, out: Path, *flags: str) -> str:
    code = main(["train-model", str(corpus), "-t", str(tokenizer), "-o", str(out), *SHAPE, *flags])
    _, err = capsys.readouterr()
    assert code == 0, err
    return err


def _tensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def _steps(run: Path) -> list[tuple]:
    return [(r["step"], r["loss"], r["grad_norm"]) for r in trainlog.read_log(run / "log.jsonl") if r["type"] == "step"]


def _one_line(capsys, argv: list[str], fragment: str) -> None:
    code = main(argv)
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and fragment in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize("dropout", ["0", "0.2"])
def test_grad_accum_is_bit_for_bit_the_larger_batch(capsys, corpus, tokenizer, tmp_path, dropout):
    """--grad-accum 2 --batch-size 4 --workers 2 is --batch-size 8 --workers 4: the same rows
    drawn, the same four shards summed in the same order, the same masks (by global row)."""
    common = ["--steps", "4", "--eval-interval", "4", "--dropout", dropout]
    _train(capsys, corpus, tokenizer, tmp_path / "accum", *common, "--grad-accum", "2", "--batch-size", "4",
           "--workers", "2")  # fmt: skip
    _train(capsys, corpus, tokenizer, tmp_path / "big", *common, "--batch-size", "8", "--workers", "4")
    a, b = _tensors(tmp_path / "accum" / "model.safetensors"), _tensors(tmp_path / "big" / "model.safetensors")
    assert _same(a, b)
    assert _steps(tmp_path / "accum") == _steps(tmp_path / "big")


def test_interrupted_and_resumed_equals_uninterrupted_with_every_flag(capsys, corpus, tokenizer, tmp_path, monkeypatch):
    flags = ["--steps", "8", "--eval-interval", "3", "--batch-size", "4", "--workers", "2", "--dropout", "0.25",
             "--grad-accum", "2", "--freeze", "wpe.*,h.0.*"]  # fmt: skip
    _train(capsys, corpus, tokenizer, tmp_path / "whole", *flags)
    restore = signal_at_step(monkeypatch, 5)
    code = main(["train-model", str(corpus), "-t", str(tokenizer), "-o", str(tmp_path / "split"), *SHAPE, *flags])
    capsys.readouterr()
    assert code == 130
    restore()
    assert main(["train-model", "--resume", str(tmp_path / "split"), "--quiet"]) == 0
    for name in ("model.safetensors", "train_state.safetensors"):
        assert _same(_tensors(tmp_path / "whole" / name), _tensors(tmp_path / "split" / name)), name
    assert _steps(tmp_path / "whole") == _steps(tmp_path / "split")
    _one_line(
        capsys, ["train-model", "--resume", str(tmp_path / "split"), "--dropout", "0.1"], "--dropout 0.1 contradicts"
    )
    _one_line(
        capsys, ["train-model", "--resume", str(tmp_path / "split"), "--freeze", "wte.*"], "--freeze wte.* contradicts"
    )


def test_dropout_is_off_at_evaluation_and_in_the_run_record(capsys, corpus, tokenizer, tmp_path):
    """A run's evaluation at step 3 and a fine-tuning run's evaluation of those weights before its
    first step (with another dropout and another step) are the same number: no mask at evaluation."""
    base = tmp_path / "base"
    _train(capsys, corpus, tokenizer, base, "--steps", "3", "--eval-interval", "3", "--batch-size", "4",
           "--workers", "1", "--dropout", "0.5")  # fmt: skip
    tuned = tmp_path / "tuned"
    code = main(["train-model", str(corpus), "--init-from", str(base), "-o", str(tuned), "--steps", "1",
                 "--batch-size", "4", "--workers", "1", "--eval-batches", "1", "--dropout", "0.3",
                 "--quiet"])  # fmt: skip
    assert code == 0
    evals = lambda run: [r["val_loss"] for r in trainlog.read_log(run / "log.jsonl") if r["type"] == "eval"]  # noqa: E731
    assert evals(base)[-1] == evals(tuned)[0]
    assert load_train_state(tuned / "train_state.safetensors").train_config["dropout"] == 0.3
    code = main(["info", str(tuned)])
    out, _ = capsys.readouterr()
    assert code == 0 and "--dropout 0.3" in out


def test_frozen_weights_stay_bit_identical_and_keep_no_moments(capsys, corpus, tokenizer, tmp_path):
    base = tmp_path / "base"
    _train(
        capsys, corpus, tokenizer, base, "--steps", "2", "--eval-interval", "2", "--batch-size", "4", "--workers", "1"
    )
    tuned = tmp_path / "tuned"  # everything but the last block and the final norm (the head is wte: tied)
    code = main(["train-model", str(corpus), "--init-from", str(base), "-o", str(tuned), "--steps", "3",
                 "--eval-interval", "3", "--batch-size", "4", "--workers", "2", "--eval-batches", "1",
                 "--freeze", "*,!h.1.*,!ln_f.*", "--quiet"])  # fmt: skip
    assert code == 0
    before, after = load_model(base).model.params, load_model(tuned).model.params
    trained = {n for n in before if n.startswith(("h.1.", "ln_f."))}
    for name in before:
        assert np.array_equal(before[name], after[name]) == (name not in trained), name
    moments = {k[12:] for k in _tensors(tuned / "train_state.safetensors") if k.startswith("optimizer.m.")}
    assert moments == trained
    code = main(["info", str(tuned / "train_state.safetensors")])
    out, _ = capsys.readouterr()
    assert "--freeze '*,!h.1.*,!ln_f.*'" in out


def test_chat_fine_tuning_takes_the_flags_and_accumulates_as_the_larger_batch(capsys, corpus, tokenizer, tmp_path):
    """--chat with all three: the masked loss's mean runs over the whole step's counted targets,
    so 2 micro-batches of 3 conversations rows are the batch of 6 in 2 shards, bit for bit."""
    from test_chat_sft import conversations, write_jsonl

    chats = write_jsonl(tmp_path / "chats.jsonl", conversations(40))
    base = tmp_path / "base"
    shape = [*SHAPE[:6], *SHAPE[8:], "--context-length", "64"]  # a conversation fits a row
    code = main(["train-model", str(corpus), "-t", str(tokenizer), "-o", str(base), *shape, "--steps", "2",
                 "--eval-interval", "2", "--batch-size", "4", "--workers", "1"])  # fmt: skip
    assert code == 0
    tune = ["--steps", "3", "--eval-interval", "3", "--eval-batches", "1", "--dropout", "0.2",
            "--freeze", "wpe.*,h.0.attn.*", "--quiet"]  # fmt: skip
    runs = {"accum": ["--grad-accum", "2", "--batch-size", "3", "--workers", "1"],
            "big": ["--batch-size", "6", "--workers", "2"]}  # fmt: skip
    for name, flags in runs.items():
        code = main(["train-model", "--chat", str(chats), "--init-from", str(base), "-o", str(tmp_path / name),
                     *tune, *flags])  # fmt: skip
        _, err = capsys.readouterr()
        assert code == 0, err
    a, b = _tensors(tmp_path / "accum" / "model.safetensors"), _tensors(tmp_path / "big" / "model.safetensors")
    assert _same(a, b) and _steps(tmp_path / "accum") == _steps(tmp_path / "big")
    assert np.array_equal(a["wpe.weight"], _tensors(base / "model.safetensors")["wpe.weight"])


def test_the_memory_check_counts_moments_of_the_trained_parameters_only():
    cfg = GPTConfig(vocab_size=1000, context_length=64, d_model=64, n_layers=2, n_heads=2)
    shapes = param_shapes(cfg)
    frozen = TrainConfig(n_layers=2, d_model=64, n_heads=2, freeze="wte.*,wpe.*").frozen(shapes)
    trainable = sum(int(np.prod(s)) for n, s in shapes.items() if n not in frozen)
    full = estimate_bytes(cfg, training=True)
    less = estimate_bytes(cfg, training=True, trainable=trainable)
    assert full - less == 2 * 4 * (cfg.n_params() - trainable)
    assert estimate_bytes(cfg, training=True, batch_rows=4, dropout=True) > estimate_bytes(
        cfg, training=True, batch_rows=4
    )


# --- settings ---------------------------------------------------------------------------------


def test_freeze_patterns_read_in_order_with_exclusions():
    names = ["wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.1.ln_1.weight", "ln_f.weight"]
    assert frozen_names("", names) == set()
    assert frozen_names("wte.*, h.0.*", names) == {"wte.weight", "h.0.ln_1.weight"}
    assert frozen_names("*,!h.1.*,!ln_f.*", names) == {"wte.weight", "wpe.weight", "h.0.ln_1.weight"}
    assert frozen_names("h.*,!h.1.*,h.1.ln_1.weight", names) == {"h.0.ln_1.weight", "h.1.ln_1.weight"}


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--dropout", "1"], "--dropout must be below 1"),
        (["--dropout", "-0.1"], "--dropout must not be negative"),
        (["--grad-accum", "0"], "--grad-accum must be at least 1"),
        (["--freeze", "h.9.*"], "--freeze 'h.9.*' matches no parameter"),
        (["--freeze", "wte.*,!nothing"], "--freeze 'nothing' matches no parameter"),
        (["--freeze", "*"], "freezes every parameter"),
    ],
)
def test_bad_flags_are_one_line_before_any_work(capsys, corpus, tokenizer, tmp_path, flags, fragment):
    out = tmp_path / "never"
    _one_line(capsys, ["train-model", str(corpus), "-t", str(tokenizer), "-o", str(out), *SHAPE, *flags], fragment)
    assert not out.exists()


def test_what_an_executor_does_not_build_is_one_line():
    with pytest.raises(PipelineError, match="--dropout trains on the CPU only"):
        check_fine_tuning_flags(TrainConfig(dropout=0.1), "cuda")
    check_fine_tuning_flags(TrainConfig(dropout=0.1, grad_accum=2), "cpu")
    check_fine_tuning_flags(TrainConfig(grad_accum=2), "cuda")


def test_settings_files_take_the_flags():
    config = TrainConfig.from_dict(json.loads('{"dropout": 0.1, "grad-accum": 4, "freeze": "wte.*"}'))
    assert (config.dropout, config.grad_accum, config.freeze, config.step_rows) == (0.1, 4, "wte.*", 64)


def test_dropout_on_two_mpi_ranks_is_one_process_of_two_workers(corpus, tokenizer, tmp_path):
    """Each rank draws its own rows' masks (by their row in the whole batch): the files are the
    one process's, byte for byte. Skipped without mpirun and mpi4py."""
    import os
    import subprocess
    import sys

    from test_mpi import _mpirun

    mpirun = _mpirun()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    flags = [*SHAPE, "--steps", "4", "--eval-interval", "2", "--batch-size", "4", "--dropout", "0.3", "--seed", "2"]
    tk = [sys.executable, "-m", "tokenkit.cli.main", "train-model", str(corpus), "-t", str(tokenizer), *flags]
    runs = {"one": [*tk, "-o", str(tmp_path / "one"), "--workers", "2"],
            "ranks": [mpirun, "-n", "2", *tk, "-o", str(tmp_path / "ranks"), "--workers", "1"]}  # fmt: skip
    for name, cmd in runs.items():
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (name, proc.stderr)
    for name in ("model.safetensors", "train_state.safetensors"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "ranks" / name).read_bytes(), name
    assert _steps(tmp_path / "one") == _steps(tmp_path / "ranks")
