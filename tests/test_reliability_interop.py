"""Interop edges (issue 20): directories transformers re-saved, overlapping special tokens, and
special tokens in the prompts of predict-next, generate and explain.

2. Special tokens one of which begins another (`<a>`, `<a><b>`): tk reads the longest at a
   position, as HF tokenizers and transformers do (checked); tiktoken tries its specials in its
   hash map's order, so a tiktoken export or import of such a set is refused. Specials that only
   share a prefix (`<|end|>`, `<|endoftext|>`) or overlap (`ab`, `bc`) give the same ids in all.
3. `--allow-special` / `--specials-as-text` on predict-next, generate, explain and pipeline
   --prompt: refused by default in one line naming the command's flags, and with the flag the
   model sees the special's id.

The libraries are used where installed (`pip install -e '.[interop]'`) and skipped otherwise.
Nothing is downloaded: tokenizers and models are made here.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from tokenkit.bpe import DisallowedSpecialError, Tokenizer, TokenizerError
from tokenkit.cli.main import main
from tokenkit.pipeline import checkpoint
from tokenkit.pipeline.run import generate, predict_next
from tokenkit.transformer import GPT, GPTConfig

ROOT = Path(__file__).parents[1]
EOT, BOS = "<|endoftext|>", "<|begin_of_text|>"
TEXTS = [
    "Once upon a time, there was a fox.",
    " leading space and  two  spaces\n\n\ttab",
    "numbers 1234567 and 3.14, it's don't",
    "naïve café 日本語 😀",
    f"The end.{EOT}Once upon a time{EOT}",
    f"{BOS}hello",
]


def corpus() -> bytes:
    return (ROOT / "corpora" / "tiny_tales.txt").read_bytes()[:40_000] + "naïve café 日本語 1234567 😀".encode() * 20


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def tok(request) -> Tokenizer:
    return Tokenizer.train(
        [corpus()], vocab_size=380, pattern=request.param, special_tokens=[EOT, BOS], quiet=True, workers=1
    )


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def no_tiktoken_cache(monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken caches files by path; read ours fresh


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(result: tuple[int, str, str], *fragments: str) -> str:
    code, _, err = result
    assert code == 1, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err
    return err


def tk_ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, allowed_special="all")  # the libraries read every special token


# ---------------------------------------------------------------------------------------------
# 2. overlapping special tokens

PREFIX_SETS = [["<a>", "<a><b>", "<b>"], ["zz", "zzz"]]  # one special begins another
OVERLAP_SETS = [["<|end|>", EOT], ["ab", "bc"], ["<|end|>", EOT, "<s>", "</s>"]]  # none begins another
OVERLAP_TEXTS = [
    "<a>", "<a><b>", "x<a><b>y", "<a><a><b><b>", "<a><b><a>", "<b><a>",
    "zz", "zzz", "zzzzz", "a zz zzz zzzz",
    "<|end|>", EOT, f"<|end|>{EOT}", f"{EOT}<|end|>", f"<|end{EOT}", "<|end|><|endoftext",
    "abc", "abbc", "xabcx", "bcab", "<s></s>", "</s><s>",
]  # fmt: skip


def specials_tok(names: list[str]) -> Tokenizer:
    return Tokenizer.train([corpus()], vocab_size=330, special_tokens=names, quiet=True, workers=1)


@pytest.mark.parametrize("names", PREFIX_SETS + OVERLAP_SETS, ids=str)
def test_hf_reads_overlapping_specials_as_tk_does(names, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = specials_tok(names)
    tok.export_hf(tmp_path)
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in OVERLAP_TEXTS:
        assert hf.encode(text).ids == tk_ids(tok, text), text
    try:
        import transformers
    except ImportError:
        return
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in OVERLAP_TEXTS:
        assert auto(text).input_ids == tk_ids(tok, text), text


@pytest.mark.parametrize("names", OVERLAP_SETS, ids=str)
def test_tiktoken_reads_specials_that_do_not_begin_one_another_as_tk_does(names, tmp_path):
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    tok = specials_tok(names)
    tok.export_tiktoken(tmp_path)
    meta = json.loads((tmp_path / "tokenizer_tiktoken.json").read_text(encoding="utf-8"))
    enc = tiktoken.Encoding(
        "t",
        pat_str=meta["pat_str"],
        mergeable_ranks=load_tiktoken_bpe(str(tmp_path / "tokenizer.tiktoken")),
        special_tokens=meta["special_tokens"],
    )
    for text in OVERLAP_TEXTS:
        assert enc.encode(text, allowed_special="all") == tk_ids(tok, text), text
        for one in names:  # one allowed, the others plain text: tiktoken skips matches it may not read
            assert enc.encode(text, allowed_special={one}, disallowed_special=()) == tok.encode(
                text, allowed_special={one}, disallowed_special=()
            ), (text, one)


def test_tiktoken_does_not_read_the_longest_special():
    """Why tk refuses a tiktoken export of such a set: tiktoken joins its specials into one regex
    in its hash map's order and takes the first that matches, which need not be the longest."""
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {bytes([b]): b for b in range(256)}
    shorter = 0
    for names in PREFIX_SETS + [["<a>", "<a><b>"], ["a", "ab", "abc"], ["<|e", EOT]]:
        enc = tiktoken.Encoding("t", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={
            s: 256 + k for k, s in enumerate(names)})  # fmt: skip
        longest = max(names, key=len)
        shorter += enc.encode(longest, allowed_special="all") != [256 + names.index(longest)]
    if not shorter:
        pytest.skip("this tiktoken reads the longest special everywhere; the tiktoken refusal could be lifted")


@pytest.mark.parametrize("names", PREFIX_SETS, ids=str)
def test_a_tiktoken_export_or_import_of_specials_beginning_one_another_is_refused(names, tmp_path, capsys):
    tok = specials_tok(names)
    tok.save(tmp_path / "tok.safetensors")
    with pytest.raises(TokenizerError, match="begins the special token"):
        tok.export_tiktoken(tmp_path / "api")
    one_line_error(
        cli(capsys, "bpe-export", tmp_path / "tok.safetensors", "--format", "tiktoken", "-o", tmp_path / "tt"),
        f"the special token {names[0]!r} begins the special token {names[1]!r}",
        "cannot be exported to tiktoken",
    )
    assert not (tmp_path / "tt").exists() and not (tmp_path / "api").exists()
    # in: a bare rank file with such --special flags, and a NAME_tiktoken.json holding them
    Tokenizer.train([corpus()], vocab_size=330, quiet=True, workers=1).export_tiktoken(tmp_path / "in")
    args = [a for s in names for a in ("--special", s)]
    shutil.move(tmp_path / "in" / "tokenizer_tiktoken.json", tmp_path / "meta.json")
    rank_file = tmp_path / "in" / "tokenizer.tiktoken"
    one_line_error(
        cli(capsys, "bpe-import", rank_file, "--pattern", "gpt2", *args, "-o", tmp_path / "x.safetensors"),
        "cannot be imported from tiktoken",
    )
    meta = json.loads((tmp_path / "meta.json").read_text(encoding="utf-8"))
    meta["special_tokens"] = {s: 330 + k for k, s in enumerate(names)}
    (tmp_path / "in" / "tokenizer_tiktoken.json").write_text(json.dumps(meta), encoding="utf-8")
    one_line_error(cli(capsys, "bpe-import", rank_file, "-o", tmp_path / "x.safetensors"), "begins the special")
    assert not (tmp_path / "x.safetensors").exists()


# ---------------------------------------------------------------------------------------------
# 3. special tokens in prompts

PROMPT = f"The end.{EOT}Once upon"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> tuple[Path, GPT, Tokenizer]:
    """A small random model with a tokenizer holding <|endoftext|>, every weight far from its init."""
    tok = Tokenizer.train([corpus()], vocab_size=300, special_tokens=[EOT], quiet=True, workers=1)
    config = GPTConfig(vocab_size=tok.vocab_size, context_length=32, d_model=32, n_layers=2, n_heads=4)
    model = GPT(config, seed=0)
    rng = np.random.default_rng(0)
    for value in model.params.values():
        value[...] = rng.normal(0.0, 0.3, value.shape)
    path = tmp_path_factory.mktemp("model") / "m.safetensors"
    checkpoint.save_model(
        path, model.params, tok, config=config.to_dict(), step=0, val_loss=None, best_val_loss=None, provenance={}
    )
    return path, model, tok


def next_probs(model: GPT, ids: list[int]) -> np.ndarray:
    logits = model.forward(np.asarray([ids]))[0, -1].astype(np.float64)
    p = np.exp(logits - logits.max())
    return p / p.sum()


def refused_by_default(capsys, *argv) -> None:
    err = one_line_error(cli(capsys, *argv), f"special token {EOT!r}", "--allow-special", "--specials-as-text")
    assert "allowed_special" not in err and "tk encode" not in err  # only the command's own flags


def test_predict_next_reads_a_special_only_when_allowed(model_file, capsys):
    path, model, tok = model_file
    refused_by_default(capsys, "predict-next", "-m", path, PROMPT)
    for flag, ids in [
        ("--allow-special", tok.encode(PROMPT, allowed_special="all")),
        ("--specials-as-text", tok.encode(PROMPT, disallowed_special=())),
    ]:
        code, out, err = cli(capsys, "predict-next", "-m", path, PROMPT, flag, "--json", "--top-k", "5")
        assert code == 0, err
        want = next_probs(model, ids)
        top = json.loads(out)["top"]
        assert [e["id"] for e in top] == list(np.argsort(-want, kind="stable")[:5])
        assert all(abs(e["p"] - want[e["id"]]) < 1e-9 for e in top), flag
    assert tok.special_tokens[EOT] in tok.encode(PROMPT, allowed_special="all")
    assert tok.special_tokens[EOT] not in tok.encode(PROMPT, disallowed_special=())
    one_line_error(
        cli(capsys, "predict-next", "-m", path, PROMPT, "--allow-special", "--specials-as-text"), "exclude each other"
    )


def test_generate_reads_a_special_only_when_allowed(model_file, capsys):
    path, model, tok = model_file
    refused_by_default(capsys, "generate", "-m", path, PROMPT, "-n", "3")
    eot = tok.special_tokens[EOT]
    ids = tok.encode(PROMPT, allowed_special="all")
    assert eot in ids
    code, out, err = cli(capsys, "generate", "-m", path, PROMPT, "--allow-special", "-n", "8", "--temperature", "0")
    assert code == 0, err
    new = model.generate(np.asarray(ids), 8, temperature=0.0, stop_token=eot, use_cache=True)
    assert out == PROMPT + tok.decode(list(new)) + "\n"


def test_explain_reads_a_special_only_when_allowed(model_file, capsys):
    path, _, tok = model_file
    refused_by_default(capsys, "explain", "-m", path, PROMPT)
    for flag, kwargs in [
        ("--allow-special", {"allowed_special": "all"}),
        ("--specials-as-text", {"disallowed_special": ()}),
    ]:
        code, out, err = cli(capsys, "explain", "-m", path, PROMPT, flag, "--json")
        assert code == 0, err
        assert [t["id"] for t in json.loads(out)["tokens"]] == tok.encode(PROMPT, **kwargs), flag


def test_the_python_api_takes_the_same_policy(model_file):
    _, model, tok = model_file
    eot = tok.special_tokens[EOT]
    with pytest.raises(DisallowedSpecialError) as err:
        predict_next(model, tok, PROMPT)
    assert err.value.token == EOT and "allowed_special" in str(err.value) and "--" not in str(err.value)
    assert eot in predict_next(model, tok, PROMPT, allowed_special="all").prompt_ids
    assert eot not in predict_next(model, tok, PROMPT, disallowed_special=()).prompt_ids
    with pytest.raises(DisallowedSpecialError):
        next(generate(model, tok, PROMPT, max_new_tokens=2))
    assert list(generate(model, tok, PROMPT, max_new_tokens=2, temperature=0.0, allowed_special={EOT}))
    # raised in an encoding worker process, it reaches the parent whole, its advice too
    advised = err.value.advise("--allow-special", "--specials-as-text")
    back = pickle.loads(pickle.dumps(advised))
    assert (type(back), back.token, str(back)) == (DisallowedSpecialError, EOT, str(advised))


def test_pipeline_samples_a_prompt_holding_the_eot_and_takes_the_flags_for_its_own(tmp_path, capsys):
    """The default prompt is decoded from validation ids: with --eot it may hold the special,
    which was one there. A --prompt of the user's follows the flags."""
    docs = tmp_path / "docs"
    docs.mkdir()
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog"]
    for k in range(200):
        (docs / f"d{k:03}.txt").write_text(" ".join(rng.choice(words, 6)) + ".\n\nEnd.", encoding="utf-8")
    small = ["--steps", "3", "--vocab-size", "300", "--context-length", "16", "--d-model", "16", "--n-layers", "1"]
    small += ["--n-heads", "2", "--batch-size", "2", "--workers", "1", "-q"]
    code, out, err = cli(capsys, "pipeline", docs, "--eot", EOT, "-o", tmp_path / "run", *small)
    assert code == 0, err
    assert f"predict-next 'End.{EOT}" in out  # the sample prompt crossed a document's end
    args = ["pipeline", docs, "--eot", EOT, "-o", tmp_path / "run", *small, "--prompt", PROMPT]
    refused_by_default(capsys, *args)
    code, out, err = cli(capsys, *args, "--allow-special")
    assert code == 0 and f"predict-next {PROMPT!r}" in out, err
