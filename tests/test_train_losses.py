"""Training objectives on hand-made arrays, and the TTT unroll against the inference draft chain."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eagle_jax.draft import DraftConfig, draft_forward, init_draft_params, project_features
from eagle_jax.model.kv_cache import KVCache
from eagle_jax.model.transformer import causal_mask, forward
from eagle_jax.train.losses import eagle1_loss, eagle3_loss, restrict_to_draft_vocab, shift_left
from eagle_jax.train.optim import OptimConfig, learning_rate
from eagle_jax.train.ttt import unroll


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_shift_left():
    x = jnp.arange(10).reshape(2, 5)
    np.testing.assert_array_equal(shift_left(x, 2), [[2, 3, 4, 0, 0], [7, 8, 9, 0, 0]])
    np.testing.assert_array_equal(shift_left(x, 0), x)


def test_eagle3_step_k_at_t_is_scored_on_token_t_plus_k_plus_2():
    """One assistant token, x_4: step 0 learns it at t=2, step 1 at t=1, step 2 at t=0, each against
    the target's distribution at position 3 (which predicts x_4)."""
    rng = np.random.default_rng(0)
    b, t, v, steps = 1, 6, 5, 3
    target = rng.normal(size=(b, t, v)).astype(np.float32) * 3
    mask = np.zeros((b, t), bool)
    mask[0, 4] = True
    draft = [rng.normal(size=(b, t, v)).astype(np.float32) for _ in range(steps)]
    # step k gets the target's argmax at position 3 exactly at its scored position 2 - k
    label = int(np.argmax(target[0, 3]))
    for k in range(steps):
        draft[k][0, 2 - k] = -5.0
        draft[k][0, 2 - k, label] = 5.0
    out = eagle3_loss([jnp.asarray(d) for d in draft], jnp.asarray(target), jnp.asarray(mask), None)
    np.testing.assert_array_equal(out.count, [1, 1, 1])
    np.testing.assert_array_equal(out.correct, [1, 1, 1])
    p = softmax(target[0, 3])
    expected = [-(p * np.log(softmax(draft[k][0, 2 - k]))).sum() for k in range(steps)]
    np.testing.assert_allclose(out.token_loss, expected, rtol=1e-5)
    # the objective: 0.8**k weights, each step averaged over all B*T positions
    np.testing.assert_allclose(out.loss, sum(0.8**k * e for k, e in enumerate(expected)) / (b * t), rtol=1e-5)


def test_eagle3_loss_matches_an_explicit_loop_with_a_draft_vocabulary():
    rng = np.random.default_rng(1)
    b, t, v, steps = 2, 7, 9, 3
    used = np.array([1, 2, 4, 6, 7])
    target = rng.normal(size=(b, t, v)).astype(np.float32) * 2
    mask = rng.random((b, t)) < 0.7
    draft = [rng.normal(size=(b, t, len(used))).astype(np.float32) for _ in range(steps)]
    out = eagle3_loss([jnp.asarray(d) for d in draft], jnp.asarray(target), jnp.asarray(mask), jnp.asarray(used))
    loss = 0.0
    for k in range(steps):
        token_loss, correct, count = 0.0, 0, 0
        for row in range(b):
            for pos in range(t - k - 2):
                if not mask[row, pos + k + 2]:
                    continue
                count += 1
                teacher = target[row, pos + k + 1]
                if np.argmax(teacher) not in used:  # the target's choice is outside the draft vocabulary
                    continue
                p = softmax(teacher[used])  # restricted and renormalised
                token_loss += -(p * np.log(softmax(draft[k][row, pos]))).sum()
                correct += int(np.argmax(draft[k][row, pos]) == np.argmax(p))
        np.testing.assert_allclose(out.token_loss[k], token_loss, rtol=1e-5)
        assert (int(out.correct[k]), int(out.count[k])) == (correct, count)
        loss += 0.8**k * token_loss / (b * t)
    np.testing.assert_allclose(out.loss, loss, rtol=1e-5)


def test_restriction_renormalises_and_masks_out_of_vocabulary_argmax():
    logits = jnp.array([[[0.0, 2.0, 1.0, 0.5], [3.0, 0.0, 1.0, 0.0]]])  # argmax 1 (in), argmax 0 (out)
    teacher, in_vocab = restrict_to_draft_vocab(logits, jnp.array([1, 2]))
    np.testing.assert_allclose(jax.nn.softmax(teacher[0, 0]), softmax(np.array([2.0, 1.0])), rtol=1e-6)
    np.testing.assert_array_equal(in_vocab, [[True, False]])
    full, everywhere = restrict_to_draft_vocab(logits, None)
    assert full is logits and bool(everywhere.all())


def test_eagle1_loss_regression_plus_classification_over_mask_sum():
    rng = np.random.default_rng(2)
    b, t, d, v = 2, 5, 4, 6
    feats = rng.normal(size=(b, t, d)).astype(np.float32)
    target = rng.normal(size=(b, t, v)).astype(np.float32)
    pred = feats + rng.normal(size=(b, t, d)).astype(np.float32) * 1.5  # some errors above 1: both SmoothL1 branches
    logits = rng.normal(size=(b, t, v)).astype(np.float32)
    mask = rng.random((b, t)) < 0.8
    out = eagle1_loss(*map(jnp.asarray, (pred, logits, feats, target, mask)))
    total, count, correct = 0.0, 0, 0
    for row in range(b):
        for pos in range(t - 2):
            if mask[row, pos + 2]:
                err = np.abs(pred[row, pos] - feats[row, pos + 1])
                smooth_l1 = np.where(err < 1, 0.5 * err**2, err - 0.5).mean()
                p = softmax(target[row, pos + 1])
                total += smooth_l1 + 0.1 * -(p * np.log(softmax(logits[row, pos]))).sum()
                count += 1
                correct += int(np.argmax(logits[row, pos]) == np.argmax(p))
    np.testing.assert_allclose(out.loss, total / count, rtol=1e-5)
    assert (int(out.correct[0]), int(out.count[0])) == (correct, count)


def random_draft_params(dcfg: DraftConfig, seed: int) -> dict:
    """A head with random weights (numpy draws: no compile), norms near 1."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: init_draft_params(jax.random.key(0), dcfg))
    return jax.tree_util.tree_map_with_path(
        lambda path, s: jnp.zeros(s.shape, s.dtype) if s.dtype == jnp.int32
        else jnp.asarray((1.0 if "norm" in jax.tree_util.keystr(path) else 0.0) + 0.2 * rng.normal(size=s.shape), s.dtype),
        shapes,
    )


@pytest.mark.parametrize("flags", [{}, {"fc_norm": True, "norm_output": True}], ids=["eagle3", "eagle3.1"])
def test_ttt_equals_the_inference_chain(flags, tiny_target):
    """Step k at position t of the unroll == the draft run as at inference: the context 0..t in the
    draft cache (a causal prefill, cache length t + 1), then k chained single-token calls at
    positions t+1..t+k, each seeing the earlier chain keys through extra_kv."""
    cfg, target_params = tiny_target
    dcfg = DraftConfig.for_target(cfg, "eagle3", draft_vocab_size=40, **flags)
    dparams = random_draft_params(dcfg, seed=1)
    b, t, steps = 2, 9, 4
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, cfg.vocab_size, (b, t)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    target_forward = jax.jit(forward, static_argnames=("cfg", "capture"))
    target_out = target_forward(target_params, cfg, tokens, positions, None, causal_mask(jnp.ones((b, t), bool)), capture=dcfg.feature_layers)
    hidden = project_features(dparams, dcfg, target_out)
    outs = jax.jit(unroll, static_argnums=(1, 5))(dparams, dcfg, target_params, hidden, tokens, steps)
    draft = jax.jit(draft_forward, static_argnums=1)
    empty = KVCache.zeros(1, b, 0, dcfg.num_kv_heads, dcfg.head_dim, jnp.float32)
    prefill = draft(dparams, dcfg, target_params, hidden, shift_left(tokens, 1), positions, empty, causal_mask(jnp.ones((b, t), bool)))
    np.testing.assert_allclose(outs[0].logits, prefill.logits, atol=2e-5)
    for pos in range(t - steps):
        cache = KVCache.zeros(1, b, t, dcfg.num_kv_heads, dcfg.head_dim, jnp.float32)
        cache = cache.write(prefill.k_new, prefill.v_new, jnp.full((b,), pos + 1))  # context 0..pos visible
        # chain keys of the earlier nodes, in fixed-size slots (one compile); the mask shows the k - 1 filled ones
        chain_k = jnp.zeros((b, steps - 1, dcfg.num_kv_heads, dcfg.head_dim))
        chain_v = jnp.zeros_like(chain_k)
        h = prefill.hidden[:, pos: pos + 1]
        for k in range(1, steps):
            mask = jnp.broadcast_to(jnp.arange(steps) < k - 1, (b, 1, steps)).at[:, :, -1].set(True)
            node = draft(dparams, dcfg, target_params, h, tokens[:, pos + k + 1: pos + k + 2], jnp.full((b, 1), pos + k),
                         cache, mask, (chain_k, chain_v))
            np.testing.assert_allclose(outs[k].logits[:, pos], node.logits[:, 0], atol=2e-5)
            h = node.hidden
            chain_k = chain_k.at[:, k - 1].set(node.k_new[0, :, 0])
            chain_v = chain_v.at[:, k - 1].set(node.v_new[0, :, 0])


def test_scored_rematerialized_unroll_gives_the_loss_and_gradients_of_all_logits_at_once(tiny_target):
    """Training scores each TTT step inside a rematerialized step (`unroll(score=...)`, the
    Objective's path): its loss, metrics and gradients equal eagle3_loss over every step's logits."""
    from eagle_jax.train.losses import eagle3_combine, eagle3_step_terms

    cfg, target_params = tiny_target
    dcfg = DraftConfig.for_target(cfg, "eagle3", draft_vocab_size=40, fc_norm=True, norm_output=True)
    dparams = {k: v for k, v in random_draft_params(dcfg, seed=2).items() if k != "d2t"}  # d2t is not trained
    b, t, steps = 2, 12, 4
    rng = np.random.default_rng(5)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, t)), jnp.int32)
    mask = jnp.asarray(rng.random((b, t)) < 0.7)
    used = jnp.asarray(np.sort(rng.choice(cfg.vocab_size, 40, replace=False)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    target_out = forward(target_params, cfg, tokens, positions, None, causal_mask(jnp.ones((b, t), bool)), capture=dcfg.feature_layers)
    target_logits = jax.random.normal(jax.random.key(4), (b, t, cfg.vocab_size))

    def all_at_once(dparams):
        outs = unroll(dparams, dcfg, target_params, project_features(dparams, dcfg, target_out), tokens, steps)
        out = eagle3_loss([o.logits for o in outs], target_logits, mask, used)
        return out.loss, out

    def scored(dparams):
        teacher, in_vocab = restrict_to_draft_vocab(target_logits, used)
        terms = unroll(dparams, dcfg, target_params, project_features(dparams, dcfg, target_out), tokens, steps,
                       score=lambda k, logits: eagle3_step_terms(k, logits, teacher, in_vocab, mask))
        out = eagle3_combine(terms, mask.size)
        return out.loss, out

    (grads, out), (scored_grads, scored_out) = (jax.jit(jax.grad(f, has_aux=True))(dparams) for f in (all_at_once, scored))
    np.testing.assert_allclose(scored_out.token_loss, out.token_loss, rtol=1e-6)
    assert np.array_equal(scored_out.correct, out.correct) and np.array_equal(scored_out.count, out.count)
    assert int(out.count.sum()) > 0 and float(out.loss) > 0
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), scored_grads, grads)


def test_learning_rate_warmup_then_decay():
    schedule = learning_rate(OptimConfig(lr=1.0, total_steps=10, warmup_steps=2))
    np.testing.assert_allclose([schedule(s) for s in (0, 1, 2, 6, 10)], [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)
