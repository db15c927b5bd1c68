"""The masked loss (transformer/loss.py): a target of IGNORE does not count.

Its gradients against finite differences in float64 on the model's variants (a whole row
ignored among them), its value against the plain cross-entropy of the forward's logits over the
counted positions (transformer/reference.py), a mask of all ones against the unmasked loss bit
for bit, and uneven counts over worker processes against the shards computed in turn. The
unmasked loss's own checks are tests/test_model.py's.
"""

import numpy as np
import pytest
from test_model import TINY, VARIANTS, float64_model, numeric_gradients, rel_error

from tokenkit.transformer import GPT, GPTConfig, ModelError
from tokenkit.transformer import reference as ref
from tokenkit.transformer.loss import IGNORE, masked_targets
from tokenkit.transformer.parallel import sum_of_shards


@pytest.mark.parametrize("variant", ["gpt2", "seed001-encoder", "llama", "llama-mha-tied"])
def test_masked_loss_gradients_match_finite_differences(variant):
    """Targets of IGNORE do not count: the loss is the plain cross-entropy of the forward's logits
    over the other positions (transformer/reference.py), and its gradients are its finite differences."""
    config = GPTConfig(**TINY, **VARIANTS[variant])
    model = float64_model(config)
    rng = np.random.default_rng(5)
    ids, targets = rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))
    targets = masked_targets(targets, rng.random((2, 5)) < 0.5)
    targets[1] = IGNORE  # a whole row that counts nothing
    targets[0, 0] = 3
    plain = ref.softmax_xent(model.forward(ids).reshape(-1, 7), targets.reshape(-1))
    loss, grads = model.loss_and_grads(ids, targets)
    assert loss == pytest.approx(plain, rel=1e-12) and model.loss(ids, targets) == pytest.approx(plain, rel=1e-12)
    for name, numeric in numeric_gradients(model, ids, targets).items():
        err = rel_error(grads[name], numeric)
        assert err < 1e-6, f"{variant} {name}: rel error {err:.2e}"


def test_every_target_counting_is_the_unmasked_loss_and_none_counting_is_refused():
    """The mask is one loss: a mask of all ones gives the plain loss's very bits; IGNORE
    everywhere has no mean (one line); a target below 0 other than IGNORE is a bad id."""
    model = GPT(GPTConfig(**TINY), seed=2)
    rng = np.random.default_rng(6)
    ids, targets = rng.integers(0, 7, (3, 6)), rng.integers(0, 7, (3, 6))
    loss, grads = model.loss_and_grads(ids, targets)
    again, grads_again = model.loss_and_grads(ids, masked_targets(targets, np.ones((3, 6), bool)))
    assert again == loss and all(np.array_equal(grads[k], grads_again[k]) for k in grads)
    with pytest.raises(ModelError, match="no position counts"):
        model.loss(ids, np.full((3, 6), IGNORE))
    with pytest.raises(ModelError, match="targets must lie"):
        model.loss(ids, np.where(targets > 3, -1, targets))


@pytest.mark.parametrize("variant", ["gpt2", "llama"])
def test_masked_shards_in_worker_processes_give_the_same_results(variant):
    """Uneven counts over shards (one shard counting nothing): worker processes give the bits of
    the shards computed in turn, and the plain mean over the counted positions."""
    config = GPTConfig(**TINY, **VARIANTS[variant])
    one, three = float64_model(config, workers=1), float64_model(config, workers=3)
    rng = np.random.default_rng(7)
    ids, targets = rng.integers(0, 7, (5, 6)), rng.integers(0, 7, (5, 6))
    targets = masked_targets(targets, rng.random((5, 6)) < 0.4)
    targets[2] = IGNORE  # the middle shard (row 2) counts nothing
    loss1, grads1 = one.loss_and_grads(ids, targets)
    loss3, grads3 = three.loss_and_grads(ids, targets, counted=int((targets != IGNORE).sum()))
    plain, plain_grads = sum_of_shards(one, ids, targets, 3)
    assert loss3 == plain and all(np.array_equal(grads3[k], plain_grads[k]) for k in grads3)
    assert loss3 == pytest.approx(loss1, rel=1e-13) and three.loss(ids, targets) == pytest.approx(loss1, rel=1e-13)
    for name, g in grads1.items():
        np.testing.assert_allclose(grads3[name], g, rtol=1e-11, atol=1e-14, err_msg=name)
    with pytest.raises(ModelError, match="not the 3 given"):
        three.loss(ids, targets, counted=3)
    three.close()
