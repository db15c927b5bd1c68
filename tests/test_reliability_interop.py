"""Interop edges (issue 20): directories transformers re-saved, overlapping special tokens, and
special tokens in the prompts of predict-next, generate and explain.

1. transformers adds a post-processor that adds nothing when it saves a tokenizer (a template
   "$A" / "$A $B"; GPT2TokenizerFast also a ByteLevel decoder with add_prefix_space). tk imports
   such directories (`tk bpe-import`, `tk import-hf`) with transformers' own ids, with and without
   add_special_tokens; a template that adds a token (Llama 3's "<|begin_of_text|> $A") is refused
   in one line that names the token, as is a directory transformers loads as GPT2Tokenizer (its
   own split and prefix space, whatever tokenizer.json says) where that changes the ids.
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
from conftest import random_model  # test_hf's random model

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
    capsys.readouterr()  # what came before (transformers' progress bars, say) is not this command's
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
# 1. directories transformers re-saved


def resave(transformers, how: str, src: Path, dst: Path) -> None:
    """`src` loaded by transformers as `how` and saved into `dst`, as a user would."""
    cls = {"auto": transformers.AutoTokenizer, "gpt2-fast": transformers.GPT2TokenizerFast}[how]
    cls.from_pretrained(src).save_pretrained(dst)


@pytest.mark.parametrize("how", ["auto", "gpt2-fast"])
def test_a_directory_transformers_resaved_imports_with_its_ids(transformers, tok, tmp_path, capsys, how):
    tok.export_hf(tmp_path / "tk")
    resave(transformers, how, tmp_path / "tk", tmp_path / "saved")
    data = json.loads((tmp_path / "saved" / "tokenizer.json").read_text(encoding="utf-8"))
    assert data["post_processor"]["type"] == "TemplateProcessing"  # what transformers adds on saving
    code, out, err = cli(capsys, "bpe-import", tmp_path / "saved", "-o", tmp_path / "t.safetensors")
    assert code == 0, err
    ours = Tokenizer.load(tmp_path / "t.safetensors")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
    for text in TEXTS:
        ids = tk_ids(ours, text)
        assert theirs(text, add_special_tokens=True).input_ids == ids, text
        assert theirs(text, add_special_tokens=False).input_ids == ids, text
        assert theirs.decode(ids) == ours.decode(ids) == text
    if how == "auto":  # transformers kept tk's split; GPT2TokenizerFast puts in GPT-2's own
        assert (ours.merges, ours.special_tokens, ours.pattern) == (tok.merges, tok.special_tokens, tok.pattern)


def test_import_hf_reads_a_model_directory_whose_tokenizer_transformers_resaved(transformers, tok, tmp_path, capsys):
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, context_length=16, d_model=16, n_layers=1, n_heads=2), seed=0)
    checkpoint.save_model(
        tmp_path / "m.safetensors", model.params, tok, config=model.config.to_dict(), step=0, val_loss=None,
        best_val_loss=None, provenance={},
    )  # fmt: skip
    assert cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")[0] == 0
    transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").save_pretrained(tmp_path / "hf")  # in place
    code, _, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "back.safetensors")
    assert code == 0, err
    back = checkpoint.load_model(tmp_path / "back.safetensors").tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in TEXTS:
        assert theirs(text).input_ids == tk_ids(back, text) == tk_ids(tok, text), text


def with_bos_template(transformers, tok: Tokenizer, src: Path, dst: Path, how: str) -> None:
    """A transformers directory whose tokenizer adds BOS to every text: Llama 3's post-processor
    (ByteLevel, then a template with <|begin_of_text|>), or transformers' own add_bos_token."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    if how == "llama3-template":
        hf = HFTokenizer.from_file(str(src / "tokenizer.json"))
        bos = tok.special_tokens[BOS]
        hf.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, bos)]
                ),
            ]
        )
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=hf, bos_token=BOS)
    else:
        fast = transformers.AutoTokenizer.from_pretrained(src)
        fast.bos_token = BOS
        fast.add_bos_token = True
    fast.save_pretrained(dst)


@pytest.mark.parametrize("how", ["llama3-template", "add_bos_token"])
@pytest.mark.parametrize("command", ["bpe-import", "import-hf"])
def test_a_tokenizer_that_adds_bos_is_read_with_it_as_its_bos(transformers, tok, tmp_path, capsys, how, command):
    """Llama 3's template and transformers' add_bos_token put BOS before every text: the imported
    tokenizer records it (`Tokenizer.bos`); its `encode` is add_special_tokens=False's ids and what
    a model reads (`encode_for_model`) is add_special_tokens=True's."""
    tok.export_hf(tmp_path / "tk")
    with_bos_template(transformers, tok, tmp_path / "tk", tmp_path / "bos", how)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "bos")
    text = "Once upon a time"
    assert theirs(text).input_ids == [tok.special_tokens[BOS]] + tok.encode(text)  # the premise: it adds BOS
    if command == "import-hf":
        pytest.importorskip("torch")  # transformers writes its model's weights with PyTorch
        transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                vocab_size=tok.vocab_size, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=None,
                eos_token_id=None,
            )
        ).save_pretrained(tmp_path / "bos")  # fmt: skip
        capsys.readouterr()  # its progress bar
    code, _, err = cli(capsys, command, tmp_path / "bos", "-o", tmp_path / "t.safetensors")
    assert code == 0, err
    back = (checkpoint.load_model(tmp_path / "t.safetensors").tokenizer if command == "import-hf"
            else Tokenizer.load(tmp_path / "t.safetensors"))  # fmt: skip
    assert back.bos == BOS
    for text in TEXTS:
        assert back.encode_for_model(text, allowed_special="all") == theirs(text).input_ids, text
        assert back.encode(text, allowed_special="all") == theirs(text, add_special_tokens=False).input_ids, text


def hf_with(tok: Tokenizer, path: Path, **parts) -> Path:
    """tok's tokenizer.json with the given components (tokenizers objects) put in, saved by tokenizers."""
    from tokenizers import Tokenizer as HFTokenizer

    tok.export_hf(path.parent / "plain", overwrite=True)
    hf = HFTokenizer.from_file(str(path.parent / "plain" / "tokenizer.json"))
    for name, value in parts.items():
        setattr(hf, name, value)
    hf.save(str(path))
    return path


NO_OP = [
    "template",
    "sequence-bytelevel-template",
    "bytelevel-prefix-offsets",
    "decoder-sequence",
    "decoder-prefix",
    "normalizer-empty-sequence",
]


def no_op_parts(name: str) -> dict:
    """tokenizer.json components (tokenizers objects) that add nothing and change no id."""
    from tokenizers import decoders, normalizers, processors

    return {
        "template": {"post_processor": processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")},
        "sequence-bytelevel-template": {
            "post_processor": processors.Sequence(
                [processors.ByteLevel(trim_offsets=True), processors.TemplateProcessing(single="$A", pair="$A $B")]
            )
        },
        "bytelevel-prefix-offsets": {"post_processor": processors.ByteLevel(add_prefix_space=True)},
        "decoder-sequence": {"decoder": decoders.Sequence([decoders.ByteLevel()])},
        "decoder-prefix": {"decoder": decoders.ByteLevel(add_prefix_space=True)},
        "normalizer-empty-sequence": {"normalizer": normalizers.Sequence([])},
    }[name]


@pytest.mark.parametrize("name", NO_OP)
def test_components_that_change_no_id_are_accepted(tok, tmp_path, name):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer as HFTokenizer

    path = hf_with(tok, tmp_path / "tokenizer.json", **no_op_parts(name))
    ours = Tokenizer.from_hf(path)
    theirs = HFTokenizer.from_file(str(path))
    for text in TEXTS:
        ids = tk_ids(ours, text)
        assert theirs.encode(text).ids == ids == tk_ids(tok, text), text
        assert theirs.decode(ids, skip_special_tokens=False) == ours.decode(ids) == text


def test_a_pre_tokenizer_wrapped_in_sequences_is_read(tok, tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers

    tok.export_hf(tmp_path / "plain")
    data = json.loads((tmp_path / "plain" / "tokenizer.json").read_text(encoding="utf-8"))
    data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "Sequence", "pretokenizers": [
        data["pre_tokenizer"]]}]}  # fmt: skip
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    theirs = HFTokenizer.from_file(str(path))
    assert isinstance(theirs.pre_tokenizer, pre_tokenizers.Sequence)
    ours = Tokenizer.from_hf(path)
    assert ours.pattern == tok.pattern
    for text in TEXTS:
        assert theirs.encode(text).ids == tk_ids(ours, text) == tk_ids(tok, text), text


def test_post_processors_that_add_tokens_are_refused_naming_them(tok, tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    eot, bos = tok.special_tokens[EOT], tok.special_tokens[BOS]
    cases = [
        (processors.RobertaProcessing((EOT, eot), (BOS, bos)), f"adds {BOS!r} to every text"),
        (processors.BertProcessing((EOT, eot), (BOS, bos)), f"adds {BOS!r} to every text"),
        (
            processors.TemplateProcessing(single="$A", pair=f"$A {EOT} $B:1", special_tokens=[(EOT, eot)]),
            f"adds {EOT!r} to a pair of texts",
        ),
        (
            processors.TemplateProcessing(single=f"$A {EOT}", pair=f"$A {EOT} $B:1", special_tokens=[(EOT, eot)]),
            f"adds {EOT!r} to every text",
        ),
        (processors.TemplateProcessing(single="$A $A", pair="$A $B"), "repeats or reorders"),
    ]
    for k, (post, words) in enumerate(cases):
        path = hf_with(tok, tmp_path / f"t{k}" / "tokenizer.json", post_processor=post)
        if "adds" in words:  # the premise: HF adds that token to a text or a pair
            hf = HFTokenizer.from_file(str(path))
            pair = "a pair" in words
            added = hf.encode("abc", "d" if pair else None).ids
            assert (eot if EOT in words else bos) in added
        with pytest.raises(TokenizerError, match="post-processor"):
            Tokenizer.from_hf(path)
        one_line_error(cli(capsys, "bpe-import", path, "-o", tmp_path / "t.safetensors"), words)


GPT2_CLASS_CASES = {
    "class-gpt2": ("none", {"tokenizer_class": "GPT2Tokenizer"}, None, "splits text with GPT-2's pattern"),
    "model-type-gpt2": ("none", {"tokenizer_class": None}, {"model_type": "gpt2"}, "config.json's model_type gpt2"),
    "prefix-space": ("gpt2", {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": True}, None, "adds a space"),
}


@pytest.mark.parametrize("case", GPT2_CLASS_CASES)
def test_a_directory_transformers_reads_as_gpt2tokenizer_is_refused_where_ids_change(tmp_path, capsys, case):
    pattern, config, model_config, words = GPT2_CLASS_CASES[case]
    tok = Tokenizer.train([corpus()], vocab_size=380, pattern=pattern, special_tokens=[EOT], quiet=True, workers=1)
    tok.export_hf(tmp_path / "hf")
    path = tmp_path / "hf" / "tokenizer_config.json"
    values = {**json.loads(path.read_text(encoding="utf-8")), **config}
    path.write_text(json.dumps({k: v for k, v in values.items() if v is not None}), encoding="utf-8")
    if model_config is not None:
        (tmp_path / "hf" / "config.json").write_text(json.dumps(model_config), encoding="utf-8")
    try:
        import transformers
    except ImportError:
        pass
    else:  # the premise: transformers gives other ids for this directory than tokenizer.json does
        theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
        assert type(theirs).__name__.startswith("GPT2Tokenizer")
        assert any(theirs(text).input_ids != tk_ids(tok, text) for text in TEXTS)
    one_line_error(cli(capsys, "bpe-import", tmp_path / "hf", "-o", tmp_path / "t.safetensors"), words)
    assert Tokenizer.from_hf(tmp_path / "hf" / "tokenizer.json").merges == tok.merges  # the file alone: as it is


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
    path = tmp_path_factory.mktemp("model") / "m.safetensors"
    return path, random_model(path, tok, seed=0), tok


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
    # the flag was for the prompt: the corpus held no special-token text (it encoded refusing
    # such text), so its tokens and the model serve every policy, and the run stays up to date
    for flags in ([], ["--specials-as-text"], ["--allow-special"]):
        code, out, err = cli(capsys, *args[:-2], *flags)
        assert code == 0 and "not up to date" not in err, (flags, err)
    assert not list((tmp_path / "run").glob(".tk-new-run*"))
