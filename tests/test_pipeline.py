"""pipeline/: atomic files, token cache, batches, RNG state, configs, training, resume, NaN stop."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkit.common import safetensors_file
from tokenkit.pipeline import PipelineError, checkpoint, data, sources, train_state, trainlog
from tokenkit.pipeline.config import TrainConfig, load_config_file, model_settings
from tokenkit.transformer import GPTConfig, ModelError

# --- atomic writes ---------------------------------------------------------------------------


def test_atomic_path_replaces_whole_file(tmp_path):
    target = tmp_path / "f.txt"
    checkpoint.write_text(target, "old")
    checkpoint.write_text(target, "new")
    assert target.read_text(encoding="utf-8") == "new"
    assert list(tmp_path.glob(".*.tmp")) == []


def test_atomic_path_failure_midway_keeps_old_file(tmp_path):
    target = tmp_path / "f.bin"
    checkpoint.write_text(target, "good")
    with pytest.raises(RuntimeError):
        with checkpoint.atomic_path(target) as tmp:
            tmp.write_bytes(b"half of a new fi")
            raise RuntimeError("killed while writing")
    assert target.read_text(encoding="utf-8") == "good"
    assert list(tmp_path.glob(".*.tmp")) == []


def test_atomic_path_interrupt_during_fsync_keeps_old_file(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    checkpoint.write_text(target, "good")

    def interrupted_fsync(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted_fsync)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.write_text(target, "new content")
    monkeypatch.undo()
    assert target.read_text(encoding="utf-8") == "good"


def test_remove_stale_temps_removes_only_our_temps_of_dead_writers(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".model.safetensors.tk-{dead.pid}-0123abcd.tmp").write_bytes(b"x")  # a writer killed mid-write
    live = tmp_path / f".model.safetensors.tk-{os.getppid()}-0123abcd.tmp"  # a live writer's
    live.write_bytes(b"x")
    (tmp_path / ".notes.tmp").write_bytes(b"the user's")  # not ours: never touched
    (tmp_path / "keep.txt").write_text("y", encoding="utf-8")
    checkpoint.remove_stale_temps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, ".notes.tmp", "keep.txt"])


def test_truncate_log_drops_records_past_step_and_torn_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    log = trainlog.JsonlLog(path)
    for s in range(1, 6):
        log.write({"type": "step", "step": s, "loss": 1.0 / s})
    log.close()
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"type": "step", "st')  # a kill mid-line
    trainlog.truncate_log(path, 3)
    assert [r["step"] for r in trainlog.read_log(path)] == [1, 2, 3]


def test_read_header_errors_are_one_line(tmp_path):
    with pytest.raises(PipelineError, match="not found"):
        checkpoint.read_header(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 5)
    with pytest.raises(PipelineError) as err:
        checkpoint.read_header(junk)
    assert "\n" not in str(err.value)
    with pytest.raises(PipelineError, match="directory"):
        checkpoint.read_header(tmp_path)


# --- data ------------------------------------------------------------------------------------


def test_one_plain_files_fingerprint_is_its_sha256(tmp_path):
    """What a v1 run recorded as corpus_sha256 is what a run now records as the fingerprint."""
    blob = os.urandom(3 * (1 << 20) + 7)  # several read blocks
    path = tmp_path / "c.txt"
    path.write_bytes(blob)
    assert sources.open_corpus(path).fingerprint() == hashlib.sha256(blob).hexdigest()


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**63), draws=st.integers(0, 7), kind=st.sampled_from(["random", "integers", "uint32"]))
def test_rng_state_round_trip(seed, draws, kind):
    rng = np.random.default_rng(seed)
    for _ in range(draws):  # leave the generator in any state, including a buffered uint32
        {
            "random": rng.random,
            "integers": lambda: rng.integers(0, 10, 3),
            "uint32": lambda: rng.integers(0, 2**32, dtype=np.uint32),
        }[kind]()
    words = data.rng_to_array(rng)
    assert words.dtype == np.uint64 and words.shape == (6,)
    copy = data.rng_from_array(words)
    assert copy.bit_generator.state == rng.bit_generator.state
    assert np.array_equal(copy.integers(0, 1000, 50), rng.integers(0, 1000, 50))
    assert np.array_equal(copy.integers(0, 2**32, 5, dtype=np.uint32), rng.integers(0, 2**32, 5, dtype=np.uint32))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(20, 400), batch=st.integers(1, 6), ctx=st.integers(1, 8), seed=st.integers(0, 1000))
def test_get_batch_windows_are_corpus_slices(n, batch, ctx, seed):
    ids = np.random.default_rng(seed).integers(0, 60000, n).astype(np.uint16)
    x, y = data.get_batch(ids, batch, ctx, np.random.default_rng(seed))
    assert x.shape == y.shape == (batch, ctx) and x.dtype == np.int64
    assert np.array_equal(x[:, 1:], y[:, :-1])
    # the obvious reference: every row is some contiguous slice of the corpus, followed by its next token
    text = ids.tolist()
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        starts = [s for s in range(n - ctx) if text[s : s + ctx] == row_x and text[s + 1 : s + ctx + 1] == row_y]
        assert starts


def test_get_batch_reaches_both_ends():
    ids = np.arange(10, dtype=np.uint16)
    rng = np.random.default_rng(0)
    firsts, lasts = set(), set()
    for _ in range(200):
        x, y = data.get_batch(ids, 4, 3, rng)
        firsts.update(x[:, 0].tolist())
        lasts.update(y[:, -1].tolist())
    assert firsts == set(range(7)) and lasts == set(range(3, 10))


def test_eval_batches_are_fixed_and_independent_of_training_generator():
    ids = np.arange(500, dtype=np.uint16)
    a = data.eval_batches(ids, 3, 4, 8, seed=1)
    b = data.eval_batches(ids, 3, 4, 8, seed=1)
    assert all(np.array_equal(xa, xb) and np.array_equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True))
    assert not np.array_equal(a[0][0], data.eval_batches(ids, 3, 4, 8, seed=2)[0][0])


def test_split_point_is_last_fraction_and_checks_size():
    assert data.split_point(1000, 0.1, 8) == 900
    assert data.split_point(1000, 0.25, 8) == 750
    with pytest.raises(PipelineError, match="corpus too small"):
        data.split_point(20, 0.1, 8)
    with pytest.raises(PipelineError, match="between 0 and 1"):
        data.split_point(1000, 0.0, 8)


def test_unigram_baseline_matches_direct_formula():
    rng = np.random.default_rng(0)
    train = rng.integers(0, 5, 1000).astype(np.uint16)
    val = rng.integers(0, 5, 200).astype(np.uint16)
    counts = np.array([np.sum(train == t) for t in range(7)], dtype=float)
    p = (counts + 1) / (counts.sum() + 7)
    expected = -np.mean([np.log(p[t]) for t in val])
    assert data.unigram_baseline(train, val, 7, chunk=64) == pytest.approx(expected, rel=1e-12)


def test_open_corpus_errors(tmp_path):
    with pytest.raises(PipelineError, match="not found"):
        sources.open_corpus(tmp_path / "nope.txt")
    (tmp_path / "d").mkdir()
    with pytest.raises(PipelineError, match="holds no files"):
        sources.open_corpus(tmp_path / "d")  # a directory is a corpus, but this one has nothing to read
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(PipelineError, match="empty"):
        sources.open_corpus(empty)


# --- training configuration ------------------------------------------------------------------


def test_config_from_json_and_toml(tmp_path):
    js = tmp_path / "c.json"
    js.write_text(json.dumps({"d_model": 64, "lr": 1, "bias": False, "eval-interval": 7}), encoding="utf-8")
    cfg = TrainConfig.from_file(js)
    assert (cfg.d_model, cfg.lr, cfg.bias, cfg.eval_interval) == (64, 1.0, False, 7)
    assert isinstance(cfg.lr, float)
    toml = tmp_path / "c.toml"
    toml.write_text("d_model = 64\nlr = 1.0\nbias = false\neval-interval = 7\n", encoding="utf-8")
    assert TrainConfig.from_file(toml) == cfg


@pytest.mark.parametrize(
    "content, suffix, message",
    [
        ('{"d_modle": 64}', ".json", "unknown training setting"),
        ('{"steps": "ten"}', ".json", "must be a int"),
        ('{"steps": true}', ".json", "must be a int"),
        ("{not json", ".json", "does not parse"),
        ("steps = [1", ".toml", "does not parse"),
        ("[1, 2]", ".json", "one table"),
        ("steps: 3", ".yaml", "must end in .json or .toml"),
        ('{"steps": 0}', ".json", "--steps must be at least 1"),
        ('{"min_lr": 1.0, "lr": 0.1}', ".json", "--min-lr"),
    ],
)
def test_config_errors_are_one_line(tmp_path, content, suffix, message):
    path = tmp_path / f"c{suffix}"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(PipelineError, match=message) as err:
        TrainConfig.from_file(path)
    assert "\n" not in str(err.value)


def test_config_missing_file(tmp_path):
    with pytest.raises(PipelineError, match="not found"):
        load_config_file(tmp_path / "none.json")


def test_config_round_trip_through_dict():
    cfg = TrainConfig(d_model=32, n_heads=2, steps=5, warmup_steps=2)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert TrainConfig.from_dict({"steps": 9}, base=cfg).d_model == 32


# --- the token cache -------------------------------------------------------------------------


def _byte_tokenizer():
    from tokenkit.bpe import Tokenizer

    return Tokenizer([], pattern="none")


def test_token_cache_reused_and_invalidated(tmp_path):
    from tokenkit.bpe import Tokenizer

    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world, hello tokens\n" * 20, encoding="utf-8")
    run = tmp_path / "run"
    byte_tok = _byte_tokenizer()
    first = data.prepare_tokens(corpus, byte_tok, run, quiet=True)
    assert not first.reused and first.ids.dtype == np.uint16
    assert isinstance(first.ids, np.memmap)
    assert first.ids.tolist() == list(corpus.read_bytes())  # byte-level ids are the bytes
    again = data.prepare_tokens(corpus, byte_tok, run, quiet=True)
    assert again.reused and np.array_equal(again.ids, first.ids)

    merged = Tokenizer.train([corpus], vocab_size=260, min_frequency=1, quiet=True)
    other_tok = data.prepare_tokens(corpus, merged, run, quiet=True)
    assert not other_tok.reused and other_tok.ids.tolist() == merged.encode(corpus.read_text(encoding="utf-8"))

    corpus.write_text("a different corpus\n" * 20, encoding="utf-8")
    changed = data.prepare_tokens(corpus, merged, run, quiet=True)
    assert not changed.reused and changed.ids.tolist() == merged.encode(corpus.read_text(encoding="utf-8"))
    assert data.prepare_tokens(corpus, merged, run, quiet=True).reused

    (run / checkpoint.TOKENS_FILE).write_bytes(b"garbage")  # a damaged cache is rebuilt, not trusted
    rebuilt = data.prepare_tokens(corpus, merged, run, quiet=True)
    assert not rebuilt.reused and rebuilt.ids.tolist() == merged.encode(corpus.read_text(encoding="utf-8"))
    meta = json.loads((run / checkpoint.TOKENS_META_FILE).read_text(encoding="utf-8"))[checkpoint.TOKENS_FILE]
    assert (
        meta["corpus_fingerprint"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
        and meta["tokenizer_fingerprint"] == merged.fingerprint()
    )


def test_split_views_are_last_fraction(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(bytes(range(32, 127)) * 3)
    tokens = data.prepare_tokens(corpus, _byte_tokenizer(), tmp_path / "run", quiet=True)
    train, val = tokens.split(0.2, 8)
    n = len(corpus.read_bytes())
    assert len(val) == round(n * 0.2) and np.array_equal(np.concatenate([train, val]), tokens.ids)


# --- checkpoints: a failed or killed save keeps the previous one -----------------------------


def _tiny_model():
    from tokenkit.transformer import GPT, GPTConfig

    return GPT(GPTConfig(vocab_size=256, context_length=8, d_model=16, n_layers=1, n_heads=2), seed=3)


def test_model_checkpoint_round_trip_and_failed_save_keeps_the_old_one(tmp_path, monkeypatch):
    model, tok = _tiny_model(), _byte_tokenizer()
    path = tmp_path / checkpoint.MODEL_FILE
    kwargs = dict(config=model.config.to_dict(), step=7, val_loss=1.5, best_val_loss=1.5, provenance={"corpus": "x"})
    checkpoint.save_model(path, model.params, tok, **kwargs)
    loaded, loaded_tok, meta = checkpoint.load_model(tmp_path)
    assert meta["step"] == 7 and meta["best_val_loss"] == 1.5 and meta["provenance"] == {"corpus": "x"}
    assert loaded_tok.fingerprint() == tok.fingerprint()
    assert all(np.array_equal(loaded.params[k], v) for k, v in model.params.items())

    real_write = safetensors_file.write

    def dies_halfway(f, tensors, metadata):
        real_write(f, tensors, metadata)
        f.truncate(f.tell() // 2)  # leave a torn file behind, as a kill in mid-write would
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors_file, "write", dies_halfway)
    changed = {k: v + 1 for k, v in model.params.items()}
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_model(path, changed, tok, **{**kwargs, "step": 8})
    monkeypatch.undo()
    still, _, meta = checkpoint.load_model(path)
    assert meta["step"] == 7 and all(np.array_equal(still.params[k], v) for k, v in model.params.items())
    assert list(tmp_path.glob(".*.tmp")) == []


def test_load_model_rejects_inconsistent_files(tmp_path):
    from safetensors.numpy import load_file, save_file

    model, tok = _tiny_model(), _byte_tokenizer()
    path = tmp_path / "m.safetensors"
    checkpoint.save_model(
        path, model.params, tok, config=model.config.to_dict(), step=1, val_loss=None, best_val_loss=None, provenance={}
    )
    meta = checkpoint.read_header(path)
    tensors = load_file(str(path))
    broken = tmp_path / "broken.safetensors"
    save_file({k: v for k, v in tensors.items() if k != "ln_f.weight"}, str(broken), metadata=meta)
    with pytest.raises(PipelineError, match="ln_f.weight"):
        checkpoint.load_model(broken)
    save_file(tensors, str(broken), metadata={**meta, "format_version": "99"})
    with pytest.raises(PipelineError, match="version"):
        checkpoint.load_model(broken)
    save_file(tensors, str(broken), metadata={**meta, "tokenizer_fingerprint": "0" * 64})
    with pytest.raises(PipelineError, match="fingerprint"):
        checkpoint.load_model(broken)
    tok.save(tmp_path / "tok.safetensors")
    with pytest.raises(PipelineError, match="tokenizer file, not a model"):
        checkpoint.load_model(tmp_path / "tok.safetensors")


def test_train_state_round_trip_restores_generator_and_optimizer(tmp_path):
    from tokenkit.transformer import AdamW

    model, tok = _tiny_model(), _byte_tokenizer()
    opt = AdamW(model.params, lr=1e-3)
    x = np.random.default_rng(0).integers(0, 256, (2, 8))
    _, grads = model.loss_and_grads(x, x)
    opt.step(grads)
    rng = np.random.default_rng(5)
    rng.random()
    state = train_state.TrainState(
        step=1,
        params=model.params,
        optimizer=opt.state_dict(),
        rng=data.rng_to_array(rng),
        best_val_loss=None,
        best_step=None,
        train_config={"steps": 3},
        model_config=model.config.to_dict(),
        data={"corpus": "c"},
        tokenizer=tok,
    )
    train_state.save_train_state(tmp_path / "s.safetensors", state)
    back = train_state.load_train_state(tmp_path / "s.safetensors")
    assert back.step == 1 and back.train_config == {"steps": 3} and back.best_val_loss is None
    assert back.optimizer.keys() == opt.state_dict().keys()
    assert all(
        np.array_equal(back.optimizer[k], v) and back.optimizer[k].shape == v.shape for k, v in opt.state_dict().items()
    )
    assert data.rng_from_array(back.rng).random() == rng.random()


def test_docstring_examples():
    import doctest

    for module in (sources, data):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_arch_presets_fill_the_settings_not_given():
    """--arch llama sets the variant settings (rotary positions, SwiGLU, RMSNorm, no biases, an
    untied lm_head); settings given beside it win; the model's config comes out as llama_config's,
    and model_settings gives the settings back."""
    llama = TrainConfig.from_dict({"arch": "llama", "n_kv_heads": 2})
    cfg = GPTConfig.from_dict(llama.model_config(vocab_size=300))
    assert cfg.architecture == "llama" and cfg.kv_heads == 2 and cfg.hidden == 384 and not cfg.tie_embeddings
    assert TrainConfig.from_dict(model_settings(cfg) | {"workers": llama.workers}) == llama
    mixed = TrainConfig.from_dict({"positional": "learned", "arch": "llama"})  # the order does not matter
    assert (mixed.positional, mixed.norm_type, mixed.arch) == ("learned", "rmsnorm", "llama")
    assert GPTConfig.from_dict(mixed.model_config(300)).architecture == "custom"
    back = TrainConfig.from_dict({"arch": "gpt2"}, base=llama)
    assert back.positional == "learned" and back.bias and back.n_kv_heads == 2  # a preset's fields only
    assert TrainConfig() == TrainConfig.from_dict({"arch": "gpt2"})
    assert GPTConfig.from_dict(TrainConfig().model_config(300)).to_dict() == dict(
        vocab_size=300,
        context_length=64,
        d_model=128,
        n_layers=2,
        n_heads=4,
        positional="learned",
        activation="gelu",
        norm="pre",
        causal=True,
        bias=True,
    )  # fmt: skip  GPT-2's JSON, as before
    qwen = TrainConfig.from_dict({"arch": "llama", "qkv_bias": True})
    assert GPTConfig.from_dict(qwen.model_config(300)).has_qkv_bias
    for bad, message in (({"arch": "gpt3"}, "--arch must be one of gpt2, llama"),
                         ({"arch": "llama", "n_kv_heads": 3}, "must be divisible by n_kv_heads"),
                         ({"arch": "llama", "d_model": 36, "n_heads": 4}, "rotary positions"),
                         ({"norm_eps": 0.0}, "--norm-eps must be positive")):  # fmt: skip
        with pytest.raises((PipelineError, ModelError), match=message):
            TrainConfig.from_dict(bad)


LLAMA3_SETTINGS = {"arch": "llama", "rope_scaling": "llama3", "rope_factor": 32.0, "rope_low_freq_factor": 1.0,
                   "rope_high_freq_factor": 4.0, "rope_original_context_length": 8192}  # fmt: skip


@pytest.mark.parametrize(
    "settings, scaling",
    [
        (LLAMA3_SETTINGS, dict(type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                               original_context_length=8192)),
        ({"arch": "llama", "rope_scaling": "linear", "rope_factor": 4}, dict(type="linear", factor=4.0)),
        ({"arch": "llama"}, None),
    ],
    ids=["llama3", "linear", "none"],
)  # fmt: skip
def test_rope_scaling_settings_make_the_models_scaling_and_come_back(settings, scaling, tmp_path):
    """--rope-scaling TYPE and its numbers are the model's rope_scaling (its dict: RopeScaling.to_dict);
    model_settings gives the settings back from the model, and they survive a run's record
    (to_dict) and a settings file (JSON and TOML) unchanged."""
    config = TrainConfig.from_dict(settings)
    model = GPTConfig.from_dict(config.model_config(300))
    assert (model.rope_scaling and model.rope_scaling.to_dict()) == scaling
    assert TrainConfig.from_dict(model_settings(model) | {"workers": config.workers}) == config
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    (tmp_path / "s.json").write_text(json.dumps(settings), encoding="utf-8")
    assert TrainConfig.from_file(tmp_path / "s.json") == config
    toml = "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items())
    (tmp_path / "s.toml").write_text(toml, encoding="utf-8")
    assert TrainConfig.from_file(tmp_path / "s.toml") == config
    # a run recorded before these settings existed reads as unscaled
    old = {k: v for k, v in config.to_dict().items() if not k.startswith("rope_") or k == "rope_theta"}
    assert TrainConfig.from_dict(old).rope_scaling == "none"


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"rope_factor": 8.0}, "--rope-factor 8 needs --rope-scaling linear or llama3 (it is none)"),
        ({"arch": "llama", "rope_scaling": "linear", "rope_factor": 2.0, "rope_original_context_length": 16},
         "--rope-original-context-length 16 needs --rope-scaling llama3 (it is linear)"),
        ({"rope_scaling": "linear", "rope_factor": 2.0}, "--rope-scaling linear stretches rotary positions, and "
         "--positional is learned; give --positional rope (or --arch llama)"),
        ({"arch": "llama", "rope_scaling": "llama3"}, "--rope-scaling llama3 needs a --rope-factor above 1"),
        ({**LLAMA3_SETTINGS, "rope_high_freq_factor": 1.0},
         "--rope-high-freq-factor (1) must be above --rope-low-freq-factor (1)"),
        ({"arch": "llama", "rope_scaling": "yarn"}, "--rope-scaling must be one of none, linear, llama3, got 'yarn'"),
        ({"rope_scaling": None}, "training setting 'rope_scaling' must be a str, got None"),
        ({"rope_factor": 0.5}, "--rope-factor must be at least 1, got 0.5"),
        ({"rope_factor": float("nan")}, "--rope-factor must be a finite number"),
        ({"rope_factor": 2e6}, "--rope-factor must be at most 1,000,000"),
        ({"rope_low_freq_factor": 0.0}, "--rope-low-freq-factor must be positive"),
        ({"rope_original_context_length": 0}, "--rope-original-context-length must be at least 1"),
        ({"rope_original_context_length": 1 << 17}, "--rope-original-context-length must be at most 65,536"),
        ({"rope_original_context_length": 8.5}, "'rope_original_context_length' must be a int"),
    ],
)  # fmt: skip
def test_bad_rope_scaling_settings_are_one_line(bad, message):
    with pytest.raises(PipelineError) as caught:
        TrainConfig.from_dict(bad)
    assert message in str(caught.value) and "\n" not in str(caught.value)
