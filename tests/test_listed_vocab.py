"""Listed vocabularies (bpe/layout.py): merges apart from ids, as published tokenizer.json files have them.

Llama 3's tokenizer.json was converted from tiktoken's ranks, so every split of a token into two
tokens is a merge (280k merges for 128k tokens) and some merges use tokens that later merges make;
SmolLM's puts its special tokens before the bytes and splits digits one by one. Fast paths are held
to a plain reference of Hugging Face's algorithm (the lowest-ranked merge, leftmost, again and again)
on random vocabularies, and to the `tokenizers` library itself on files made the way those were.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_interop import TEXTS, corpus, ids_of  # the same texts and corpus
from test_tokenizer_options import LLAMA3_PATTERN

from tokenkit.bpe import Tokenizer, TokenizerError, hf_import, interop
from tokenkit.bpe.bytelevel import bytes_to_unicode
from tokenkit.bpe.layout import listed
from tokenkit.bpe.merge import merge_chunk, merge_chunk_heap
from tokenkit.bpe.pretokenize import split_text
from tokenkit.bpe.replay import replay_merges, replay_merges_naive

ALPHABET = b"ab c\n1"


def reference_ids(tok: Tokenizer, text: str) -> list[int]:
    """Hugging Face's BPE, plainly: each chunk a token when ignore_merges finds it whole, else
    merge the lowest-ranked pair (leftmost among equals) until none is left."""
    tokens = tok._id_bytes
    special = set(tok.special_tokens.values())
    id_of = {t: i for i, t in enumerate(tokens) if i not in special}
    rank = {(tokens[a], tokens[b]): r for r, (a, b) in enumerate(tok.merges)}
    out = []
    for chunk in split_text(text, tok._pattern):
        raw = chunk.encode("utf-8", "surrogateescape")
        if tok.ignore_merges and raw in id_of:
            out.append(id_of[raw])
            continue
        parts = [bytes([b]) for b in raw]
        while True:
            found = [(rank[p], i) for i, p in enumerate(zip(parts, parts[1:], strict=False)) if p in rank]
            if not found:
                break
            _, i = min(found)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        out += [id_of[p] for p in parts]
    return out


def random_listed(rng: random.Random, *, ignore_merges: bool) -> Tokenizer:
    """A random byte-level vocabulary over a few letters, its ids shuffled and two specials among
    them, with merges for every split of a token into two tokens in a random order (as a
    tiktoken conversion has them, shuffled): some merges use tokens that later merges make."""
    made = [bytes([b]) for b in ALPHABET]
    while len(made) < 40:
        new = rng.choice(made) + rng.choice(made)
        if len(new) <= 6 and new not in made:
            made.append(new)
    merges_bytes = [(t[:k], t[k:]) for t in made for k in range(1, len(t)) if t[:k] in made and t[k:] in made]
    rng.shuffle(merges_bytes)
    merges_bytes = merges_bytes[: max(1, int(len(merges_bytes) * rng.uniform(0.6, 1.0)))]
    tokens: list[bytes | None] = [bytes([b]) for b in range(256) if b not in ALPHABET] + made + [None, None]
    rng.shuffle(tokens)
    holes = [i for i, t in enumerate(tokens) if t is None]
    specials = {"<|s|>": holes[0], "<|e|>": holes[1]}
    id_of = {t: i for i, t in enumerate(tokens)}
    merges = [(id_of[a], id_of[b]) for a, b in merges_bytes]
    return Tokenizer(merges, vocab=tokens, special_tokens=specials, pattern="gpt2", ignore_merges=ignore_merges)


TEXT_OF = st.lists(st.sampled_from(["a", "b", "c", " ", "\n", "1", "ab", "abc", " a", "cc", "<|e|>"]), max_size=60)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**9), pieces=TEXT_OF, ignore_merges=st.booleans())
def test_listed_vocabularies_encode_as_the_reference(seed, pieces, ignore_merges):
    tok = random_listed(random.Random(seed), ignore_merges=ignore_merges)
    assert tok.listed
    text = "".join(pieces)
    want = reference_ids(Tokenizer.from_tensors(*tok.to_tensors()), text.replace("<|e|>", ""))
    assert tok.encode(text.replace("<|e|>", "")) == want  # the batch path
    layout = tok.layout
    for chunk in split_text(text.replace("<|e|>", ""), tok.pattern_regex):  # one chunk at a time, short and long
        assert list(tok._chunk_ids(chunk)) == reference_ids(tok, chunk)
        ids = [layout.byte_ids[b] for b in chunk.encode()]
        assert merge_chunk_heap(ids, layout.pair_id, layout.made) == merge_chunk(list(ids), layout.pair_id, layout.made)
    with_specials = tok.encode(text, allowed_special="all")
    assert tok.decode(with_specials) == text
    replayed = tok.replay(text, allowed_special="all")
    assert replayed.ids == with_specials
    chunks = [replayed.initial[a:b] for a, b in replayed.chunks]
    args = (layout.pair_id, layout.made, layout.monotone)
    assert replay_merges(chunks, *args) == replay_merges_naive(chunks, *args)


def test_random_listed_vocabularies_do_reach_merges_out_of_order():
    """The premise of the test above: its vocabularies hold merges that use tokens later merges make."""
    tokenizers = [random_listed(random.Random(seed), ignore_merges=False) for seed in range(20)]
    assert sum(not t._layout.monotone for t in tokenizers) >= 15


def test_a_listed_vocabulary_that_fits_the_canonical_layout_is_canonical(tmp_path):
    tok = Tokenizer.train([corpus()], vocab_size=300, special_tokens=["<|end|>"], quiet=True, workers=1)
    tokens = tok.vocab
    again = Tokenizer(tok.merges, vocab=tokens, special_tokens=tok.special_tokens)
    assert not again.listed and again.fingerprint() == Tokenizer(tok.merges, special_tokens=["<|end|>"]).fingerprint()
    full = [*tokens, None]  # every id, the special's too, as a tokenizer.json lists them
    assert not Tokenizer(tok.merges, vocab=full, special_tokens=tok.special_tokens).listed
    tok.export_hf(tmp_path)
    imported = Tokenizer.from_hf(tmp_path / "tokenizer.json")
    assert not imported.listed and (imported.merges, imported.vocab) == (tok.merges, tok.vocab)
    assert imported.to_tensors()[1]["format_version"] == "1"


@pytest.mark.parametrize(
    "tokens, merges, specials, words",
    [
        ([bytes([b]) for b in range(256)] + [b"ab", b"ab"], [], {}, "same bytes"),
        ([bytes([b]) for b in range(255)], [], {}, "byte 0xff has no id"),
        ([bytes([b]) for b in range(256)], [(97, 98)], {}, "which is no token"),
        ([bytes([b]) for b in range(256)] + [b"ab"], [(97, 98), (97, 98)], {}, "merged twice"),
        ([bytes([b]) for b in range(256)] + [None], [], {"<a>": 300}, "ids must be from 0 to 257"),
        ([bytes([b]) for b in range(256)] + [None, None], [], {"<a>": 256}, "ids that hold no bytes"),
        ([bytes([b]) for b in range(256)] + [None, b"ab"], [(97, 257)], {"<a>": 256}, "no token"),
        ([bytes([b]) for b in range(256)], [], {"<a>": 10**12}, "ids must be from 0 to 256"),  # no 10**12 holes
    ],
)
def test_a_bad_listed_vocabulary_is_one_line(tokens, merges, specials, words):
    with pytest.raises(TokenizerError, match=words):
        listed(tokens, merges, specials)


def test_a_listed_file_round_trips_and_a_damaged_one_is_one_line(tmp_path):
    tok = random_listed(random.Random(3), ignore_merges=True)
    tok.save(tmp_path / "t.safetensors")
    back = Tokenizer.load(tmp_path / "t.safetensors")
    assert back.listed and back.fingerprint() == tok.fingerprint() and back.special_tokens == tok.special_tokens
    text = "abc ab\n1 cc <|e|>abc"
    assert back.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")
    tensors, meta = tok.to_tensors()
    assert meta["format_version"] == "3"
    for change in ({"special_tokens": json.dumps({"<|s|>": 0})}, {"format_version": "2"}):
        with pytest.raises(TokenizerError):
            Tokenizer.from_tensors(tensors, {**meta, **change})
    bad = dict(tensors, merges=tensors["merges"] + 10_000)
    with pytest.raises(TokenizerError, match="past the vocabulary"):
        Tokenizer.from_tensors(bad, meta)


# ---------------------------------------------------------------------------------------------
# the files themselves, made as Llama 3's and SmolLM's were, read by the `tokenizers` library


@pytest.fixture(scope="module")
def llama3_style(tmp_path_factory):
    """A tokenizer.json converted from tiktoken ranks by transformers' own converter (Llama 3's way:
    every split a merge, ignore_merges), from a tokenizer tk trains with Llama 3's pattern."""
    pytest.importorskip("tokenizers")
    convert = pytest.importorskip("transformers.convert_slow_tokenizer")
    pytest.importorskip("tiktoken")
    base = Tokenizer.train([corpus()], vocab_size=1500, pattern=LLAMA3_PATTERN, quiet=True, workers=1)
    where = tmp_path_factory.mktemp("llama3")
    base.export_tiktoken(where)
    hf = convert.TikTokenConverter(
        vocab_file=str(where / "tokenizer.tiktoken"), extra_special_tokens=["<|begin_of_text|>", "<|eot_id|>"]
    ).converted()
    hf.save(str(where / "tokenizer.json"))
    return hf, where / "tokenizer.json"


def test_a_llama3_style_tokenizer_json_gives_the_library_ids(llama3_style, tmp_path):
    hf, path = llama3_style
    data = json.loads(path.read_text(encoding="utf-8"))
    assert len(data["model"]["merges"]) > len(data["model"]["vocab"]) - 256 and data["model"]["ignore_merges"]
    tok = Tokenizer.from_hf(path)
    assert tok.listed and tok.ignore_merges and tok.vocab_size == hf.get_vocab_size()
    assert not tok._layout.monotone  # merges out of order: the one-at-a-time paths are the ones tested
    text = corpus().decode("utf-8")[:20_000]
    assert tok.encode(text) == hf.encode(text).ids

    @settings(max_examples=80, deadline=None)
    @given(text=TEXTS)
    def same_ids(text):
        assert (
            ids_of(tok, text.replace("<|endoftext|>", "<|eot_id|>"))
            == hf.encode(text.replace("<|endoftext|>", "<|eot_id|>")).ids
        )

    same_ids()
    tok.export_hf(tmp_path / "out")  # and back out: the library reads tk's file with the same ids
    again = pytest.importorskip("tokenizers").Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert again.encode(text).ids == hf.encode(text).ids
    for fmt in ("gpt2", "tiktoken"):
        with pytest.raises(TokenizerError, match="--format hf"):
            tok.export_files(fmt)


@pytest.fixture(scope="module")
def smollm_style(tmp_path_factory):
    """A tokenizer trained by the `tokenizers` library as SmolLM's was: specials first (ids 0-2),
    digits split one by one before ByteLevel's regex."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    numbers = " ".join(str(random.Random(1).randrange(10**9)) for _ in range(2000))
    hf.train_from_iterator([corpus().decode("utf-8"), numbers], trainer)
    path = tmp_path_factory.mktemp("smollm") / "tokenizer.json"
    hf.save(str(path))
    return hf, path


def test_a_smollm_style_tokenizer_json_gives_the_library_ids(smollm_style, tmp_path):
    hf, path = smollm_style
    tok = Tokenizer.from_hf(path)
    assert tok.listed and tok.special_tokens == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert tok.pattern == hf_import.DIGITS_GPT2
    text = corpus().decode("utf-8")[:20_000] + " In 2024, 3.14 and 1,000,000 apples ٣٤ ½ x²  12\n 7"
    assert tok.encode(text) == hf.encode(text).ids

    @settings(max_examples=80, deadline=None)
    @given(text=TEXTS)
    def same_ids(text):
        assert ids_of(tok, text) == hf.encode(text).ids

    same_ids()
    tok.save(tmp_path / "t.safetensors")
    assert Tokenizer.load(tmp_path / "t.safetensors").encode(text) == hf.encode(text).ids
    tok.export_hf(tmp_path / "out")
    again = pytest.importorskip("tokenizers").Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert again.encode(text).ids == hf.encode(text).ids


# characters whose Unicode category the `regex` module and HF's Oniguruma agree on (the newest
# code points differ between their Unicode versions, for every pattern alike)
SETTLED = st.characters(blacklist_categories=("Cs", "Cn", "Co"), max_codepoint=0x2FFF)


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.sampled_from("ab 1 2\n\t.'sé٣½²x ") | SETTLED, max_size=40))
def test_the_digits_pattern_splits_as_hf_digits_then_byte_level(text):
    pre = pytest.importorskip("tokenizers").pre_tokenizers
    hf = pre.Sequence([pre.Digits(individual_digits=True), pre.ByteLevel(add_prefix_space=False, use_regex=True)])
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    theirs = [bytes(byte_of[c] for c in piece).decode("utf-8") for piece, _ in hf.pre_tokenize_str(text)]
    assert split_text(text, hf_import.DIGITS_GPT2) == theirs


def test_digits_other_than_one_by_one_are_one_line(tmp_path):
    data = {
        "model": {"type": "BPE", "vocab": {c: i for b, i in zip(range(256), range(256), strict=True)
                                           for c in [bytes_to_unicode()[b]]}, "merges": []},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False}, {"type": "ByteLevel", "use_regex": True}]},
    }  # fmt: skip
    with pytest.raises(TokenizerError, match="individual_digits"):
        hf_import.from_hf(data)


def test_the_commands_say_a_listed_vocabulary_as_it_is(smollm_style, tmp_path, capsys):
    from test_reliability_interop import cli

    _, path = smollm_style
    tok = Tokenizer.from_hf(path)
    listed_tokens = tok.vocab_size - len(tok.special_tokens)
    code, out, err = cli(capsys, "bpe-import", path, "-o", tmp_path / "t.safetensors")
    assert code == 0 and f"{listed_tokens} tokens listed with {len(tok.merges)} merges" in out, err
    assert "<|endoftext|>=0" in out
    code, out, err = cli(capsys, "info", tmp_path / "t.safetensors")
    assert code == 0 and "v3 (tokenizer)" in out and f"({listed_tokens} tokens listed," in out, err
    code, out, err = cli(capsys, "encode", "-t", tmp_path / "t.safetensors", "In 2024")
    assert code == 0 and out.split() == [str(i) for i in tok.encode("In 2024")], err


def test_a_listed_tokenizer_encodes_files_in_worker_processes_as_in_one(llama3_style, tmp_path):
    """Worker processes get the tokenizer through its file's tensors (version 3) and give `encode`'s ids."""
    _, path = llama3_style
    tok = Tokenizer.from_hf(path)
    text = corpus().decode("utf-8")[:30_000]
    (tmp_path / "c.txt").write_text(text, encoding="utf-8")
    assert tok.encode_file(tmp_path / "c.txt", workers=2, quiet=True).tolist() == tok.encode(text)


# ---------------------------------------------------------------------------------------------
# a tokenizer.json's vocab and merges read at C speed (280k merges) against the plain loops beside them


def outcome(f, *args):
    """What a caller of f sees: its result, or its exception as (type, message)."""
    try:
        return f(*copy.deepcopy(args))
    except Exception as err:
        return type(err).__name__, str(err)


def plain_outcome(f, *args, at_once):
    """`outcome` with the C-speed readings named in `at_once` (module, name) finding fault with
    everything, so that the plain loops read it all."""
    with contextlib.ExitStack() as stack:
        for module, name in at_once:
            stack.enter_context(mock.patch.object(module, name, lambda *_: None))
        return outcome(f, *args)


def hf_listed(rng: random.Random) -> dict:
    """The tokenizer.json of a random listed vocabulary, its merges in either form, its specials in
    the model's vocab or not (GPT-2's file has them there)."""
    tok = random_listed(rng, ignore_merges=True)
    data = interop.to_hf(tok.vocab, tok.merges, tok.special_tokens, tok._pattern, ignore_merges=True)
    if rng.random() < 0.5:
        data["model"]["merges"] = [m.split(" ") for m in data["model"]["merges"]]
    if rng.random() < 0.5:
        data["model"]["vocab"].update(tok.special_tokens)
    return data


def damaged_hf(rng: random.Random, data: dict) -> None:
    """Give a tokenizer.json's vocab or merges one random fault, or none."""
    vocab, merges = data["model"]["vocab"], data["model"]["merges"]
    names = list(vocab)
    r = rng.randrange(len(merges))
    as_str = type(merges[r]) is str
    faults = [
        lambda: vocab.__setitem__(
            rng.choice(names), rng.choice([len(vocab) + 5, -1, 10**30, vocab[rng.choice(names)]])
        ),
        lambda: vocab.__setitem__(rng.choice(["a b", "\ud800", "", "é\u0100"]), rng.choice([len(vocab), 3])),
        lambda: vocab.__setitem__(rng.choice(names), min(data["added_tokens"], key=lambda t: t["id"])["id"]),
        lambda: merges.__setitem__(r, rng.choice(["a b c", "ab", "a  b", "Ġ zz", "a <|e|>", "<|s|> a", ["a", "b"]])),
        lambda: merges.__setitem__(
            r, rng.choice([["a", "b", "c"], ["a"], [1, "b"], ["a", "zz"], ["<|e|>", "a"], "a b"])
        ),
        lambda: merges.__setitem__(r, merges[r] if as_str else " ".join(merges[r])),  # the two forms mixed
        lambda: None,
    ]
    rng.choice(faults)()


HF_AT_ONCE = [(hf_import, "_hf_tokens_at_once"), (hf_import, "_hf_merges_at_once")]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 10**9))
def test_tokenizer_json_read_at_once_as_by_the_plain_loops(seed):
    """The same parts, or the same error, with the C-speed reading of vocab and merges as with the
    plain loops alone."""
    rng = random.Random(seed)
    data = hf_listed(rng)
    assert isinstance(outcome(hf_import.from_hf, data), dict)
    damaged_hf(rng, data)
    assert outcome(hf_import.from_hf, data) == plain_outcome(hf_import.from_hf, data, at_once=HF_AT_ONCE)


def test_tokenizer_json_reading_at_once_does_read_a_sound_file():
    """The premise of the test above: a sound file never reaches the plain loops."""
    for seed in range(20):
        data = hf_listed(random.Random(seed))
        vocab, specials = data["model"]["vocab"], {t["content"]: t["id"] for t in data["added_tokens"]}
        tokens = hf_import._hf_tokens_at_once(vocab, specials)
        merges = hf_import._hf_merges_at_once(data["model"]["merges"], vocab, tokens)
        assert {**hf_import.from_hf(data), "vocab": tokens, "merges": merges} == plain_outcome(
            hf_import.from_hf, data, at_once=HF_AT_ONCE
        )


def test_reading_a_tokenizer_json_pauses_the_collector_and_leaves_it_as_it_was(tmp_path):
    import doctest
    import gc

    from tokenkit.common import gcpause

    assert doctest.testmod(gcpause).failed == 0
    sound, path = json.dumps(hf_listed(random.Random(1))), tmp_path / "tokenizer.json"
    read, seen = hf_import.from_hf, []
    with mock.patch.object(hf_import, "from_hf", side_effect=lambda *a: seen.append(gc.isenabled()) or read(*a)):
        for was_on in (True, False):
            (gc.enable if was_on else gc.disable)()
            try:
                path.write_text(sound, encoding="utf-8")
                assert Tokenizer.from_hf(path).listed and gc.isenabled() == was_on
                path.write_text("{}", encoding="utf-8")  # refused, and the collector as it was all the same
                with pytest.raises(TokenizerError):
                    Tokenizer.from_hf(path)
                assert gc.isenabled() == was_on
            finally:
                gc.enable()
    assert seen == [False] * 4
