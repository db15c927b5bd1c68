"""The forward trace's contract (transformer/trace.py): a forward pass records exactly the entries
`trace.shapes` declares, with those shapes, for every kind of block; the page's arithmetic and the
explain steps name only declared entries."""

import re
from pathlib import Path

import numpy as np
import pytest

from tokenkit.transformer import GPT, GPTConfig, trace
from tokenkit.transformer.explain import explain_model

PAGE = Path(__file__).parents[1] / "cli" / "page"

CONFIGS = {
    "gpt2": GPTConfig(vocab_size=40, context_length=16, d_model=16, n_layers=2, n_heads=2),
    "post-norm": GPTConfig(
        vocab_size=40, context_length=16, d_model=16, n_layers=2, n_heads=4, norm="post", causal=False,
        positional="sinusoidal", activation="relu",
    ),
    "mlp-hidden": GPTConfig(vocab_size=40, context_length=16, d_model=16, n_layers=1, n_heads=2, mlp_hidden=24),
    "llama": GPTConfig(
        vocab_size=40, context_length=16, d_model=16, n_layers=2, n_heads=4, positional="rope", norm_type="rmsnorm",
        activation="swiglu", n_kv_heads=2, tie_embeddings=False, bias=False,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", CONFIGS)
def test_the_forward_pass_records_what_trace_declares(name):
    config = CONFIGS[name]
    recorded: dict = {}
    GPT(config, seed=0).forward(np.arange(10).reshape(2, 5), trace=recorded)
    declared = trace.shapes(config, 2, 5)
    assert set(recorded) == set(declared)
    for key, shape in declared.items():
        assert recorded[key].shape == shape, key


def test_a_recorder_keeps_only_what_it_is_asked_for():
    config = CONFIGS["gpt2"]
    model, ids = GPT(config, seed=0), np.arange(5)[None]
    whole: dict = {}
    model.forward(ids, trace=whole)
    kept = trace.Recorder(lambda key: trace.split_key(key)[1] == "attn.weights", lambda key, w: w[0, 1])
    model.forward(ids, trace=kept)
    assert list(kept) == ["h.0.attn.weights", "h.1.attn.weights"]
    for key, w in kept.items():
        np.testing.assert_array_equal(w, whole[key][0, 1])


def _declared(key: str) -> bool:
    layer, name = trace.split_key(key)
    if name in trace.DERIVED:
        return True
    if name.startswith(("ln_1.", "ln_2.")):  # RMSNorm's rows, under the norm's name
        return name.split(".", 1)[1] in trace.DERIVED
    return name in (trace.MODEL if layer is None else trace.BLOCK)


def test_every_explain_step_of_a_model_is_a_declared_name():
    for config in CONFIGS.values():
        expl = explain_model(GPT(config, seed=0), np.arange(4), [str(i) for i in range(4)], layer=config.n_layers - 1)
        undeclared = [s.key for s in expl.steps if s.key != "logits" and not _declared(s.key)]
        assert not undeclared


def _js_table(source: str, name: str) -> list[str]:
    """The names of a `const NAME = {short: "name", ...};` table of a page script."""
    table = re.search(rf"const {name} = \{{(.*?)\}};", source, re.DOTALL)
    assert table, name
    return re.findall(r'"([a-z_0-9.]+)"', table.group(1))


def test_the_pages_arithmetic_names_only_declared_entries():
    """attention.js's arithmetic names the explain steps it reads in three tables; each is declared here."""
    source = (PAGE / "attention.js").read_text(encoding="utf-8")
    block, model, norm = (_js_table(source, name) for name in ("BLOCK_KEY", "MODEL_KEY", "NORM_KEY"))
    assert all(n in trace.BLOCK or n in trace.DERIVED for n in block), block
    assert all(n in trace.MODEL or n in trace.DERIVED for n in model), model
    assert all(n in trace.DERIVED for n in norm), norm
    assert len(block) > 15 and model and norm


def test_doctests():
    import doctest

    from tokenkit.transformer import explanation

    for module in (trace, explanation):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
