"""tk's chat template (bpe/chat_template.py), the chat tokens added to a tokenizer, a model's
vocabulary grown to match (transformer/vocab.py), and `tk encode --chat`.

The rendering is compared with a plain reference: the template written out as one string, then
encoded with its special tokens read as tokens (what transformers' apply_chat_template does with
the rendered Jinja text), by tk and by HF tokenizers on tk's exported tokenizer.json; the mask
with the pieces' roles, token by token.
"""

from __future__ import annotations

import json
import os
import random
import stat

import numpy as np
import pytest

from tokenkit.bpe import Tokenizer, TokenizerError
from tokenkit.bpe.chat_template import CHAT_TOKENS, END, ROLE_TOKENS, add_chat_tokens, missing, render
from tokenkit.bpe.conversations import Conversation
from tokenkit.cli.main import main
from tokenkit.transformer import GPT, GPTConfig, ModelError, llama_config
from tokenkit.transformer import vocab as model_vocab
from tokenkit.transformer.model import init_params

WORDS = ["the", " hero", " found", " a", " key", "\n", "\n\n", "  ", "?", "!", " é", "🙂", "Tom", " 42", "'s", "\t"]


@pytest.fixture(scope="module")
def base() -> Tokenizer:
    rng = random.Random(0)
    text = "".join(rng.choice(WORDS) for _ in range(4000)).encode()
    return Tokenizer.train([text], vocab_size=350, special_tokens=["<|endoftext|>"], quiet=True)


@pytest.fixture(scope="module")
def tok(base) -> Tokenizer:
    return add_chat_tokens(base)


def random_conversation(rng: random.Random, prompt: bool = False) -> list[dict]:
    messages = [{"role": "system", "content": text(rng)}] if rng.random() < 0.5 else []
    for turn in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": text(rng)})
        if not (prompt and turn == 2) and not (prompt and rng.random() < 0.3):
            messages.append({"role": "assistant", "content": text(rng)})
        else:
            break
    if prompt and messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": text(rng)})
    return messages


def text(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8)))


def reference(tok: Tokenizer, messages: list[dict], generation_prompt: bool = False) -> tuple[list[int], list[bool]]:
    """The template as a string, encoded with its specials as tokens; and the mask, piece by piece."""
    pieces = []  # (text, counts)
    for m in messages:
        counts = m["role"] == "assistant"
        pieces += [("<|" + m["role"] + "|>", False), (m["content"], counts), ("<|end|>", counts)]
    if generation_prompt:
        pieces.append(("<|assistant|>", False))
    ids = tok.encode("".join(p for p, _ in pieces), allowed_special="all")
    mask = []
    for piece, counts in pieces:
        mask += [counts] * len(tok.encode(piece, allowed_special="all"))
    assert len(mask) == len(ids)  # every boundary is a special token: the pieces encode alone
    return ids, mask


@pytest.mark.parametrize("generation_prompt", [False, True])
def test_render_is_the_string_template_encoded(tok, generation_prompt):
    rng = random.Random(1)
    for _ in range(200):
        messages = random_conversation(rng, prompt=generation_prompt)
        got = render(tok, messages, generation_prompt=generation_prompt)
        ids, mask = reference(tok, messages, generation_prompt)
        assert got.ids.tolist() == ids
        assert got.mask.tolist() == mask
        assert got.ids.dtype == tok.ids_dtype and got.mask.dtype == bool


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_hf_tokenizers_encode_the_rendered_string_to_the_same_ids(tok, pattern):
    tokenizers = pytest.importorskip("tokenizers")
    if pattern != "gpt2":
        text = "".join(random.Random(7).choice(WORDS) for _ in range(4000)).encode()
        tok = add_chat_tokens(Tokenizer.train([text], vocab_size=350, pattern=pattern, quiet=True))
    hf = tokenizers.Tokenizer.from_str(tok.export_files("hf")["tokenizer.json"].decode("utf-8"))
    rng = random.Random(2)
    for _ in range(100):
        prompt = rng.random() < 0.5
        messages = random_conversation(rng, prompt=prompt)
        rendered = "".join("<|" + m["role"] + "|>" + m["content"] + "<|end|>" for m in messages)
        rendered += "<|assistant|>" if prompt else ""
        assert (
            hf.encode(rendered, add_special_tokens=False).ids
            == render(tok, messages, generation_prompt=prompt).ids.tolist()
        )


def test_the_mask_is_the_assistant_content_and_its_end(tok):
    special = tok.special_tokens
    rng = random.Random(3)
    for _ in range(100):
        messages = random_conversation(rng)
        r = render(tok, messages)
        ids, mask = r.ids.tolist(), r.mask.tolist()
        heads = [k for k, i in enumerate(ids) if i in {special[t] for t in ROLE_TOKENS.values()}]
        assert [ids[k] for k in heads] == [special[ROLE_TOKENS[m["role"]]] for m in messages]
        for m, start, stop in zip(messages, heads, heads[1:] + [len(ids)], strict=True):
            assert ids[stop - 1] == special[END] and not mask[start]  # the header never counts
            assert all(mask[start + 1 : stop]) == (m["role"] == "assistant")
            assert any(mask[start + 1 : stop]) == (m["role"] == "assistant")
            assert tok.decode(ids[start + 1 : stop - 1]) == m["content"]
        assert sum(mask) == sum(len(tok.encode(m["content"])) + 1 for m in messages if m["role"] == "assistant")


def test_the_generation_prompt_ends_with_the_assistant_opening(tok):
    messages = [{"role": "user", "content": "the hero?"}]
    with_prompt = render(tok, messages, generation_prompt=True)
    assert with_prompt.ids[-1] == tok.special_tokens["<|assistant|>"] and not with_prompt.mask.any()
    answered = messages + [{"role": "assistant", "content": "Tom"}]
    full = render(tok, answered).ids.tolist()
    assert full[: len(with_prompt.ids)] == with_prompt.ids.tolist()  # the answer continues the prompt
    with pytest.raises(TokenizerError, match="ends with the assistant's answer"):
        render(tok, Conversation.of(answered), generation_prompt=True)
    with pytest.raises(TokenizerError, match="a prompt ends with the user's turn"):
        render(tok, answered, generation_prompt=True)


@pytest.mark.parametrize("name", [*CHAT_TOKENS, "<|endoftext|>"])
def test_special_token_text_in_content_stays_text(tok, name):
    messages = [
        {"role": "user", "content": f"a{name}b {name}"},
        {"role": "assistant", "content": name + "<|user|>x"},
    ]
    r = render(tok, messages)
    ids = r.ids.tolist()
    specials = set(tok.special_tokens.values())
    assert [i for i in ids if i in specials] == [tok.special_tokens[t] for t in ("<|user|>", END, "<|assistant|>", END)]
    assert tok.decode(ids) == "".join("<|" + m["role"] + "|>" + m["content"] + "<|end|>" for m in messages)
    assert r.mask.sum() == len(tok.encode(messages[1]["content"], disallowed_special=())) + 1


def test_a_bos_comes_first_and_does_not_count():
    tok = add_chat_tokens(Tokenizer([], special_tokens=["<s>"], bos="<s>"))
    r = render(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    assert r.ids[0] == tok.special_tokens["<s>"] and not r.mask[0]
    assert r.ids[1] == tok.special_tokens["<|user|>"]


def test_a_tokenizer_without_the_tokens_or_reading_one_as_text_is_refused(base):
    assert missing(base) == list(CHAT_TOKENS)
    with pytest.raises(TokenizerError, match="lacks the chat template's special tokens <|system|>"):
        render(base, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])
    as_text = Tokenizer([], special_tokens=["<|end|>"], text_tokens=["<|end|>"])
    with pytest.raises(TokenizerError, match="reads '<|end|>' as text"):
        add_chat_tokens(as_text)


# ------------------------------------------------------------------------------- growing a tokenizer


def listed_tokenizer() -> Tokenizer:
    """A listed vocabulary with a special token first (SmolLM's kind of layout)."""
    vocab = [None] + [bytes([b]) for b in range(256)] + [b"ab"]
    return Tokenizer([(98, 99)], vocab=vocab, special_tokens={"<|im_start|>": 0})


@pytest.mark.parametrize("which", ["trained", "listed", "has_end", "bare"])
def test_adding_the_tokens_appends_ids_and_keeps_every_other(base, which, tmp_path):
    old = {
        "trained": base,
        "listed": listed_tokenizer(),
        "has_end": Tokenizer([(104, 105)], special_tokens=["<|end|>", "<|endoftext|>"]),
        "bare": Tokenizer([(104, 105)], pattern="gpt4"),
    }[which]
    new = add_chat_tokens(old)
    added = [t for t in CHAT_TOKENS if t not in old.special_tokens]
    assert {t: new.special_tokens[t] for t in added} == {t: old.vocab_size + k for k, t in enumerate(added)}
    assert new.vocab_size == old.vocab_size + len(added)
    assert {t: new.special_tokens[t] for t in old.special_tokens} == old.special_tokens
    assert new.merges == old.merges and new.pattern == old.pattern and new.options == old.options
    assert new.decode_bytes(range(old.vocab_size)) == old.decode_bytes(range(old.vocab_size))
    rng = random.Random(4)
    for _ in range(50):
        sample = "".join(rng.choice(WORDS + list(old.special_tokens)) for _ in range(12))
        assert new.encode(sample, allowed_special="all") == old.encode(sample, allowed_special="all")
        assert new.encode(sample, disallowed_special=()) == old.encode(sample, disallowed_special=())
    new.save(tmp_path / "t.safetensors")
    assert Tokenizer.load(tmp_path / "t.safetensors").special_tokens == new.special_tokens
    assert add_chat_tokens(new) is new


# --------------------------------------------------------------------------------- growing a model


@pytest.mark.parametrize("tied", [True, False])
def test_growing_the_vocabulary_keeps_old_rows_and_outputs(tied):
    kind = dict(vocab_size=20, context_length=8, d_model=16, n_layers=1, n_heads=2)
    config = GPTConfig(**kind) if tied else llama_config(**kind)
    params = init_params(config, seed=5)
    kept = {name: a.copy() for name, a in params.items()}
    grown, new_config = model_vocab.grow_vocab(params, config, 24)
    assert new_config.vocab_size == 24 and new_config.tie_embeddings == tied
    names = model_vocab.grown_names(config)
    assert set(names) == ({"wte.weight"} if tied else {"wte.weight", "lm_head.weight"})
    for name, a in grown.items():
        assert np.array_equal(params[name], kept[name])  # the caller's arrays are untouched
        if name in names:
            assert a.shape == (24, 16) and a.dtype == np.float32
            assert np.array_equal(a[:20], kept[name])  # bit for bit
            mean = kept[name].astype(np.float64).mean(axis=0).astype(np.float32)
            assert np.array_equal(a[20:], np.broadcast_to(mean, (4, 16)))
        else:
            assert a is params[name]
    ids = np.array([[1, 5, 19, 0, 3]])
    before = GPT.from_params(config, params).forward(ids)
    after = GPT.from_params(new_config, grown).forward(ids)
    assert after.shape == (1, 5, 24)
    np.testing.assert_array_equal(after[..., :20], before)  # the old ids' logits are what they were
    assert model_vocab.grow_vocab(params, config, 20) == (params, config)


def test_growing_the_vocabulary_is_bounded(monkeypatch):
    config = GPTConfig(vocab_size=20, context_length=8, d_model=16, n_layers=1, n_heads=2)
    params = init_params(config)
    with pytest.raises(ModelError, match="a vocabulary only grows"):
        model_vocab.grow_vocab(params, config, 19)
    with pytest.raises(ModelError, match="more than the 16,777,216"):
        model_vocab.grow_vocab(params, config, (1 << 24) + 1)
    with pytest.raises(ModelError, match="must be an integer"):
        model_vocab.grow_vocab(params, config, 24.0)
    with pytest.raises(ModelError, match="parameter wte.weight has shape"):
        model_vocab.grow_vocab({**params, "wte.weight": params["wte.weight"][:5]}, config, 24)
    monkeypatch.setattr(model_vocab, "available_bytes", lambda: 1000)
    with pytest.raises(ModelError, match="needs .* GiB for the new embedding; 0.0 GiB are free"):
        model_vocab.grow_vocab(params, config, 24)


# ------------------------------------------------------------------------------------ the CLI


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_encode_chat_prints_what_render_gives(tok, tmp_path, capsys):
    path, rng = tmp_path / "tok.safetensors", random.Random(6)
    tok.save(path)
    for prompt in (False, True):
        conversations = [random_conversation(rng, prompt) for _ in range(5)]
        chats = tmp_path / "c.jsonl"
        chats.write_text("\n\n".join(json.dumps({"messages": m}) for m in conversations) + "\n", encoding="utf-8")
        flags = ["--generation-prompt"] if prompt else []
        code, out, err = run(capsys, "encode", "-t", path, "--chat", chats, "--json", *flags)
        assert code == 0 and err == ""
        expected = [render(tok, m, generation_prompt=prompt) for m in conversations]
        assert [json.loads(x) for x in out.splitlines()] == [
            {"line": 2 * k + 1, "ids": r.ids.tolist(), "mask": r.mask.astype(int).tolist()}
            for k, r in enumerate(expected)
        ]
        code, out, err = run(capsys, "encode", "-t", path, "--chat", chats, *flags)
        assert code == 0 and err == ""
        assert out.count("*") == sum(int(r.mask.sum()) for r in expected) + len(expected)  # and each header's "(*)"
        assert out.count("<|end|>") == sum(len(m) for m in conversations)


def test_encode_chat_shows_tokens_and_marks_those_that_count(tok, tmp_path, capsys):
    path = tmp_path / "tok.safetensors"
    tok.save(path)
    chats = tmp_path / "c.jsonl"
    messages = [{"role": "user", "content": "<|end|>"}, {"role": "assistant", "content": "Tom"}]
    chats.write_text(json.dumps({"messages": messages}) + "\n", encoding="utf-8")
    code, out, _ = run(capsys, "encode", "-t", path, "--chat", chats)
    lines = out.splitlines()
    counted = [t for t in lines[2].split() if t.startswith("*")]
    assert code == 0 and lines[0] == f"line 1: {len(render(tok, messages).ids)} tokens, {len(counted)} counted (*)"
    assert lines[1].startswith("  <|user|> '<") and lines[1].endswith(" <|end|>")  # the typed one is quoted text
    assert lines[2].startswith("  <|assistant|> *'") and counted[-1] == "*<|end|>"


def test_add_chat_tokens_writes_a_new_tokenizer(base, tmp_path, capsys):
    src, out_path = tmp_path / "base.safetensors", tmp_path / "chat.safetensors"
    base.save(src)
    chats = tmp_path / "c.jsonl"
    chats.write_text(
        json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})
    )
    line = "error: " + f"{src} lacks the chat template's special tokens " + ", ".join(CHAT_TOKENS)
    code, out, err = run(capsys, "encode", "-t", src, "--chat", chats)
    assert (code, out) == (1, "") and err.startswith(line) and "--add-chat-tokens" in err and len(err.splitlines()) == 1
    code, out, err = run(capsys, "encode", "-t", src, "--add-chat-tokens", out_path)
    assert code == 0 and out.startswith(f"wrote {out_path}: vocab size {base.vocab_size + 4}; added <|system|>=350")
    assert Tokenizer.load(out_path).special_tokens == add_chat_tokens(base).special_tokens
    before = out_path.read_bytes()
    code, out, err = run(capsys, "encode", "-t", src, "--add-chat-tokens", out_path)
    assert code == 1 and "exists; --add-chat-tokens writes a new file" in err and out_path.read_bytes() == before
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, out, err = run(capsys, "encode", "-t", src, "--add-chat-tokens", fifo)
    assert code == 1 and len(err.splitlines()) == 1 and "FIFO" in err and stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.mark.parametrize(
    "flags",
    [["hello"], ["-f", "x.txt"], ["-o", "ids.npy"], ["--show"], ["--allow-special"], ["--specials-as-text"],
     ["--eot", "<|end|>"], ["--text-field", "text"]],
)  # fmt: skip
def test_chat_takes_no_text_flags(tok, tmp_path, capsys, flags):
    path = tmp_path / "tok.safetensors"
    tok.save(path)
    code, out, err = run(capsys, "encode", "-t", path, "--chat", tmp_path / "c.jsonl", *flags)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1 and "--chat and --add-chat-tokens" in err
    code, _, err = run(capsys, "encode", "-t", path, "--generation-prompt", "hello")
    assert code == 1 and "--chat and --add-chat-tokens take only" in err


def test_the_modules_examples_hold():
    import doctest

    from tokenkit.bpe import chat_template, conversations

    for module in (chat_template, conversations, model_vocab):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_bpe_export_of_a_template_refuses_a_stranger_s_template_file_that_would_win(tok, base, tmp_path, capsys):
    # transformers 5 reads chat_template.jinja before tokenizer_config.json's template: an export
    # with a template beside one would be read with the other template; the file is not ours to remove
    tok.save(tmp_path / "chat.safetensors")
    base.save(tmp_path / "plain.safetensors")
    for name in ("chat", "plain"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "chat_template.jinja").write_text("theirs", encoding="utf-8")
    assert main(["bpe-export", str(tmp_path / "chat.safetensors"), "--format", "hf", "-o", str(tmp_path / "chat")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "chat_template.jinja" in err and "Traceback" not in err, err
    assert sorted(p.name for p in (tmp_path / "chat").iterdir()) == ["chat_template.jinja"]
    # a tokenizer without a template leaves the choice to the file, as before
    plain = ["bpe-export", str(tmp_path / "plain.safetensors"), "--format", "hf", "-o", str(tmp_path / "plain")]
    assert main(plain) == 0
    for name in ("chat", "plain"):
        assert (tmp_path / name / "chat_template.jinja").read_text(encoding="utf-8") == "theirs"
