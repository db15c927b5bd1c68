"""Chat templates to and from transformers (issue 32): tk's template exported as Jinja, a checkpoint's
own template imported, kept and rendered (bpe/jinja_template.py, bpe/template_ids.py), `tk chat`
and `tk encode --chat` in it, and every template failure one line.

References: ChatML's and Llama 3's public templates written out in plain Python (the string each
renders, the spans of the assistant's content and end token built piece by piece), encoded with
every special token read as its token; with transformers (no torch needed), its
`apply_chat_template` on the same directory; with torch too, its greedy `generate` on random tiny
Qwen2 and Llama models against `tk chat`'s answers. Without jinja2 (the `[chat]` extra), the
rendering tests skip and one test checks the line that says what to install.
"""

from __future__ import annotations

import io
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from test_reliability_interop import cli, one_line_error  # the same one-line checks

from tokenkit.bpe import Tokenizer, TokenizerError, jinja_template, template_ids
from tokenkit.bpe.chat_template import CHAT_TOKENS, add_chat_tokens, render
from tokenkit.bpe.hf_import import QWEN2_PATTERN
from tokenkit.pipeline import PipelineError, checkpoint
from tokenkit.pipeline.chat_session import ChatSession, Dropped, Reply
from tokenkit.transformer import GPT
from tokenkit.transformer.config import llama_config

ROOT = Path(__file__).parents[1]
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
BOS = "<|begin_of_text|>"
FAMILIES = {  # template, special tokens, bos, split pattern
    "chatml": (CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, QWEN2_PATTERN),
    "llama3": (LLAMA3, [BOS, "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], BOS,
               "gpt4"),
}  # fmt: skip
WORDS = ["the", " hero", " found", " a", " key", "\n", "\n\n", "  ", "?", "!", " é", "🙂", "Tom", " 42", "'s", "\t"]


def chatml_reference(messages: list[dict], prompt: bool) -> tuple[str, list[tuple[int, int]]]:
    """ChatML's string, and the (start, end) of each answer's content and <|im_end|>."""
    text, spans = "", []
    if messages[0]["role"] != "system":
        text += "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    for m in messages:
        text += f"<|im_start|>{m['role']}\n"
        start = len(text)
        text += m["content"] + "<|im_end|>"
        spans += [(start, len(text))] if m["role"] == "assistant" else []
        text += "\n"
    return text + ("<|im_start|>assistant\n" if prompt else ""), spans


def llama3_reference(messages: list[dict], prompt: bool) -> tuple[str, list[tuple[int, int]]]:
    text, spans = BOS, []
    for m in messages:
        text += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n"
        start = len(text)
        text += m["content"].strip() + "<|eot_id|>"
        spans += [(start, len(text))] if m["role"] == "assistant" else []
    return text + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if prompt else ""), spans


REFERENCES = {"chatml": chatml_reference, "llama3": llama3_reference}


def reference_ids(tok: Tokenizer, family: str, messages: list[dict], prompt: bool) -> tuple[list[int], list[bool]]:
    """The reference string encoded with its specials as tokens; a token counts when any of its
    bytes fall in an answer's span."""
    text, spans = REFERENCES[family](messages, prompt)
    ids = tok.encode(text, allowed_special="all")
    ends = np.cumsum([len(tok.decode_bytes([i])) for i in ids])
    starts = ends - [len(tok.decode_bytes([i])) for i in ids]
    mask = np.zeros(len(ids), bool)
    for a, b in spans:
        lo, hi = len(text[:a].encode()), len(text[:b].encode())
        mask |= (starts < hi) & (ends > lo)
    return ids, mask.tolist()


def words(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8)))


def conversation(rng: random.Random, prompt: bool = False) -> list[dict]:
    messages = [{"role": "system", "content": words(rng)}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 3)):
        messages += [{"role": "user", "content": words(rng)}, {"role": "assistant", "content": words(rng)}]
    return messages[:-1] if prompt else messages


def base_tokenizer(specials: list[str], pattern: str = "gpt2", bos: str | None = None) -> Tokenizer:
    rng = random.Random(0)
    text = (ROOT / "corpora" / "tiny_tales.txt").read_text(encoding="utf-8")[:8000]
    text += "".join(rng.choice(WORDS) for _ in range(2000))
    tok = Tokenizer.train([text.encode()], vocab_size=340, pattern=pattern, special_tokens=specials, quiet=True,
                          workers=1)  # fmt: skip
    if pattern == QWEN2_PATTERN:  # Qwen2's tokenizer puts text in NFC
        return Tokenizer(tok.merges, special_tokens=specials, pattern=pattern, normalizer="nfc")
    return tok if bos is None else Tokenizer(tok.merges, special_tokens=specials, pattern=pattern, bos=bos)


def hf_directory(directory: Path, family: str, tokenizer_config: dict | None = None) -> Tokenizer:
    """A tokenizer of the family exported to `directory` with the family's template in its
    tokenizer_config.json (with `tokenizer_config`'s changes); tk's import of it."""
    template, specials, bos, pattern = FAMILIES[family]
    base_tokenizer(specials, pattern, bos).export_hf(directory)
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**config, "chat_template": template, **(tokenizer_config or {})}), encoding="utf-8")
    return Tokenizer.from_hf(directory)


@pytest.fixture(scope="module")
def jinja2():
    return pytest.importorskip("jinja2")


@pytest.fixture(scope="module")
def transformers(jinja2):
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, jinja2):
    directory = tmp_path_factory.mktemp(request.param)
    return request.param, directory, hf_directory(directory, request.param)


# --- export: tk's template in Jinja ------------------------------------------------------------


def test_tk_template_in_jinja_renders_tks_ids(jinja2):
    assert jinja_template.TK_TOKENS == CHAT_TOKENS
    rng = random.Random(1)
    for bos in (None, "<|endoftext|>"):
        tok = add_chat_tokens(base_tokenizer(["<|endoftext|>"], bos=bos))
        template = jinja_template.tk_template(tok.bos)
        for _ in range(100):
            prompt = rng.random() < 0.5
            messages = conversation(rng, prompt)
            text = template.render_text(messages, generation_prompt=prompt)
            want = render(tok, messages, generation_prompt=prompt).ids.tolist()
            assert template_ids.encode_rendered(tok, text) == want


def test_export_writes_the_template_only_with_the_chat_tokens(tmp_path):
    plain = base_tokenizer(["<|endoftext|>"])
    assert "chat_template" not in json.loads(plain.export_files("hf")["tokenizer_config.json"])
    config = json.loads(add_chat_tokens(plain).export_files("hf")["tokenizer_config.json"])
    assert config["chat_template"] == jinja_template.tk_template().source


@pytest.mark.parametrize("bos", [None, "<|endoftext|>"])
def test_transformers_renders_an_export_to_tks_ids(bos, transformers, tmp_path, capsys):
    tok = add_chat_tokens(base_tokenizer(["<|endoftext|>"], bos=bos))
    random_model(tmp_path / "m.safetensors", tok)
    code, _, err = cli(capsys, "export-hf", tmp_path / "m.safetensors", "-o", tmp_path / "hf")
    assert code == 0, err
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    rng = random.Random(2)
    for _ in range(150):
        prompt = rng.random() < 0.5
        messages = conversation(rng, prompt)
        got = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt, return_dict=False)
        assert got == render(tok, messages, generation_prompt=prompt).ids.tolist(), messages


def random_model(path: Path, tok: Tokenizer, seed: int = 0, context: int = 256) -> GPT:
    """A random Llama-style tk model over `tok`, its every weight far from its init."""
    config = llama_config(vocab_size=tok.vocab_size, context_length=context, d_model=32, n_layers=2, n_heads=4,
                          n_kv_heads=2, mlp_hidden=48, rope_theta=1e4, norm_eps=1e-5)  # fmt: skip
    model = GPT(config, seed=seed)
    rng = np.random.default_rng(seed)
    for name, value in model.params.items():
        value[...] = rng.normal(1.0 if "ln" in name else 0.0, 0.3, value.shape)
    checkpoint.save_model(
        path, model.params, tok, config=config.to_dict(), step=0, val_loss=None, best_val_loss=None, provenance={}
    )
    return model


# --- import: the checkpoint's own template kept --------------------------------------------------


def exported_with(tmp_path: Path, capsys, family: str, jinja_file: str | None = None, context: int = 256,
                  **tokenizer_config) -> Path:  # fmt: skip
    """A random tk model exported to a transformers directory, given the family's template (and
    `tokenizer_config`'s changes, a chat_template.jinja of `jinja_file`): no torch needed."""
    _, specials, bos, pattern = FAMILIES[family]
    random_model(tmp_path / "base.safetensors", base_tokenizer(specials, pattern, bos), context=context)
    code, _, err = cli(capsys, "export-hf", tmp_path / "base.safetensors", "-o", tmp_path / "hf")
    assert code == 0, err
    config_path = tmp_path / "hf" / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update({"chat_template": FAMILIES[family][0], **tokenizer_config})
    config_path.write_text(json.dumps(config), encoding="utf-8")
    if jinja_file is not None:
        (tmp_path / "hf" / "chat_template.jinja").write_text(jinja_file, encoding="utf-8")
    return tmp_path / "hf"


def imported_model(tmp_path: Path, capsys, family: str, jinja_file: str | None = None, context: int = 256,
                   **tokenizer_config) -> Path:  # fmt: skip
    """`exported_with`'s directory imported back by `tk import-hf`."""
    exported_with(tmp_path, capsys, family, jinja_file, context, **tokenizer_config)
    code, _, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert code == 0, err
    return tmp_path / "m.safetensors"


@pytest.mark.parametrize("form", ["string", "list", "jinja-file"])
def test_import_keeps_the_template_in_every_form_transformers_saves(form, tmp_path, capsys):
    changes, jinja_file = {}, None
    if form == "list":
        changes = {"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": CHATML}]}
    elif form == "jinja-file":  # chat_template.jinja comes first, as in transformers 5
        changes, jinja_file = {"chat_template": "not this one"}, CHATML
    path = imported_model(tmp_path, capsys, "chatml", jinja_file, **changes)
    tok = checkpoint.load_model(path).tokenizer
    template = jinja_template.template_of(tok)
    assert template.source == CHATML and template.origin == str(tmp_path / "hf")
    row = f"its own, {len(CHATML):,} characters of Jinja, from {tmp_path / 'hf'}\n"
    code, out, _ = cli(capsys, "info", path)
    assert code == 0 and [line.split(":", 1)[1].lstrip() for line in out.splitlines(True)].count(row) == 1, out
    tok.save(tmp_path / "tok.safetensors")  # kept by every file that holds the tokenizer
    assert jinja_template.template_of(Tokenizer.load(tmp_path / "tok.safetensors")).source == CHATML
    code, out, _ = cli(capsys, "info", tmp_path / "tok.safetensors")
    assert code == 0 and row in out and "source" not in out, out  # one row, not in the training row too
    # exported again, it is written back where transformers reads it; a chat_template.jinja there,
    # which transformers 5 would read first, goes with the earlier export's files
    for _ in range(2):
        code, _, err = cli(capsys, "export-hf", path, "-o", tmp_path / "again")
        assert code == 0, err
        assert json.loads((tmp_path / "again" / "tokenizer_config.json").read_text())["chat_template"] == CHATML
        assert not (tmp_path / "again" / "chat_template.jinja").exists()
        (tmp_path / "again" / "chat_template.jinja").write_text("stale", encoding="utf-8")


def test_the_chat_tokens_added_drop_an_imported_template(tmp_path, capsys):
    tok = checkpoint.load_model(imported_model(tmp_path, capsys, "chatml")).tokenizer
    grown = add_chat_tokens(tok)
    assert jinja_template.template_of(grown) is None and template_ids.template_name(grown) == "tk"
    assert grown.special_tokens.items() >= tok.special_tokens.items()


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"chat_template": [{"name": "tool_use", "template": "x"}]}, 'none named "default"'),
        ({"chat_template": 42}, "is not a string of Jinja"),
        ({"chat_template": "x" * (jinja_template.MAX_TEMPLATE_CHARS + 1)}, "more than the 524,288"),
    ],
)
def test_a_template_tk_cannot_keep_is_one_line_and_nothing_is_written(changes, fragment, tmp_path, capsys):
    directory = exported_with(tmp_path, capsys, "chatml", **changes)
    one_line_error(cli(capsys, "import-hf", directory, "-o", tmp_path / "m.safetensors"), fragment, str(directory))
    assert not (tmp_path / "m.safetensors").exists()


# --- rendering an imported template -----------------------------------------------------------


@pytest.mark.parametrize("prompt", [False, True])
def test_rendering_equals_the_plain_reference_ids_and_mask(family, prompt):
    name, _, tok = family
    rng = random.Random(3)
    for _ in range(120):
        messages = conversation(rng, prompt)
        got = template_ids.render(tok, messages, generation_prompt=prompt)
        ids, mask = reference_ids(tok, name, messages, prompt)
        assert got.ids.tolist() == ids, messages
        assert got.mask.tolist() == mask, messages


@pytest.mark.parametrize("prompt", [False, True])
def test_rendering_equals_transformers_apply_chat_template(family, prompt, transformers):
    name, directory, tok = family
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    rng = random.Random(4)
    for _ in range(120):
        messages = conversation(rng, prompt)
        got = template_ids.render(tok, messages, generation_prompt=prompt).ids.tolist()
        assert got == theirs.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=prompt, return_dict=False
        ), messages
    # special-token text in content is read as the token, as transformers reads the rendered text
    messages = [{"role": "user", "content": "a<|endoftext|>b"}]
    got = template_ids.render(tok, messages, generation_prompt=True).ids.tolist()
    assert got == theirs.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


CHATML_TAGGED = (  # ChatML with the answers in {% generation %} blocks, whose spans transformers masks
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}"
    "{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_the_mask_equals_transformers_assistant_mask_of_generation_blocks(transformers, tmp_path):
    tok = hf_directory(tmp_path, "chatml", {"chat_template": CHATML_TAGGED})
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    plain = jinja_template.with_template(tok, jinja_template.ChatTemplate(CHATML))
    rng = random.Random(6)
    for _ in range(60):
        messages = conversation(rng)
        got = template_ids.render(tok, messages)
        assert got.ids.tolist() == template_ids.render(plain, messages).ids.tolist()  # the blocks add nothing
        want = theirs.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        assert got.ids.tolist() == want["input_ids"]
        assert got.mask.astype(int).tolist() == want["assistant_masks"], messages


def test_the_end_of_turn_is_read_off_the_template(family):
    name, _, tok = family
    want = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>"}[name]
    assert template_ids.end_of_turn(tok) == tok.special_tokens[want]


def test_encode_chat_uses_the_imported_template(family, tmp_path, capsys):
    name, directory, tok = family
    rng = random.Random(5)
    conversations = [conversation(rng) for _ in range(5)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    tok.save(tmp_path / "tok.safetensors")
    code, out, err = cli(capsys, "encode", "-t", tmp_path / "tok.safetensors", "--chat", tmp_path / "c.jsonl", "--json")
    assert code == 0, err
    for line, messages in zip(out.splitlines(), conversations, strict=True):
        ids, mask = reference_ids(tok, name, messages, False)
        assert json.loads(line)["ids"] == ids and json.loads(line)["mask"] == [int(m) for m in mask]
    code, out, err = cli(capsys, "encode", "-t", tmp_path / "tok.safetensors", "--chat", tmp_path / "c.jsonl")
    assert code == 0 and out.startswith("line 1: ") and "*" in out, err
    turns = sum(1 + len(c) + (name == "chatml" and c[0]["role"] != "system") for c in conversations)
    assert len(out.splitlines()) == turns  # a line per turn, each after its end of turn


BAD_TEMPLATES = [
    ("{% for m in messages %}{{ m['content'] }", "is not valid Jinja (line 1"),
    ("{{ raise_exception('Conversation roles must alternate') }}", "refused the conversation: Conversation roles"),
    ("{{ messages[0].nothing.deeper }}", "uses a value it is not given"),
    ("{% for i in range(99999) %}{{ messages[0]['content'] }}{% endfor %}", "makes more than"),
    ("{{ 'ab' * 900000000 }}", "makes more than"),
    ("{{ 'x'.ljust(10 ** 9) }}", "makes more than"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "makes more"),
    ("{% set _ = messages.append(1) %}", "tried what the sandbox forbids"),
]


@pytest.mark.parametrize("source, fragment", BAD_TEMPLATES)
def test_a_template_failure_is_one_line_naming_the_model(source, fragment, jinja2, tmp_path, capsys, monkeypatch):
    path = imported_model(tmp_path, capsys, "chatml", chat_template=source)
    (tmp_path / "c.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "x" * 2000}]}) + "\n")
    err = one_line_error(cli(capsys, "encode", "-t", path, "--chat", tmp_path / "c.jsonl", "--generation-prompt"),
                         fragment)  # fmt: skip
    assert f"{path}'s chat template" in err
    # tk chat: at its start (the probe of the end of turn), or the message's line refused, the session going on
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x" * 2000 + b"\n")))
    code, out, err = cli(capsys, "chat", "-m", path, "--json", "-n", "2")
    said = err if not out else json.loads(out)["error"]
    assert code == 1 and fragment in said and f"{path}'s chat template" in said and "Traceback" not in err


def test_a_template_that_runs_too_long_is_stopped(jinja2, monkeypatch):
    monkeypatch.setattr(jinja_template, "MAX_SECONDS", 0.2)
    endless = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    with pytest.raises(TokenizerError, match=r"ran longer than 0.2 s on one conversation; it loops"):
        jinja_template.ChatTemplate(endless).render_text([{"role": "user", "content": "x"}], where="m")


def test_without_jinja2_one_line_says_what_to_install(tmp_path, capsys, monkeypatch):
    path = imported_model(tmp_path, capsys, "chatml")
    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 then fails
    one_line_error(cli(capsys, "chat", "-m", path, "--json"), "needs jinja2", "pip install 'tokenkit[chat]'")


# --- tk chat in an imported template ------------------------------------------------------------


def uncached_greedy(model: GPT, ids: list[int], stops: set[int], n: int) -> list[int]:
    out = []
    for _ in range(n):
        nxt = int(np.argmax(model.forward(np.asarray([ids + out]))[0, -1]))
        if nxt in stops:
            break
        out.append(nxt)
    return out


@pytest.mark.parametrize("name", list(FAMILIES))
def test_chat_answers_in_the_imported_template_equal_the_uncached_reference(name, jinja2, tmp_path, capsys):
    path = imported_model(tmp_path, capsys, name)
    model, tok, _ = checkpoint.load_model(path)
    session = ChatSession(model, tok, system="Be brief.", temperature=0, max_new_tokens=6, where=str(path))
    assert session._end == template_ids.end_of_turn(tok)
    messages = [{"role": "system", "content": "Be brief."}]
    for text in ["Who found the key?", "And then?", " Tom's 42 "]:
        messages.append({"role": "user", "content": text})
        prompt = tok.encode(REFERENCES[name](messages, True)[0], allowed_special="all")
        reply = [e for e in session.reply(text) if isinstance(e, Reply)][0]
        assert list(reply.ids) == uncached_greedy(model, prompt, session._stops, 6)
        assert session.ids[: len(prompt)] == prompt
        messages.append({"role": "assistant", "content": reply.content})
    assert session.messages == messages
    assert any(m["content"] for m in messages[2::2])  # the premise: the model answered something


# --- against transformers' models (torch) ----------------------------------------------------------


@pytest.mark.parametrize("name, model_type", [("chatml", "Qwen2"), ("llama3", "Llama")])
def test_greedy_answers_equal_transformers(name, model_type, transformers, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    tok = hf_directory(tmp_path / "hf", name)
    cfg = getattr(transformers, model_type + "Config")(
        vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    hf_model = getattr(transformers, model_type + "ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for pname, p in hf_model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if "norm" in pname else 0.0))
    hf_model.save_pretrained(tmp_path / "hf")
    code, _, err = cli(capsys, "import-hf", tmp_path / "hf", "-o", tmp_path / "m.safetensors")
    assert code == 0, err
    model, ours, _ = checkpoint.load_model(tmp_path / "m.safetensors")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    session = ChatSession(model, ours, temperature=0, max_new_tokens=8)
    messages = []
    for text in ["Who found the key?", "And then what?", "Tom!"]:
        messages.append({"role": "user", "content": text})
        prompt = theirs.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                    eos_token_id=sorted(session._stops), pad_token_id=0)  # fmt: skip
        want = [i for i in out[0, len(prompt) :].tolist() if i not in session._stops]
        reply = [e for e in session.reply(text) if isinstance(e, Reply)][0]
        assert session.ids[: len(prompt)] == prompt
        assert list(reply.ids) == want, (text, reply.ids, want)
        messages.append({"role": "assistant", "content": reply.content})
    assert any(m["content"] for m in messages[1::2])  # the premise: the model answered something


def test_old_turns_dropped_and_a_refused_message_in_an_imported_template(jinja2, tmp_path, capsys):
    """The context fills: the oldest turns go, and what remains is the template's rendering of it;
    a message the template refuses leaves the conversation as it was."""
    picky = "{% for m in messages %}{% if 'BAD' in m['content'] %}{{ raise_exception('no BAD here') }}{% endif %}"
    path = imported_model(tmp_path, capsys, "chatml", context=96, chat_template=picky + "{% endfor %}" + CHATML)
    model, tok, _ = checkpoint.load_model(path)
    session = ChatSession(model, tok, system="Be brief.", temperature=0, max_new_tokens=4, where=str(path))
    dropped = []
    for k in range(6):
        events = list(session.reply(f"Who found the key on day {k}?"))
        dropped += [e for e in events if isinstance(e, Dropped)]
        reply = [e for e in events if isinstance(e, Reply)][0]
        prompt = tok.encode(chatml_reference(session.messages[:-1], True)[0], allowed_special="all")
        assert len(prompt) <= model.config.context_length
        assert list(reply.ids) == uncached_greedy(model, prompt, session._stops, 4)
        assert session.ids == tok.encode(chatml_reference(session.messages, False)[0], allowed_special="all")
    assert dropped and session.messages[0] == {"role": "system", "content": "Be brief."}
    before = (session.messages, session.ids)
    with pytest.raises(PipelineError, match="refused the conversation: no BAD here"):
        session.reply("a BAD message")
    assert (session.messages, session.ids) == before


def test_a_run_fine_tuned_from_an_imported_model_keeps_its_template_and_one_on_conversations_tks(tmp_path, capsys):
    path = imported_model(tmp_path, capsys, "llama3", context=128)
    (tmp_path / "corpus.txt").write_text((ROOT / "corpora" / "tiny_tales.txt").read_text()[:6000], encoding="utf-8")
    code, _, err = cli(capsys, "train-model", tmp_path / "corpus.txt", "--init-from", path, "--steps", "1",
                       "--eval-interval", "1", "--eval-batches", "1", "--batch-size", "2", "--workers", "1", "-q",
                       "-o", tmp_path / "run")  # fmt: skip
    assert code == 0, err
    tok = checkpoint.load_model(tmp_path / "run").tokenizer
    assert jinja_template.template_of(tok).source == LLAMA3
    # fine-tuned on conversations, it learns tk's template (its tokens added), and chats in it
    rng = random.Random(7)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"messages": conversation(rng)}) + "\n" for _ in range(30)))
    code, _, err = cli(capsys, "train-model", "--chat", tmp_path / "c.jsonl", "--init-from", path, "--steps", "1",
                       "--eval-interval", "1", "--eval-batches", "1", "--batch-size", "2", "--workers", "1", "-q",
                       "-o", tmp_path / "sft")  # fmt: skip
    assert code == 0, err
    tok = checkpoint.load_model(tmp_path / "sft").tokenizer
    assert jinja_template.template_of(tok) is None and template_ids.template_name(tok) == "tk"


def test_a_model_with_tks_tokens_and_its_own_template_learns_tks_on_conversations(tmp_path):
    """Phi-4-mini names its tokens as tk's: fine-tuned on conversations (rendered in tk's
    template), its own template gives way to tk's, which `tk chat` then speaks."""
    import dataclasses

    from tokenkit.bpe.chat_template import add_chat_tokens
    from tokenkit.pipeline.chat_start import with_chat_tokens
    from tokenkit.pipeline.start_from import StartFrom
    from tokenkit.transformer import GPT, GPTConfig

    tok = add_chat_tokens(Tokenizer.train([b"the fox ran up a hill " * 40], vocab_size=270, quiet=True))
    own = jinja_template.with_template(tok, jinja_template.ChatTemplate(LLAMA3, origin="a test"))
    assert jinja_template.template_of(own).source == LLAMA3 and jinja_template.template_of(tok) is None
    model = GPT(GPTConfig(vocab_size=own.vocab_size, context_length=16, d_model=16, n_layers=1, n_heads=2))
    init = StartFrom(tmp_path / "m", model.params, own, model.config)
    started, note = with_chat_tokens(init)
    assert jinja_template.CHAT_TEMPLATE not in started.tokenizer.training and "gives way to tk's" in note
    assert started.tokenizer.special_tokens == own.special_tokens and started.params is init.params
    plain = dataclasses.replace(init, tokenizer=tok)
    assert with_chat_tokens(plain) == (plain, None)
