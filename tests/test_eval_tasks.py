"""`tk eval -m MODEL --task TASK.jsonl`: the batched scorer against one forward pass per choice
(lm-evaluation-harness's encoding and truncation, transcribed), acc and acc_norm against a count
by hand, every bad input in one line, and the bundled task against its generator. With torch and
transformers installed, the log-likelihoods of an exported model agree with transformers'."""

from __future__ import annotations

import json
import math
import os
import random
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import random_model

from tokenkit.bpe import Tokenizer
from tokenkit.cli.main import main
from tokenkit.pipeline import choices as choices_module
from tokenkit.pipeline.choices import Item, Scores, encode_pair, read_task, score_items
from tokenkit.pipeline.errors import PipelineError
from tokenkit.transformer import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT / "corpora"
WORDS = ["the", "fox", "ran", "up", "a", "hill", "Zoë", "named", "Léa", "and", "sang", "\n"]
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(4000))
    return Tokenizer.train([text.encode()], vocab_size=300, special_tokens=[EOT], quiet=True)


def random_text(rng: random.Random, n_words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(n_words))
    return text + rng.choice(["", " ", "  ", "\n", ","])  # ends with whitespace at times: it moves to the choice


def random_items(rng: random.Random, n: int, long_words: int, tok: Tokenizer) -> list[Item]:
    """Contexts with and without end whitespace (some empty), choices with and without a leading
    space; a choice that would add no token after its context (it merges into the context's last
    token: a one-line error) is drawn again."""
    items = []
    for line in range(1, n + 1):
        context = "" if rng.random() < 0.1 else random_text(rng, rng.randint(1, long_words))
        opts = []
        while len(opts) < rng.randint(1, 5) or not opts:
            choice = rng.choice(["", " "]) + " ".join(rng.choice(WORDS[:-1]) for _ in range(rng.randint(1, 4)))
            if lm_eval_pair(tok, context, choice)[1]:
                opts.append(choice)
        items.append(Item(context, tuple(opts), rng.randrange(len(opts)), line))
    return items


# --- the scores against a plain reference ---------------------------------------------------------


def lm_eval_pair(tok: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-evaluation-harness's `TemplateLM.loglikelihood` and `_encode_pair`, transcribed: an empty
    context is the end-of-text token; the context's end whitespace moves to the continuation,
    whose tokens are those of the whole after as many as the context's."""
    if context == "":
        return [tok.special_tokens[EOT]], tok.encode(continuation)
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    if context == "":  # a context of whitespace alone: lm-evaluation-harness would give the first token nothing
        return [tok.special_tokens[EOT]], tok.encode(continuation)
    whole = tok.encode(context + continuation)
    ctx = tok.encode(context)
    return ctx, whole[len(ctx) :]


def reference(model: GPT, tok: Tokenizer, item: Item) -> tuple[list[float], list[bool]]:
    """Each choice alone: HFLM's window (the last max_length + 1 tokens, less the last), one
    forward pass, the log-softmax by hand at the choice's positions."""
    T = model.config.context_length
    lls, greedy = [], []
    for choice in item.choices:
        ctx, cont = lm_eval_pair(tok, item.context, choice)
        inp = (ctx + cont)[-(T + 1) :][:-1]
        logits = model.forward(np.array([inp]))[0].astype(np.float64)
        total, all_greedy = 0.0, True
        for k, target in enumerate(cont):
            row = logits[len(inp) - len(cont) + k]
            total += row[target] - (np.log(np.exp(row - row.max()).sum()) + row.max())
            all_greedy &= int(np.argmax(row)) == target
        lls.append(total)
        greedy.append(all_greedy)
    return lls, greedy


def tiny_model(tok: Tokenizer, seed: int, dtype=np.float64, **config) -> GPT:
    settings = {"context_length": 16, "d_model": 16, "n_layers": 2, "n_heads": 2, **config}
    model = GPT(GPTConfig(vocab_size=tok.vocab_size + seed % 3, **settings), seed=seed)  # padded vocabularies too
    rng = np.random.default_rng(seed)
    model.params = {k: rng.normal(0.0, 0.5, v.shape).astype(dtype) for k, v in model.params.items()}
    return model


@pytest.mark.parametrize("seed", range(4))
def test_batched_scores_equal_one_forward_per_choice(tok, seed, monkeypatch):
    rng = random.Random(seed)
    variant = [{}, {"norm": "pre"}, {"positional": "rope"}, {"activation": "relu", "bias": False}][seed]
    model = tiny_model(tok, seed, **variant)
    items = random_items(rng, 25, long_words=12, tok=tok)  # contexts up to ~20 tokens: past the window of 16
    monkeypatch.setattr(choices_module, "LOGITS_BYTES", rng.choice([1, 16 * model.config.vocab_size * 4 * 7]))
    seen = []
    scores = score_items(model, tok, items, progress=seen.append)
    assert sum(seen) == sum(len(i.choices) for i in items)
    for item, lls, greedy, tokens in zip(items, scores.loglikelihoods, scores.greedy, scores.tokens, strict=True):
        want, want_greedy = reference(model, tok, item)
        np.testing.assert_allclose(lls, want, rtol=1e-9, atol=1e-9)
        assert list(greedy) == want_greedy
        assert list(tokens) == [len(lm_eval_pair(tok, item.context, c)[1]) for c in item.choices]
    T = model.config.context_length
    cut = sum(
        any(sum(map(len, lm_eval_pair(tok, i.context, c))) > T + 1 for c in i.choices) for i in items
    )  # items whose context lost its start
    assert scores.truncated == cut and cut > 0


def test_float32_model_is_within_1e_5_of_the_reference(tok):
    model = tiny_model(tok, 5, dtype=np.float32)
    items = random_items(random.Random(5), 30, long_words=10, tok=tok)
    scores = score_items(model, tok, items)
    for item, lls in zip(items, scores.loglikelihoods, strict=True):
        np.testing.assert_allclose(lls, reference(model, tok, item)[0], rtol=1e-5, atol=1e-5)


def test_the_split_is_lm_evaluation_harness_s(tok):
    rng = random.Random(9)
    for _ in range(300):
        context, choice = random_text(rng, rng.randint(1, 6)), random_text(rng, rng.randint(1, 3))
        assert encode_pair(tok, context, choice, {}, tok.special_tokens[EOT]) == lm_eval_pair(tok, context, choice)
    with_bos = Tokenizer([], special_tokens=["<s>"], bos="<s>")
    assert encode_pair(with_bos, "", "hi", {}, None) == ([256], [104, 105])  # an empty context reads the BOS
    assert encode_pair(with_bos, "a ", "b", {}, None) == ([256, 97], [32, 98])
    with pytest.raises(PipelineError, match="context is empty"):
        encode_pair(Tokenizer([]), "", "hi", {}, None)


# --- acc and acc_norm -----------------------------------------------------------------------------


def test_acc_and_acc_norm_by_hand():
    items = [
        Item("c", ("ab", "abcd"), 1, 1),  # -2 vs -3: acc picks 0; per byte -1 vs -0.75: acc_norm picks 1
        Item("c", ("é", "ee"), 1, 2),  # é is 2 bytes, 1 character: per byte -1.5 vs -2.5 (per character -3 vs -2.5)
        Item("c", ("x", "y", "z"), 2, 3),  # ties: the first of equals, as np.argmax
        Item("c", ("x", "yy"), 0, 4),  # -1 vs -4: both pick 0
    ]
    lls = [np.array(v, dtype=np.float64) for v in ([-2.0, -3.0], [-3.0, -5.0], [-1.0, -5.0, -1.0], [-1.0, -4.0])]
    scores = Scores(items, lls, [np.zeros(len(v), bool) for v in lls], [np.ones(len(v), int) for v in lls])
    assert scores.picks().tolist() == [0, 0, 0, 0]
    assert scores.picks_norm().tolist() == [1, 0, 0, 0]
    assert scores.acc == 1 / 4 and scores.acc_norm == 2 / 4
    doc = scores.to_dict()
    assert doc["acc_stderr"] == pytest.approx(math.sqrt(0.25 * 0.75 * 4 / 3 / 4))  # sample std (n - 1) / sqrt(n)
    assert doc["acc_norm_stderr"] == pytest.approx(math.sqrt(0.5 * 0.5 * 4 / 3 / 4))
    assert [e["pick_norm"] for e in doc["items"]] == [1, 0, 0, 0] and doc["n"] == 4 and doc["choices"] == 9


@pytest.fixture(scope="module")
def model_file(tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "model.safetensors"
    return path, random_model(path, tok, seed=2)  # windows of 32


def write_task(path: Path, items: list[dict] | list[str]) -> Path:
    lines = [i if isinstance(i, str) else json.dumps(i, ensure_ascii=False) for i in items]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_command_figures_are_the_count_by_hand(tok, model_file, tmp_path, capsys):
    path, model = model_file
    rng = random.Random(3)
    items = [
        {"context": random_text(rng, rng.randint(2, 8)), "choices": [" fox", " hill", " Léa"], "gold": rng.randrange(3)}
        for _ in range(40)
    ]
    for i, item in enumerate(items):
        item["kind"] = ["a", 7, "b"][i % 3]  # a number groups as its text
    task = write_task(tmp_path / "t.jsonl", items)
    assert main(["eval", "-m", str(path), "--task", str(task), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n"] == 40 and doc["choices"] == 120 and doc["context"] == 32 and doc["truncated"] == 0
    right = right_norm = 0
    for item, got in zip(items, doc["items"], strict=True):
        want = reference(model, tok, Item(item["context"], tuple(item["choices"]), item["gold"], 0))[0]
        np.testing.assert_allclose(got["loglikelihoods"], want, rtol=1e-5)
        lls = got["loglikelihoods"]
        per_byte = [ll / len(c.encode()) for ll, c in zip(lls, item["choices"], strict=True)]
        right += lls.index(max(lls)) == item["gold"]
        right_norm += per_byte.index(max(per_byte)) == item["gold"]
    assert doc["acc"] == right / 40 and doc["acc_norm"] == right_norm / 40
    assert 0 < right < 40 or right_norm not in (0, 40)  # a random model: the figures are not all one way
    assert main(["eval", "-m", str(path), "--task", str(task)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "items:     40 (120 choices)"
    assert out[1].startswith(f"acc:       {right / 40:.4f} ± ") and out[1].endswith(f"({right} of 40)")
    assert out[2].startswith(f"acc_norm:  {right_norm / 40:.4f} ± ")

    assert main(["eval", "-m", str(path), "--task", str(task), "--group-by", "kind", "--json"]) == 0
    grouped = json.loads(capsys.readouterr().out)
    assert list(grouped["groups"]) == ["a", "7", "b"] and grouped["acc"] == doc["acc"]
    for g, figures in grouped["groups"].items():
        mine = [e for e in grouped["items"] if e["group"] == g]
        assert figures["n"] == len(mine) == sum(str(i["kind"]) == g for i in items)
        assert figures["acc"] == sum(e["pick"] == e["gold"] for e in mine) / len(mine)
        assert figures["acc_norm"] == sum(e["pick_norm"] == e["gold"] for e in mine) / len(mine)
    assert main(["eval", "-m", str(path), "--task", str(task), "--group-by", "kind"]) == 0
    text = capsys.readouterr().out
    assert "\nkind 7: 13 items\nacc:" in text and text.count("acc_norm:") == 4


def test_long_contexts_keep_their_last_tokens_and_say_so_once(tok, model_file, tmp_path, capsys):
    path, model = model_file
    long = " ".join(["the fox ran up a hill"] * 30)  # far past the window of 32
    items = [
        {"context": long, "choices": [" and", " sang"], "gold": 0},
        {"context": "the fox", "choices": [" ran", " sang"], "gold": 0},
        {"context": "a " + long, "choices": [" hill", " fox"], "gold": 1},
    ]
    task = write_task(tmp_path / "t.jsonl", items)
    assert main(["eval", "-m", str(path), "--task", str(task)]) == 0
    err = capsys.readouterr().err
    assert err.count("did not fit in the model's context") == 1 and "2 items did not fit" in err, err
    assert main(["eval", "-m", str(path), "--task", str(task), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["truncated"] == 2
    # the first item scores as a context of its last tokens alone: 33 tokens with the choice's one
    ctx, cont = lm_eval_pair(tok, long, " and")
    kept = tok.decode(ctx[-(32 + 1 - len(cont)) :])
    short = score_items(model, tok, [Item(kept, (" and",), 0, 1)])
    assert short.truncated == 0
    assert doc["items"][0]["loglikelihoods"][0] == pytest.approx(float(short.loglikelihoods[0][0]), rel=1e-6)


# --- bad input: one line, exit 1 ------------------------------------------------------------------

GOOD = '{"context": "the fox", "choices": [" ran", " sang"], "gold": 0}'
BAD_LINES = [
    ("not JSON", "{context: 1}", "line 2 is not valid JSON (Expecting property name enclosed in double quotes, column"),
    ("not an object", "[1, 2]", "line 2: a JSON list, not an object"),
    ("no context", '{"choices": [" a"], "gold": 0}', "line 2: no 'context'"),
    ("no keys", "{}", "line 2: no 'context' or 'choices' or 'gold'"),
    ("no gold", '{"context": "a", "choices": [" a"]}', "line 2: no 'gold'"),
    ("gold too big", '{"context": "a", "choices": [" a", " b"], "gold": 2}', "line 2: gold is 2; give the index"),
    ("gold negative", '{"context": "a", "choices": [" a"], "gold": -1}', "line 2: gold is -1"),
    ("gold a bool", '{"context": "a", "choices": [" a", " b"], "gold": true}', "line 2: gold is True"),
    ("gold a float", '{"context": "a", "choices": [" a", " b"], "gold": 1.0}', "line 2: gold is 1.0"),
    ("gold a string", '{"context": "a", "choices": [" a"], "gold": "0"}', "line 2: gold is a string"),
    ("empty choices", '{"context": "a", "choices": [], "gold": 0}', "line 2: the choices are none"),
    ("choices a string", '{"context": "a", "choices": " a", "gold": 0}', "line 2: the choices are a string"),
    ("a number choice", '{"context": "a", "choices": [" a", 3], "gold": 0}', "line 2: choice 1 is a number"),
    ("an empty choice", '{"context": "a", "choices": [" a", ""], "gold": 0}', "line 2: choice 1 is empty"),
    ("context a list", '{"context": ["a"], "choices": [" a"], "gold": 0}', "line 2: the context is a list"),
    ("a lone surrogate", '{"context": "a\\ud800", "choices": [" a"], "gold": 0}', "line 2: the context holds a lone"),
    ("nested deep", '{"context": "a", "choices": [" a"], "gold": 0, "x": ' + "[" * 99 + "]" * 99 + "}", "line 2"),
    ("no group", '{"context": "a", "choices": [" a"], "gold": 0, "kind": null}', "line 2: no string or number at"),
    ("special text", '{"context": "a <|endoftext|>", "choices": [" a"], "gold": 0}', "line 2: "),
]


def one_line(capsys, argv, fragment) -> None:
    assert main([str(a) for a in argv]) == 1
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert captured.out == ""


@pytest.mark.parametrize("case, line, fragment", BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_a_bad_line_is_one_line_naming_it(model_file, tmp_path, capsys, case, line, fragment):
    good = GOOD.replace("}", ', "kind": "k"}')
    task = write_task(tmp_path / "t.jsonl", [good, line, good])
    one_line(capsys, ["eval", "-m", model_file[0], "--task", task, "--group-by", "kind"], fragment)


def test_not_utf8_is_one_line(model_file, tmp_path, capsys):
    task = tmp_path / "t.jsonl"
    task.write_bytes(GOOD.encode() + b'\n{"context": "\xff", "choices": [" a"], "gold": 0}\n')
    one_line(capsys, ["eval", "-m", model_file[0], "--task", task], "line 2 is not UTF-8")


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("empty", "holds no items"),
        ("blank", "holds no items"),
        ("directory", "is a directory"),
        ("fifo", "is a FIFO (named pipe), not a regular file"),  # nobody writes it: refused, not waited on
        ("device", "is a character device, not a regular file"),
        ("missing", "no such file"),
        ("huge", "more than a task file"),
        ("long choice", "line 1: choice 0 is 41 tokens, more than the model's context (32)"),
        ("merged choice", "line 1: choice 0 adds no token after the context"),
        ("empty context", "line 1: the context is empty and the tokenizer has no BOS"),
    ],
)
def test_bad_files_are_one_line(model_file, tmp_path, capsys, monkeypatch, case, fragment):
    model = model_file[0]
    task = tmp_path / "t.jsonl"
    if case == "empty":
        task.write_bytes(b"")
    elif case == "blank":
        task.write_bytes(b"\n  \n\n")
    elif case == "directory":
        task.mkdir()
    elif case == "fifo":
        os.mkfifo(task)
    elif case == "device":
        task.symlink_to("/dev/zero")
    elif case == "huge":
        write_task(task, [GOOD] * 10)
        monkeypatch.setattr(choices_module, "MAX_TASK_BYTES", 100)
    elif case == "long choice":
        write_task(task, [{"context": "a", "choices": [" " + "zq" * 20], "gold": 0}])
    elif case in ("merged choice", "empty context"):
        plain = Tokenizer.train([b"abc abc abc abc"], vocab_size=258, pattern="none", quiet=True)  # ab, abc
        assert plain.encode("abc") == [257] and plain.encode("ab") == [256]
        model = tmp_path / "plain.safetensors"
        random_model(model, plain)
        write_task(task, [{"context": "" if case == "empty context" else "ab", "choices": ["c"], "gold": 0}])
    one_line(capsys, ["eval", "-m", model, "--task", task], fragment)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--task", "{task}"], "give -m MODEL too"),
        (["-m", "{model}", "--task", "{task}", "{task}"], "not both"),
        (["-m", "{model}", "--task", "{task}", "--stride", "4"], "--task reads its own file"),
        (["-m", "{model}", "--task", "{task}", "--text-field", "x"], "--task reads its own file"),
        (["-m", "{model}", "--task", "{task}", "--by-language"], "--task reads its own file"),
        (["-m", "{model}"], "give the FILE... to evaluate on"),
    ],
)
def test_flags_that_do_not_fit_are_one_line(model_file, tmp_path, capsys, args, fragment):
    task = write_task(tmp_path / "t.jsonl", [GOOD])
    one_line(capsys, ["eval", *(a.format(task=task, model=model_file[0]) for a in args)], fragment)


def test_read_task_skips_blank_lines_and_keeps_line_numbers(tmp_path):
    task = tmp_path / "t.jsonl"
    task.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\n\n" + GOOD.replace("0}", '1, "kind": "x"}').encode())
    items = read_task(task)
    assert [(i.line, i.gold, i.choices) for i in items] == [(1, 0, (" ran", " sang")), (3, 1, (" ran", " sang"))]


# --- the bundled task -----------------------------------------------------------------------------


def test_bundled_task_is_its_generator_s_output():
    made = subprocess.run(
        [sys.executable, str(CORPORA / "make_tales_task.py"), "-o", "-"], capture_output=True, check=True
    )
    assert made.stdout == (CORPORA / "tiny_tales_task.jsonl").read_bytes()


def test_bundled_task_asks_what_its_held_out_stories_tell():
    lines = (CORPORA / "tiny_tales_task.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert 200 <= len(records) <= 300 and {r["kind"] for r in records} == {"hero", "found", "day"}
    held_out = (CORPORA / "tiny_tales_test.txt").read_text(encoding="utf-8").split("\n\n")
    trained = set((CORPORA / "tiny_tales.txt").read_text(encoding="utf-8").split("\n\n"))
    days = runpy.run_path(str(CORPORA / "make_tiny_tales.py"))["DAYS"]
    for r in records:
        story = next(s for s in held_out if s.startswith(r["context"]))  # the context is a held-out story's start
        assert story.strip() not in trained
        words = [c.strip() for c in r["choices"]]
        gold, others = words[r["gold"]], words[: r["gold"]] + words[r["gold"] + 1 :]
        assert len(set(r["choices"])) == 4 and story[len(r["context"]) :].startswith(" " + gold)
        if r["kind"] == "day":  # the day after the one the story names
            assert f"On {days[days.index(gold) - 1]}, " in r["context"]
            assert not any(f"On {days[days.index(o) - 1]}, " in r["context"] for o in others)
        else:  # the answer is in the story before the question, and no other choice is
            assert re.search(rf"\b{gold}\b", r["context"])
            assert not any(re.search(rf"\b{o}\b", r["context"]) for o in others)
    assert (CORPORA / "tiny_tales_task.jsonl").stat().st_size < 200_000


# --- agreement with transformers ------------------------------------------------------------------


@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def test_loglikelihoods_equal_transformers_on_the_export(transformers, tok, model_file, tmp_path, capsys):
    """lm-evaluation-harness's HFLM on the exported model, transcribed: its tokenizer's split of
    each pair, the window of the last 33 tokens less the last, log_softmax and gather."""
    import torch

    path, _ = model_file
    assert main(["export-hf", str(path), "-o", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")

    def encode(text: str) -> list[int]:
        return hf_tok(text, add_special_tokens=False)["input_ids"]

    rng = random.Random(11)
    items = random_items(rng, 30, long_words=30, tok=tok)
    task = write_task(
        tmp_path / "t.jsonl", [{"context": i.context, "choices": list(i.choices), "gold": i.gold} for i in items]
    )
    assert main(["eval", "-m", str(path), "--task", str(task), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for item, got in zip(items, doc["items"], strict=True):
        for choice, ll, greedy in zip(item.choices, got["loglikelihoods"], got["is_greedy"], strict=True):
            context, cont_text = item.context, choice
            if context == "":
                ctx, cont = [hf_tok.eos_token_id], encode(cont_text)
            else:
                n = len(context) - len(context.rstrip())
                if n:
                    context, cont_text = context[:-n], context[-n:] + cont_text
                whole = encode(context + cont_text)
                ctx = encode(context)
                cont = whole[len(ctx) :]
            inp = (ctx + cont)[-(32 + 1) :][:-1]
            with torch.no_grad():
                logits = torch.log_softmax(hf_model(torch.tensor([inp])).logits[0].double(), -1)
            picked = logits[len(inp) - len(cont) :]
            theirs = float(picked.gather(1, torch.tensor(cont)[:, None]).sum())
            assert ll == pytest.approx(theirs, abs=1e-4, rel=1e-4)
            assert greedy == bool((picked.argmax(-1) == torch.tensor(cont)).all())


def test_docstring_examples():
    import doctest

    result = doctest.testmod(choices_module)
    assert result.failed == 0 and result.attempted > 0
