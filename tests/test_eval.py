"""`tk eval -m`: the sliding windows against transformers' perplexity guide's loop, the scores
against a plain token-by-token reference, and the command's figures and one-line errors."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from conftest import random_model

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.evaluate import score_documents, score_texts, windows
from tokenkit.transformer import GPT, GPTConfig


def guide_scored(n: int, max_length: int, stride: int) -> list[tuple[int, int, list[int]]]:
    """transformers' perplexity guide, transcribed: (begin, end, positions whose labels count)."""
    out, prev_end = [], 0
    for begin in range(0, n, stride):
        end = min(begin + max_length, n)
        trg_len = end - prev_end
        labels = list(range(begin, end))
        labels = [-100] * (len(labels) - trg_len) + labels[len(labels) - trg_len :] if trg_len < len(labels) else labels
        # the model shifts: logits at i predict labels at i + 1, so the window's first label never counts
        counted = [p for p in labels[1:] if p != -100]
        out.append((begin, end, counted))
        prev_end = end
        if end == n:
            break
    return out


@pytest.mark.parametrize("seed", range(3))
def test_windows_are_the_guide_s_and_score_every_token_after_the_first_once(seed):
    rng = random.Random(seed)
    for _ in range(400):
        context = rng.randint(1, 40)
        stride, n = rng.randint(1, context), rng.randint(0, 200)
        got = windows(n, context, stride)
        guide = [g for g in guide_scored(n, context, stride) if g[2]]
        assert [(w.begin, w.end, list(range(w.first, w.end))) for w in got] == guide
        scored = [p for w in got for p in range(w.first, w.end)]
        if stride < context:  # every token after the first, once
            assert scored == list(range(1, n)), (n, context, stride)
        else:  # disjoint windows: each one's first token has nothing before it in its window
            assert scored == [p for p in range(1, n) if p % context], (n, context, stride)
        assert all(w.end - w.begin <= context for w in got)
    with pytest.raises(PipelineError, match="stride"):
        windows(10, 4, 5)


def _reference_nats(model, ids, context, stride) -> float:
    """Each scored token alone: a forward pass over the window's tokens before it, its log-softmax."""
    total = 0.0
    for begin, _end, counted in guide_scored(len(ids), context, stride):
        for p in counted:
            logits = model.forward(np.array([ids[begin:p]]))[0, -1].astype(np.float64)
            total += float(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[ids[p]])
    return total


@pytest.mark.parametrize("stride", [1, 3, 8])
def test_scores_equal_a_token_by_token_reference(stride):
    config = GPTConfig(vocab_size=23, context_length=8, d_model=16, n_layers=2, n_heads=2)
    model = GPT(config, seed=3)
    model.params = {k: v.astype(np.float64) for k, v in model.params.items()}
    rng = np.random.default_rng(stride)
    docs = [rng.integers(0, 23, n).tolist() for n in (1, 2, 5, 8, 9, 30, 17)]
    score = score_documents(model, [(d, 3 * len(d)) for d in docs], stride=stride)
    expected = sum(_reference_nats(model, d, 8, stride) for d in docs)
    assert score.nats == pytest.approx(expected, rel=1e-12)
    assert score.tokens == sum(len(g[2]) for d in docs for g in guide_scored(len(d), 8, stride))
    assert score.documents == 6 and score.skipped == 1
    assert score.bytes == 3 * sum(len(d) for d in docs if len(d) > 1)
    assert score.bits_per_byte == pytest.approx(expected / math.log(2) / score.bytes, rel=1e-12)
    assert score.perplexity == pytest.approx(math.exp(expected / score.tokens), rel=1e-12)


def test_no_document_is_read_across():
    """Two documents score as the sum of each alone: no window crosses the boundary."""
    config = GPTConfig(vocab_size=23, context_length=8, d_model=16, n_layers=1, n_heads=2)
    model = GPT(config, seed=4)
    model.params = {k: v.astype(np.float64) for k, v in model.params.items()}
    a, b = list(range(1, 12)), list(range(3, 20))
    both = score_documents(model, [(a, 11), (b, 17)], stride=4)
    alone = [score_documents(model, [(d, len(d))], stride=4) for d in (a, b)]
    assert both.nats == pytest.approx(sum(s.nats for s in alone), rel=1e-12)
    assert both.tokens == sum(s.tokens for s in alone)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    words = ["the", "fox", "ran", "up", "a", "hill"]
    text = " ".join(random.Random(0).choice(words) for _ in range(3000))
    tok = Tokenizer.train([text.encode()], vocab_size=300, quiet=True)
    path = tmp_path_factory.mktemp("eval") / "model.safetensors"
    return path, tok, random_model(path, tok, seed=1)


def test_eval_command_prints_what_the_api_computes(model_file, tmp_path, capsys):
    path, tok, model = model_file
    texts = ["the fox ran up a hill " * 20, "a hill", "up the hill ran the fox " * 9]
    for i, t in enumerate(texts):
        (tmp_path / f"{i}.txt").write_text(t, encoding="utf-8")
    assert main(["eval", "-m", str(path), str(tmp_path), "--stride", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    score = score_texts(model, tok, [t.encode() for t in texts], {}, stride=8)
    assert doc["tokens"] == score.tokens and doc["bytes"] == sum(len(t) for t in texts)
    assert doc["loss"] == pytest.approx(score.loss, rel=1e-6)
    assert doc["bits_per_byte"] == pytest.approx(score.bits_per_byte, rel=1e-6)
    assert doc["perplexity"] == pytest.approx(score.perplexity, rel=1e-6)
    assert doc["stride"] == 8 and doc["context"] == 32 and doc["documents"] == 3

    assert main(["eval", "-m", str(path), str(tmp_path / "0.txt")]) == 0
    out = capsys.readouterr().out
    assert "bits per byte:" in out and "nats per token" in out and "stride 16" in out


@pytest.mark.parametrize(
    "case, args, message",
    [
        ("empty", ["{empty}"], "empty"),
        ("short", ["{short}"], "shorter than two tokens"),
        ("stride", ["{text}", "--stride", "33"], "--stride 33 is more than the model's context (32)"),
        ("tokenizer", ["{text}", "-t", "{other}"], "tokens"),
        ("missing", ["{missing}"], "missing"),
    ],
)
def test_bad_input_is_one_line(model_file, tmp_path, capsys, case, args, message):
    path, tok, _ = model_file
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "short.txt").write_text("a", encoding="utf-8")
    (tmp_path / "text.txt").write_text("the fox ran up a hill", encoding="utf-8")
    Tokenizer([]).save(tmp_path / "other.safetensors")
    names = {
        "empty": tmp_path / "empty.txt",
        "short": tmp_path / "short.txt",
        "text": tmp_path / "text.txt",
        "other": tmp_path / "other.safetensors",
        "missing": tmp_path / "missing.txt",
    }
    argv = ["eval", "-m", str(path), *(a.format(**names) for a in args)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("stride", [8, 16, 32])
def test_the_loss_equals_transformers_guide_on_the_exported_model(model_file, tmp_path, capsys, stride):
    """transformers' perplexity guide, run as it is written on the `tk export-hf` model (its
    tokenizer's ids, windows of the context, labels -100 where a window overlaps the last, the
    model's own mean loss weighted by the scored tokens): tk eval's loss within 1e-5 relative."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path, _, _ = model_file
    assert main(["export-hf", str(path), "-o", str(tmp_path / "hf")]) == 0
    text = "the fox ran up a hill and the hill ran up the fox " * 12
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    capsys.readouterr()
    assert main(["eval", "-m", str(path), str(tmp_path / "t.txt"), "--stride", str(stride), "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(text)["input_ids"]])
    n, nll, counted, prev_end = ids.size(1), 0.0, 0, 0
    for begin in range(0, n, stride):  # the guide's loop
        end = min(begin + 32, n)
        trg_len = end - prev_end
        input_ids = ids[:, begin:end]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            loss = model(input_ids, labels=target_ids).loss
        scored = int((target_ids[:, 1:] != -100).sum())
        nll += float(loss) * scored
        counted += scored
        prev_end = end
        if end == n:
            break
    assert ours["tokens"] == counted
    assert ours["loss"] == pytest.approx(nll / counted, rel=1e-5)
