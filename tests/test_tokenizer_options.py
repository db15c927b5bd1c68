"""The tokenizer options imported from Hugging Face tokenizers (issue 22): `ignore_merges`
(Llama 3's) and the NFC normalizer (Qwen2's).

With `ignore_merges` a chunk that is itself a token is that token, though its merges make
something else; with `normalizer="nfc"` the text between special tokens is put in NFC first.
Both are checked against the plain definition here, against HF `tokenizers` on texts where they
matter (skipped without it), through the file (format version 2 only when an option is set, so
other files are the bytes they were), and through corpus encoding in worker processes.
Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
import unicodedata

import numpy as np
import pytest

from tokenkit.bpe import Tokenizer, TokenizerError
from tokenkit.bpe import io as bpe_io
from tokenkit.bpe.hf_import import QWEN2_PATTERN
from tokenkit.cli.main import main

# Llama 3's split, as its tokenizer.json holds it (Oniguruma; Python reads it alike)
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# 'ab' 256, 'bc' 257, 'abc' 258 made as a + bc: merging 'abc' gives ab + c (ab ranks first), so
# only ignore_merges gives 258 for the word "abc"; likewise ' abc' 260 (' ' + 'abc')
ODD_MERGES = [(97, 98), (98, 99), (97, 257), (32, 97), (32, 258)]
ODD_TEXTS = ["abc", " abc", "abc abc", "abcabc", "xabc", "abcd", " ab", "bc", "abc.", "abc\n abc", "a b c"]


def odd(**options) -> Tokenizer:
    return Tokenizer(ODD_MERGES, special_tokens=["<|end|>"], pattern=LLAMA3_PATTERN, **options)


def plain_ids(tok: Tokenizer, text: str) -> list[int]:
    """The definition: split, then each chunk that is a token is that token (ignore_merges), else
    the lowest-ranked merge again and again; NFC first when the tokenizer normalizes."""
    from tokenkit.bpe.pretokenize import split_text

    if tok.normalizer == "nfc":
        text = unicodedata.normalize("NFC", text)
    vocab = {t: i for i, t in enumerate(tok.vocab)}
    out = []
    for chunk in split_text(text, tok._pattern):
        raw = chunk.encode("utf-8")
        if tok.ignore_merges and raw in vocab:
            out.append(vocab[raw])
            continue
        ids = list(raw)
        while len(ids) > 1:
            ranks = [tok.layout.pair_id.get(p, 1 << 62) for p in zip(ids, ids[1:], strict=False)]
            best = min(ranks)
            if best == 1 << 62:
                break
            i = ranks.index(best)
            ids[i : i + 2] = [best]
        out += ids
    return out


def test_ignore_merges_looks_a_chunk_up_whole():
    with_option, without = odd(ignore_merges=True), odd()
    assert with_option.encode("abc") == [258] and without.encode("abc") == [256, 99]  # ab + c
    assert with_option.encode(" abc") == [260] and without.encode(" abc") == [32, 256, 99]
    for text in ODD_TEXTS:
        assert with_option.encode(text) == plain_ids(with_option, text), text
        assert without.encode(text) == plain_ids(without, text), text
    rng = random.Random(0)
    pieces = ["abc", " abc", "ab", "c", " ", "\n", "x", "bc", "a"]
    for _ in range(300):  # the cache, the heap for long chunks, many chunks at once
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        assert with_option.encode(text) == plain_ids(with_option, text), text
    long = "abc" * 30  # one chunk of 90 bytes: merged with the heap, or a token
    assert with_option.encode(long) == without.encode(long) == plain_ids(without, long)


def test_nfc_normalizes_each_stretch_between_specials():
    tok = Tokenizer([(99, 97), (256, 102), (257, 0xC3), (258, 0xA9)], special_tokens=["<|end|>"], normalizer="nfc")
    decomposed = "cafe\u0301"
    assert tok.encode(decomposed) == tok.encode("café") == [259]
    assert Tokenizer(tok.merges).encode(decomposed) != [259]
    text = f"{decomposed}<|end|>\u0301x {decomposed}"  # a mark after a special stays a lone mark
    assert tok.encode(text, allowed_special="all") == plain_ids_with_specials(tok, text)
    assert tok.decode(tok.encode(decomposed)) == "café"  # decoding gives the normalized text


def plain_ids_with_specials(tok: Tokenizer, text: str) -> list[int]:
    out = []
    for k, part in enumerate(text.split("<|end|>")):
        if k:
            out.append(tok.special_tokens["<|end|>"])
        out += plain_ids(tok, part)
    return out


@pytest.mark.parametrize("options", [{}, {"ignore_merges": True}, {"normalizer": "nfc"},
                                     {"ignore_merges": True, "normalizer": "nfc"}])  # fmt: skip
def test_options_survive_the_file_and_only_they_change_its_version(options, tmp_path):
    tok = odd(**options)
    tok.save(tmp_path / "t.safetensors")
    back = Tokenizer.load(tmp_path / "t.safetensors")
    assert (back.ignore_merges, back.normalizer) == (tok.ignore_merges, tok.normalizer)
    assert [back.encode(t) for t in ODD_TEXTS] == [tok.encode(t) for t in ODD_TEXTS]
    meta = tok.to_tensors()[1]
    assert meta["format_version"] == ("2" if options else "1")
    assert {k for k in ("ignore_merges", "normalizer") if k in meta} == set(options)
    if not options:  # a tokenizer without options is written exactly as before them
        assert tok.fingerprint() == odd().fingerprint() and "ignore_merges" not in meta
    assert back.fingerprint() == tok.fingerprint()


@pytest.mark.parametrize(
    "change, words",
    [
        ({"format_version": "1", "ignore_merges": "true"}, "in a version 1 file"),
        ({"format_version": "2"}, "without options"),
        ({"format_version": "2", "ignore_merges": "yes"}, "ignore_merges is 'yes'"),
        ({"format_version": "2", "normalizer": "nfkc"}, "normalizer is 'nfkc'"),
        ({"format_version": "4"}, "versions 1 to 3"),
    ],
)
def test_damaged_options_are_one_line(change, words):
    tensors, meta = odd().to_tensors()
    with pytest.raises(TokenizerError, match=words):
        Tokenizer.from_tensors(tensors, {**meta, **change})


def test_formats_that_cannot_say_an_option_refuse_it(tmp_path):
    with pytest.raises(TokenizerError, match="vocab.json \\+ merges.txt cannot say ignore_merges"):
        odd(ignore_merges=True).export(tmp_path / "a", "gpt2")
    with pytest.raises(TokenizerError, match="tiktoken has no normalizer"):
        odd(normalizer="nfc").export(tmp_path / "b", "tiktoken")
    with pytest.raises(TokenizerError, match="token 258 .* inside a longer chunk"):
        odd(ignore_merges=True).export(tmp_path / "c", "tiktoken")
    data = json.loads(odd(ignore_merges=True, normalizer="nfc").export_files("hf")["tokenizer.json"])
    assert data["model"]["ignore_merges"] is True and data["normalizer"] == {"type": "NFC"}
    with pytest.raises(TokenizerError, match="normalizer must be one of nfc"):
        Tokenizer([], normalizer="NFKC")


def test_corpus_encoding_in_workers_honours_the_options(tmp_path):
    tok = odd(ignore_merges=True, normalizer="nfc")
    text = "".join(random.Random(1).choice(["abc ", " abc", "cafe\u0301 ", "\n", "abcd "]) for _ in range(4000))
    (tmp_path / "c.txt").write_text(text, encoding="utf-8")
    ids = tok.encode_file(tmp_path / "c.txt", workers=2, quiet=True)
    assert ids.tolist() == tok.encode(text)
    tok.save(tmp_path / "t.safetensors")
    assert main(["encode", "-t", str(tmp_path / "t.safetensors"), "-f", str(tmp_path / "c.txt"),
                 "-o", str(tmp_path / "ids.npy"), "--workers", "2"]) == 0  # fmt: skip
    assert np.load(tmp_path / "ids.npy").tolist() == tok.encode(text)


# --- against HF tokenizers ---------------------------------------------------------------------


def hf_bpe(tok: Tokenizer, *, ignore_merges: bool, nfc: bool, pattern: str = LLAMA3_PATTERN):
    """tok's vocabulary as a tokenizers BPE built by the library itself (not from tk's export),
    with Llama 3's pre-tokenizer (Split + ByteLevel), and the options given."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenkit.bpe.bytelevel import bytes_to_unicode

    table = bytes_to_unicode()
    name = ["".join(table[b] for b in t) for t in tok.vocab]
    merges = [(name[a], name[b]) for a, b in tok.merges]
    model = tokenizers.models.BPE({n: i for i, n in enumerate(name)}, merges, ignore_merges=ignore_merges)
    hf = tokenizers.Tokenizer(model)
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Split(tokenizers.Regex(pattern), "isolated"),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    if nfc:
        hf.normalizer = tokenizers.normalizers.NFC()
    hf.decoder = tokenizers.decoders.ByteLevel()
    hf.add_special_tokens(list(tok.special_tokens))
    return hf


@pytest.mark.parametrize("ignore_merges", [True, False])
def test_hf_tokenizers_gives_tk_ids_with_ignore_merges(ignore_merges, tmp_path):
    tok = odd(ignore_merges=ignore_merges)
    hf = hf_bpe(tok, ignore_merges=ignore_merges, nfc=False)
    hf.save(str(tmp_path / "tokenizer.json"))
    imported = Tokenizer.from_hf(tmp_path / "tokenizer.json")
    assert imported.ignore_merges is ignore_merges and imported.pattern == LLAMA3_PATTERN
    rng = random.Random(2)
    texts = ODD_TEXTS + ["".join(rng.choice(["abc", " abc", "ab", "c", " ", "x", "<|end|>"]) for _ in range(30))
                         for _ in range(200)]  # fmt: skip
    differ = 0
    for text in texts:
        theirs = hf.encode(text).ids
        assert imported.encode(text, allowed_special="all") == theirs == tok.encode(text, allowed_special="all"), text
        differ += theirs != odd(ignore_merges=not ignore_merges).encode(text, allowed_special="all")
    assert differ > 100  # the premise: the option matters on these texts
    # and back out: tk's own tokenizer.json gives HF the same ids
    tok.export_hf(tmp_path / "out")
    again = pytest.importorskip("tokenizers").Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert all(again.encode(t).ids == hf.encode(t).ids for t in texts)


def test_hf_tokenizers_gives_tk_ids_with_nfc(tmp_path):
    base = Tokenizer.train([("café naïve résumé ñandú Å " * 50).encode()], vocab_size=300, quiet=True, workers=1)
    tok = Tokenizer(base.merges, special_tokens=["<|endoftext|>"], pattern=QWEN2_PATTERN, normalizer="nfc")
    hf = hf_bpe(tok, ignore_merges=False, nfc=True, pattern=QWEN2_PATTERN)
    hf.save(str(tmp_path / "tokenizer.json"))
    imported = Tokenizer.from_hf(tmp_path / "tokenizer.json")
    assert imported.normalizer == "nfc"
    texts = ["café", "cafe\u0301", "A\u030a ñ n\u0303andu\u0301", "re\u0301sume\u0301<|endoftext|>\u0301e",
             unicodedata.normalize("NFD", "naïve résumé ñandú Å " * 3)]  # fmt: skip
    for text in texts:
        assert imported.encode(text, allowed_special="all") == hf.encode(text).ids, text
    assert Tokenizer(tok.merges).encode(texts[1]) != imported.encode(texts[1])  # the premise


def test_options_are_read_from_and_written_to_tokenizer_json_by_the_cli(tmp_path, capsys):
    hf = hf_bpe(odd(), ignore_merges=True, nfc=True)
    hf.save(str(tmp_path / "tokenizer.json"))
    assert main(["bpe-import", str(tmp_path / "tokenizer.json"), "-o", str(tmp_path / "t.safetensors")]) == 0
    tok = Tokenizer.load(tmp_path / "t.safetensors")
    assert (tok.ignore_merges, tok.normalizer) == (True, "nfc")
    assert main(["info", str(tmp_path / "t.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "ignore_merges" in out and "nfc" in out
    assert bpe_io.OPTIONS_VERSION in out


# --- a qwen2 directory, as transformers reads it -------------------------------------------------


def qwen2_dir(tmp_path, name: str, tok: Tokenizer, **hf_options):
    """A directory as a Qwen2 checkpoint has it (config.json's model_type qwen2, no
    tokenizer_config.json) with tok's vocabulary in a tokenizer.json built by tokenizers."""
    options = {"ignore_merges": False, "nfc": True, "pattern": QWEN2_PATTERN, **hf_options}
    directory = tmp_path / name
    directory.mkdir()
    hf_bpe(tok, **options).save(str(directory / "tokenizer.json"))
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2"}), encoding="utf-8")
    return directory


def test_a_qwen2_directory_is_read_as_transformers_qwen2tokenizer_reads_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    base = Tokenizer.train([("café naïve résumé abc abc " * 50).encode()], vocab_size=300, quiet=True, workers=1)
    tok = Tokenizer(base.merges, special_tokens=["<|endoftext|>", "<|im_start|>"], pattern=QWEN2_PATTERN)
    texts = ["café cafe\u0301", "résumé 12345<|endoftext|>\u0301x", "<|im_start|>naïve", "  abc\n\n\tabc"]
    for name, options in (("plain", {}), ("ignore-merges", {"ignore_merges": True})):  # every token whole: no-op
        directory = qwen2_dir(tmp_path, name, tok, **options)
        ours = Tokenizer.from_hf(directory)
        assert (ours.normalizer, ours.ignore_merges, ours.pattern) == ("nfc", False, QWEN2_PATTERN)
        theirs = transformers.AutoTokenizer.from_pretrained(directory)
        assert type(theirs).__name__ == "Qwen2Tokenizer"
        for text in texts:
            assert ours.encode(text, allowed_special="all") == theirs(text).input_ids, (name, text)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"pattern": LLAMA3_PATTERN}, "which splits text with Qwen2's pattern whatever tokenizer.json"),
        ({"nfc": False}, "puts the text in NFC whatever tokenizer.json's normalizer says"),
        ({"specials": ["<|im_start|>"]}, "adds its unk_token '<|endoftext|>' to the vocabulary as a new token"),
        ({"ignore_merges": True, "odd": True}, "token 258 .*with which HF tokenizers give 258 for that text"),
    ],
)
def test_a_qwen2_directory_that_transformers_reads_otherwise_is_refused(change, words, tmp_path, capsys):
    change = dict(change)
    specials = change.pop("specials", ["<|endoftext|>"])
    merges = ODD_MERGES if change.pop("odd", False) else [(97, 98)]
    directory = qwen2_dir(tmp_path, "q", Tokenizer(merges, special_tokens=specials, pattern=QWEN2_PATTERN), **change)
    with pytest.raises(TokenizerError, match=words):
        Tokenizer.from_hf(directory)
    assert main(["bpe-import", str(directory), "-o", str(tmp_path / "t.safetensors")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Qwen2Tokenizer" in err, err
    Tokenizer.from_hf(directory / "tokenizer.json")  # the file alone is read as it says


def test_the_merge_replay_honours_the_options():
    # the page's BPE replay (Tokenizer.replay) must end where encode does with either option:
    # a chunk that is a token starts whole; the text is replayed as normalized
    from test_replay import check_replay

    rng = random.Random(3)
    pieces = ["abc", " abc", "ab", "c", " ", "\n", "x", "bc", "a", "cafe\u0301", "é", "<|end|>"]
    tokens = [odd(ignore_merges=True), odd(normalizer="nfc"), odd(ignore_merges=True, normalizer="nfc")]
    for tok in tokens:
        for text in [*ODD_TEXTS, *("".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))) for _ in range(150))]:
            check_replay(tok, text, allowed_special="all")
    whole = tokens[0].replay("abc abc")
    assert whole.initial == [258, 260] and whole.steps == []  # two whole tokens, nothing to merge


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("eot", [None, "<|end|>"])
def test_a_models_training_data_puts_the_bos_before_every_document(tmp_path, workers, eot):
    """encode_file(for_model=True): each document as encode_for_model encodes it (BOS first), the
    eot between documents; without a BOS, or without for_model, the text's ids as before."""
    tok = Tokenizer(ODD_MERGES, special_tokens=["<|end|>", "<s>"], bos="<s>")  # GPT-2's pattern: cut in parts
    docs = ["abc abc", "a b c\n", "x abc.\n" * 400_000]  # the last one (2.8 MB) in parts of about 1 MB
    (tmp_path / "c").mkdir()
    for i, doc in enumerate(docs):
        (tmp_path / "c" / f"{i}.txt").write_text(doc, encoding="utf-8")
    sep = [] if eot is None else [tok.special_tokens[eot]]
    want = [i for k, doc in enumerate(docs) for i in (sep if k else []) + tok.encode_for_model(doc)]
    got = tok.encode_file(tmp_path / "c", workers=workers, quiet=True, eot=eot, for_model=True)
    assert got.tolist() == want
    plain = [i for k, doc in enumerate(docs) for i in (sep if k else []) + tok.encode(doc)]
    assert tok.encode_file(tmp_path / "c", workers=workers, quiet=True, eot=eot).tolist() == plain
    no_bos = Tokenizer(ODD_MERGES, special_tokens=["<|end|>", "<s>"])
    assert no_bos.encode_file(tmp_path / "c", workers=workers, quiet=True, eot=eot, for_model=True).tolist() == plain
    (tmp_path / "empty.txt").write_bytes(b"")
    assert tok.encode_file(tmp_path / "empty.txt", workers=workers, quiet=True, for_model=True).tolist() == []


def test_added_tokens_that_are_not_special_are_text_read_as_hf_reads_them(tmp_path):
    """Qwen2.5's `<tool_call>`: an added token that is not special is part of the text, read as
    its token whatever the special-token policy (HF splits it out of every text); the special
    `<|im_end|>` still follows the policy. Kept in tk's file and written back as not special."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

    from tokenkit.bpe import DisallowedSpecialError

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    hf.train_from_iterator(["abc abc a b c <tool call> the fox " * 200], trainer)
    hf.add_special_tokens(["<|im_end|>"])
    hf.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_hf(tmp_path / "tokenizer.json")
    assert tok.text_tokens == {"<tool_call>"} and set(tok.special_tokens) == {"<|im_end|>", "<tool_call>"}
    texts = ["<tool_call>abc</tool_call>", "a<tool_call><|im_end|>b", "the fox<tool_call> <tool call>", "abc"]
    for text in texts:
        assert tok.encode(text, allowed_special="all") == hf.encode(text).ids, text
        plain = text.replace("<|im_end|>", "")  # the default policy refuses the special alone
        assert tok.encode(plain) == hf.encode(plain).ids, text
        as_text = tok.encode(text, disallowed_special=())  # specials as text; <tool_call> is still text's token
        assert as_text.count(tok.special_tokens["<tool_call>"]) == text.count("<tool_call>")
        assert tok.special_tokens["<|im_end|>"] not in as_text
    with pytest.raises(DisallowedSpecialError):
        tok.encode("a<tool_call><|im_end|>")
    tok.save(tmp_path / "t.safetensors")
    back = Tokenizer.load(tmp_path / "t.safetensors")
    assert back.text_tokens == tok.text_tokens and back.fingerprint() == tok.fingerprint()
    tok.export_hf(tmp_path / "out")
    data = json.loads((tmp_path / "out" / "tokenizer.json").read_text(encoding="utf-8"))
    assert {t["content"]: t["special"] for t in data["added_tokens"]} == {"<|im_end|>": True, "<tool_call>": False}
    again = tokenizers.Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert all(again.encode(text).ids == hf.encode(text).ids for text in texts)
    for fmt in ("gpt2", "tiktoken"):
        with pytest.raises(TokenizerError, match="--format hf"):
            tok.export_files(fmt)
    with pytest.raises(TokenizerError, match="must be a special token"):
        Tokenizer([], special_tokens=["<a>"], text_tokens=["<b>"])
