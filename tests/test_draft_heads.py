"""Draft heads loaded from each public checkpoint layout against a dense numpy reference.

Each case writes a checkpoint with random weights under the exact public key names and shapes
(torch (out, in) layout, numpy + safetensors, no torch), loads it with `load_draft`, and runs
`project_features` / `draft_forward` over context (empty cache, then a second call continuing from a
cache written with KVCache.write) and over two tree levels (K nodes sharing one position, the first
level as extra_kv, an ancestor mask). The reference below is a straightforward float64 loop over
positions and heads written from the raw tensors, so a weight loaded into the wrong place, a norm
applied to the wrong vector or a wrong residual shows up as a mismatch.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.draft.model import draft_forward, draft_to_target_ids, make_draft_cache, project_features
from eagle_jax.model.transformer import ForwardOutput, causal_mask

D, F, H, KV, DH = 32, 40, 4, 2, 8  # head sizes; the tiny target has d = 32, V = 96, 6 layers
DRAFT_VOCAB = 40
EPS = 1e-5

# name -> how the head is stored. layout: safeailab1 | speculators1 | hf3 | speculators3.
CASES = {
    "eagle1": dict(layout="safeailab1", kind="eagle1", fc_bias=True),
    "eagle1_speculators": dict(layout="speculators1", kind="eagle1", fc_bias=True),
    "eagle3": dict(layout="hf3", kind="eagle3", draft_vocab=DRAFT_VOCAB),
    "eagle3_fc_norm": dict(layout="hf3", kind="eagle3", draft_vocab=DRAFT_VOCAB, fc_norm=True, model_prefix=True,
                           top_ids=[1, 3, 4]),
    "eagle3_norm_output": dict(layout="hf3", kind="eagle3", draft_vocab=96, norm_output=True, eagle_config_ids=[0, 2, 3]),
    "norm_before_residual": dict(layout="speculators3", kind="eagle3", draft_vocab=DRAFT_VOCAB, norm_before_residual=True,
                                 top_ids=[3, 2, 1]),
    "norm_before_fc": dict(layout="speculators3", kind="eagle3", draft_vocab=DRAFT_VOCAB, norm_before_fc=True),
    "qwen3_layer": dict(layout="speculators3", kind="eagle3", draft_vocab=DRAFT_VOCAB, qk_norm=True),
    "own_embedding": dict(layout="hf3", kind="eagle3", draft_vocab=DRAFT_VOCAB, hidden=24),
}


def fused_layers(case: dict, num_layers: int) -> list[int]:
    """The HF hidden-state indices a case's head fuses (what the reference feeds it)."""
    if "top_ids" in case:
        return sorted(case["top_ids"])
    if "eagle_config_ids" in case:
        return sorted(i + 1 for i in case["eagle_config_ids"])
    return [2, num_layers // 2, num_layers - 3]


def make_raw(case: dict, target_cfg, seed: int = 0) -> dict:
    """Random head weights under descriptive names, torch (out, in) layout."""
    rng = np.random.default_rng(seed)
    d, heads = case.get("hidden", D), case.get("heads", H)
    dt, vocab = target_cfg.hidden_size, target_cfg.vocab_size
    q, kv = heads * DH, KV * DH
    attn_in = d if case["kind"] == "eagle1" else 2 * d

    def mat(out_dim, in_dim):
        return (rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)).astype(np.float32)

    def norm(width):
        return (1.0 + 0.3 * rng.standard_normal(width)).astype(np.float32)

    raw = dict(q=mat(q, attn_in), k=mat(kv, attn_in), v=mat(kv, attn_in), o=mat(d, q), post_norm=norm(d),
               gate=mat(F, d), up=mat(F, d), down=mat(d, F), embed=rng.standard_normal((vocab, dt)).astype(np.float32))
    if case["kind"] == "eagle1":
        raw["fc"] = mat(d, 2 * d)
        if case.get("fc_bias"):
            raw["fc_bias"] = (0.1 * rng.standard_normal(d)).astype(np.float32)
        return raw
    vd = case["draft_vocab"]
    used = np.sort(rng.choice(vocab, vd, replace=False)) if vd < vocab else np.arange(vocab)
    raw |= dict(fc=mat(d, 3 * dt), input_norm=norm(d), hidden_norm=norm(d), norm=norm(d), lm_head=mat(vd, d),
                d2t=(used - np.arange(vd)).astype(np.int64))
    if case.get("fc_norm"):
        raw["fc_norm"] = [norm(dt) for _ in range(3)]
    if case.get("norm_before_fc"):
        raw["pre_norm"] = norm(3 * dt)
    if case.get("qk_norm"):
        raw["q_norm"], raw["k_norm"] = norm(DH), norm(DH)
    if d != dt:
        raw["own_embed"] = rng.standard_normal((vocab, d)).astype(np.float32)
    return raw


def checkpoint(case: dict, raw: dict, target_cfg) -> tuple[dict, dict]:
    """(config.json, tensors) of the head in its public layout."""
    d, heads, vocab = case.get("hidden", D), case.get("heads", H), target_cfg.vocab_size
    layer_cfg = {"hidden_size": d, "intermediate_size": F, "num_attention_heads": heads, "num_key_value_heads": KV,
                 "head_dim": DH, "num_hidden_layers": 1, "rms_norm_eps": EPS, "vocab_size": vocab}
    layer_names = {"q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
                   "o": "self_attn.o_proj.weight", "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
                   "input_norm": "input_layernorm.weight", "hidden_norm": "hidden_norm.weight",
                   "post_norm": "post_attention_layernorm.weight", "gate": "mlp.gate_proj.weight",
                   "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight"}
    layout = case["layout"]
    layer_prefix = {"safeailab1": "layers.0.", "speculators1": "transformer.", "hf3": "midlayer.", "speculators3": "layers.0."}[layout]
    fc_prefix = "fusion_fc." if layout == "speculators1" else "fc."
    tensors = {layer_prefix + name: raw[key] for key, name in layer_names.items() if key in raw}
    tensors[fc_prefix + "weight"] = raw["fc"]
    if "fc_bias" in raw:
        tensors[fc_prefix + "bias"] = raw["fc_bias"]
    # every recipe saves the frozen target embedding too; a narrower head needs its own
    tensors["embed_tokens.weight"] = raw.get("own_embed", raw["embed"])
    if case["kind"] == "eagle3":
        vd = case["draft_vocab"]
        t2d = np.zeros(vocab, bool)
        t2d[np.arange(vd) + raw["d2t"]] = True
        tensors |= {"norm.weight": raw["norm"], "lm_head.weight": raw["lm_head"], "d2t": raw["d2t"], "t2d": t2d}
        tensors |= {f"fc_norm.{i}.weight": w for i, w in enumerate(raw.get("fc_norm", []))}
        if "pre_norm" in raw:
            tensors["input_norm.weight"] = raw["pre_norm"]
    if case.get("model_prefix"):
        tensors = {(k if k in ("lm_head.weight", "d2t", "t2d") else "model." + k): v for k, v in tensors.items()}

    if layout == "safeailab1":
        config = layer_cfg | {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": case["fc_bias"],
                              "hidden_act": "silu", "rope_theta": 500000.0, "rope_scaling": None, "torch_dtype": "float16",
                              "transformers_version": "4.40.0", "max_position_embeddings": 8192, "bos_token_id": 1,
                              "eos_token_id": 2, "pretraining_tp": 1, "tie_word_embeddings": False, "use_cache": True,
                              "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02}
    elif layout == "hf3":
        config = layer_cfg | {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
                              "draft_vocab_size": case["draft_vocab"], "torch_dtype": "bfloat16", "pad_token_id": 0,
                              "max_position_embeddings": 2048, "tie_word_embeddings": False, "use_cache": True}
        if d != target_cfg.hidden_size:
            config["target_hidden_size"] = target_cfg.hidden_size
        for flag in ("fc_norm", "norm_output"):
            if case.get(flag):
                config[flag] = True
        if "top_ids" in case:
            config["eagle_aux_hidden_state_layer_ids"] = case["top_ids"]
        if "eagle_config_ids" in case:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": case["eagle_config_ids"], "use_aux_hidden_state": True,
                                      "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                                      "use_mtp_layernorm": False, "next_layer_regular": True, "parallel_draft_step": 1,
                                      "parallel_draft_heads_num_layers": 1}
    else:
        # speculators stores the verifier's config as a diff against LlamaConfig: 32000-word vocab,
        # rms_norm_eps 1e-6 etc. would be left out; ours differ, so they are present.
        tl = layer_cfg | {"model_type": "qwen3" if case.get("qk_norm") else "llama", "architectures": ["LlamaForCausalLM"],
                          "rope_theta": 500000.0, "tie_word_embeddings": True, "bos_token_id": 1, "torch_dtype": "bfloat16"}
        spec = {"algorithm": "eagle3" if case["kind"] == "eagle3" else "eagle", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "verifier": {"name_or_path": "tiny/target", "architectures": ["LlamaForCausalLM"]}}
        config = {"speculators_model_type": case["kind"] if case["kind"] == "eagle3" else "eagle", "speculators_version": "0.3.0",
                  "transformer_layer_config": tl, "speculators_config": spec, "torch_dtype": "bfloat16"}
        if case["kind"] == "eagle1":
            config |= {"architectures": ["EagleSpeculator", "LlamaDecoderLayer"], "transformer_layer_architecture": "LlamaDecoderLayer",
                       "layernorms": False, "fusion_bias": case["fc_bias"]}
        else:
            config |= {"architectures": ["Eagle3Speculator"], "draft_vocab_size": case["draft_vocab"],
                       "norm_before_residual": bool(case.get("norm_before_residual")), "embed_requires_grad": False,
                       "norm_before_fc": bool(case.get("norm_before_fc")), "fc_norm": False, "norm_output": False,
                       "target_hidden_size": None}
            if "top_ids" in case:
                config["eagle_aux_hidden_state_layer_ids"] = case["top_ids"]
    return config, tensors


def write_checkpoint(directory, config: dict, tensors: dict) -> str:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(directory, "model.safetensors"))
    return str(directory)


# ----------------------------------------------------------------------------- dense reference


def ref_rms(x, w, eps=EPS):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def ref_rope(x, pos, theta):  # x (heads, Dh), rotate-half
    half = x.shape[-1] // 2
    inv = 1.0 / theta ** (np.arange(0, x.shape[-1], 2) / x.shape[-1])
    cos, sin = np.cos(pos * inv), np.sin(pos * inv)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def ref_features(raw, case, captured):  # captured (3, T, dt) -> (T, d)
    parts = [ref_rms(c, raw["fc_norm"][i]) if "fc_norm" in raw else c for i, c in enumerate(captured)]
    x = np.concatenate(parts, axis=-1)
    if "pre_norm" in raw:
        x = ref_rms(x, raw["pre_norm"])
    return x @ raw["fc"].T


def ref_step(raw, case, theta, lm_head, hidden, tokens, positions, ctx_k, ctx_v, extra_k, extra_v, mask):
    """One head pass for one batch row. hidden (T, d); ctx_* (S, KV, Dh) visible cache; extra_*
    (E, KV, Dh); mask (T, E + T). Returns logits, next hidden, k, v (post-RoPE)."""
    raw = {k: (np.asarray(v, np.float64) if k != "fc_norm" else [np.asarray(w, np.float64) for w in v]) for k, v in raw.items()}
    t, heads = len(tokens), raw["q"].shape[0] // DH
    embed = raw.get("own_embed", raw["embed"])[tokens]
    if case["kind"] == "eagle1":
        x = np.concatenate([embed, hidden], axis=-1) @ raw["fc"].T + raw.get("fc_bias", 0.0)
        residual = attn_in = x
    else:
        normed = ref_rms(hidden, raw["hidden_norm"])
        attn_in = np.concatenate([ref_rms(embed, raw["input_norm"]), normed], axis=-1)
        residual = normed if case.get("norm_before_residual") else hidden
    q = (attn_in @ raw["q"].T).reshape(t, heads, DH)
    k = (attn_in @ raw["k"].T).reshape(t, KV, DH)
    v = (attn_in @ raw["v"].T).reshape(t, KV, DH)
    if "q_norm" in raw:
        q, k = ref_rms(q, raw["q_norm"], EPS), ref_rms(k, raw["k_norm"], EPS)
    q = np.stack([ref_rope(q[i], positions[i], theta) for i in range(t)])
    k = np.stack([ref_rope(k[i], positions[i], theta) for i in range(t)])
    block_k, block_v = np.concatenate([extra_k, k]), np.concatenate([extra_v, v])
    out = np.zeros((t, heads, DH))
    for i in range(t):
        for h in range(heads):
            g = h // (heads // KV)
            keys = np.concatenate([ctx_k[:, g], block_k[mask[i], g]])
            vals = np.concatenate([ctx_v[:, g], block_v[mask[i], g]])
            scores = keys @ q[i, h] / np.sqrt(DH)
            p = np.exp(scores - scores.max())
            out[i, h] = (p / p.sum()) @ vals
    h1 = residual + out.reshape(t, heads * DH) @ raw["o"].T
    m = ref_rms(h1, raw["post_norm"])
    gate = m @ raw["gate"].T
    h2 = h1 + ((gate / (1 + np.exp(-gate))) * (m @ raw["up"].T)) @ raw["down"].T
    if case["kind"] == "eagle1":
        return h2 @ lm_head.T, h2, k, v
    normed_out = ref_rms(h2, raw["norm"])
    return normed_out @ raw["lm_head"].T, (normed_out if case.get("norm_output") else h2), k, v


def assert_close(actual, expected, what):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=2e-5 * scale, err_msg=what)


# ----------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("name", list(CASES))
def test_head_matches_dense_reference(name, tiny_target, tmp_path):
    case = CASES[name]
    target_cfg, target_params = tiny_target
    raw = make_raw(case, target_cfg) | {"embed": np.asarray(target_params["embed"])}
    path = write_checkpoint(tmp_path / name, *checkpoint(case, raw, target_cfg))
    dcfg, dparams = load_draft(path, target_cfg)

    assert dcfg.kind == case["kind"]
    assert dcfg.feature_layers == (tuple(fused_layers(case, target_cfg.num_layers)) if case["kind"] == "eagle3" else ())
    for flag in ("fc_norm", "norm_output", "norm_before_residual", "norm_before_fc"):
        assert getattr(dcfg, flag) == bool(case.get(flag)), flag
    theta = 500000.0 if case["layout"] != "hf3" else 10000.0  # EAGLE-3 HF configs omit rope_theta
    assert dcfg.rope.theta == theta
    lm_head = np.asarray(target_params["lm_head"], np.float64)
    if case["kind"] == "eagle3":
        vd = case["draft_vocab"]
        ids = draft_to_target_ids(dparams, dcfg, jnp.arange(vd))
        np.testing.assert_array_equal(ids, np.arange(vd) + raw["d2t"])

    rng = np.random.default_rng(1)
    b, t1, t2, s = 2, 5, 3, 16
    d, dt = dcfg.hidden_size, target_cfg.hidden_size

    def features(t):
        if case["kind"] == "eagle1":  # the target's post-norm last hidden, here any (B, T, d)
            x = rng.standard_normal((b, t, d)).astype(np.float32)
            return jnp.asarray(x), x.astype(np.float64)
        captured = rng.standard_normal((3, b, t, dt)).astype(np.float32)
        out = ForwardOutput(hidden=None, captured=jnp.asarray(captured), k_new=None, v_new=None)
        got = project_features(dparams, dcfg, out)
        want = np.stack([ref_features(raw, case, captured[:, row].astype(np.float64)) for row in range(b)])
        assert_close(got, want, "projected features")
        return got, want

    def check(out, want, what):
        for row in range(b):
            logits, hidden, k, v = want[row]
            assert_close(out.logits[row], logits, f"{what} logits row {row}")
            assert_close(out.hidden[row], hidden, f"{what} hidden row {row}")
            assert_close(out.k_new[0, row], k, f"{what} keys row {row}")
            assert_close(out.v_new[0, row], v, f"{what} values row {row}")

    def reference(hidden, tokens, positions, ctx, extra, mask):
        empty = np.zeros((0, KV, DH))
        return [
            ref_step(raw, case, theta, lm_head, hidden[row], tokens[row], positions[row], ctx[row][0], ctx[row][1],
                     *(extra[row] if extra else (empty, empty)), mask[row])
            for row in range(b)
        ]

    # 1. context from an empty cache, causal
    cache = make_draft_cache(dcfg, b, s)
    tokens = rng.integers(0, target_cfg.vocab_size, (b, t1))
    positions = np.tile(np.arange(t1), (b, 1))
    hidden, hidden_ref = features(t1)
    mask = causal_mask(jnp.ones((b, t1), bool))
    out1 = draft_forward(dparams, dcfg, target_params, hidden, jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32), cache, mask)
    empty_ctx = [(np.zeros((0, KV, DH)), np.zeros((0, KV, DH)))] * b
    ref1 = reference(hidden_ref, tokens, positions, empty_ctx, None, np.asarray(mask))
    check(out1, ref1, "context")

    # 2. continue from the cache: row 0 keeps all 5 entries, row 1 only its first 3
    kept = np.array([5, 3])
    cache = cache.write(out1.k_new, out1.v_new, jnp.asarray(kept))
    tokens = rng.integers(0, target_cfg.vocab_size, (b, t2))
    positions = kept[:, None] + np.arange(t2)
    hidden, hidden_ref = features(t2)
    mask = causal_mask(jnp.ones((b, t2), bool))
    out2 = draft_forward(dparams, dcfg, target_params, hidden, jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32), cache, mask)
    ctx = [(ref1[row][2][: kept[row]], ref1[row][3][: kept[row]]) for row in range(b)]
    ref2 = reference(hidden_ref, tokens, positions, ctx, None, np.asarray(mask))
    check(out2, ref2, "continued context")

    # 3. two tree levels over the context: 2 nodes, then K = 3 children of nodes (0, 0, 1); every
    # node of a level sits at position length + level and sees its ancestors through extra_kv
    cache = cache.write(out2.k_new, out2.v_new, jnp.full((b,), t2))
    ctx = [(np.concatenate([c[0], r[2]]), np.concatenate([c[1], r[3]])) for c, r in zip(ctx, ref2)]
    lengths = np.asarray(cache.lengths)
    level_hidden = np.asarray(out2.hidden[:, -2:])  # the draft's own hidden, fed back
    level_ref_hidden = np.stack([ref2[row][1][-2:] for row in range(b)])
    tokens0 = rng.integers(0, target_cfg.vocab_size, (b, 2))
    positions0 = np.repeat(lengths[:, None], 2, axis=1)
    mask0 = jnp.broadcast_to(jnp.eye(2, dtype=bool), (b, 2, 2))
    out3 = draft_forward(dparams, dcfg, target_params, jnp.asarray(level_hidden), jnp.asarray(tokens0, jnp.int32),
                         jnp.asarray(positions0, jnp.int32), cache, mask0)
    ref3 = reference(level_ref_hidden, tokens0, positions0, ctx, None, np.asarray(mask0))
    check(out3, ref3, "tree level 0")

    parents = np.array([0, 0, 1])
    tokens1 = rng.integers(0, target_cfg.vocab_size, (b, 3))
    positions1 = np.repeat(lengths[:, None] + 1, 3, axis=1)
    ancestors = np.broadcast_to(np.eye(2, dtype=bool)[parents], (b, 3, 2))
    mask1 = np.concatenate([ancestors, np.broadcast_to(np.eye(3, dtype=bool), (b, 3, 3))], axis=-1)
    extra = (out3.k_new[0], out3.v_new[0])
    out4 = draft_forward(dparams, dcfg, target_params, out3.hidden[:, parents], jnp.asarray(tokens1, jnp.int32),
                         jnp.asarray(positions1, jnp.int32), cache, jnp.asarray(mask1), extra_kv=extra)
    ref4 = reference(np.stack([ref3[row][1][parents] for row in range(b)]), tokens1, positions1, ctx,
                     [(ref3[row][2], ref3[row][3]) for row in range(b)], mask1)
    check(out4, ref4, "tree level 1")
