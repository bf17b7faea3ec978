"""Strict target configs: every key of a HF config.json is read, refused in one line that names it,
or known to be harmless, so nothing that changes the model is dropped silently."""

from __future__ import annotations

import pytest
import transformers

from eagle_jax.errors import EagleError
from eagle_jax.loading.hf import config_from_hf

CONFIG_CLASSES = {
    "LlamaForCausalLM": transformers.LlamaConfig,
    "MistralForCausalLM": transformers.MistralConfig,
    "Qwen2ForCausalLM": transformers.Qwen2Config,
    "Qwen3ForCausalLM": transformers.Qwen3Config,
    "Gemma3ForCausalLM": transformers.Gemma3TextConfig,
}


def hf_config(arch: str = "LlamaForCausalLM", **changes) -> dict:
    """A small config as transformers writes it (every key its config class has), with `changes`."""
    config = CONFIG_CLASSES[arch](vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2).to_dict()
    return config | {"architectures": [arch]} | changes


def refusal(config: dict) -> str:
    with pytest.raises(EagleError) as info:
        config_from_hf(config, "MODEL")
    message = str(info.value)
    assert "\n" not in message and message.startswith("MODEL/config.json"), message
    return message


@pytest.mark.parametrize("arch", list(CONFIG_CLASSES))
def test_every_key_transformers_writes_is_accounted_for(arch):
    cfg = config_from_hf(hf_config(arch), "MODEL")
    assert (cfg.vocab_size, cfg.num_layers, cfg.num_kv_heads) == (64, 4, 2)
    assert cfg.qkv_bias == (arch == "Qwen2ForCausalLM") and cfg.qk_norm == (arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM"))


def test_llama3_rope_scaling_in_the_transformers_4_layout():
    """Llama 3.1's rope_scaling as its config.json (transformers 4) writes it, beside rope_theta."""
    config = hf_config(rope_theta=500000.0, rope_parameters=None, rope_scaling={
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    rope = config_from_hf(config, "MODEL").rope
    assert (rope.rope_type, rope.theta, rope.factor, rope.original_max_position) == ("llama3", 500000.0, 8.0, 8192)


def test_sliding_windows_are_kept_with_the_layers_that_slide():
    mistral = config_from_hf(hf_config("MistralForCausalLM", sliding_window=4096), "M")
    assert (mistral.sliding_window, mistral.sliding_layers, mistral.layer_window(3)) == (4096, None, 4096)
    assert config_from_hf(hf_config("MistralForCausalLM", sliding_window=None), "M").sliding_window is None
    qwen = config_from_hf(hf_config("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=512, max_window_layers=2,
                                      layer_types=None), "M")
    assert (qwen.sliding_window, qwen.sliding_layers) == (512, (2, 3))
    assert config_from_hf(hf_config("Qwen3ForCausalLM", sliding_window=512), "M").sliding_window is None  # switched off
    types = ["sliding_attention", "full_attention"] * 2
    layers = config_from_hf(hf_config("Qwen3ForCausalLM", use_sliding_window=True, sliding_window=256, layer_types=types), "M")
    assert (layers.sliding_window, layers.sliding_layers, layers.layer_window(1)) == (256, (0, 2), None)
    off = hf_config("Qwen3ForCausalLM", sliding_window=256, layer_types=types)  # transformers ignores the types without the switch
    assert config_from_hf(off, "M").sliding_window is None


def test_gemma3_as_transformers_writes_it():
    """Both rope bases (transformers 5's rope_parameters per layer type, and transformers 4's keys),
    the query scale, GeGLU, the embedding scale and every sixth layer global."""
    config = hf_config("Gemma3ForCausalLM", num_hidden_layers=12, layer_types=None, sliding_window=512, query_pre_attn_scalar=24,
                       rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    cfg = config_from_hf(config, "M")
    assert cfg.family == "gemma3" and cfg.sandwich_norms and cfg.mlp_activation == "gelu_tanh" and cfg.tie_embeddings
    assert (cfg.rope.theta, cfg.rope.rope_type, cfg.rope.factor, cfg.local_rope.theta) == (1e6, "linear", 8.0, 1e4)
    assert cfg.query_scale == 24**-0.5 and cfg.embed_scale == 32**0.5
    assert [cfg.layer_window(i) for i in range(12)] == [512] * 5 + [None] + [512] * 5 + [None]
    assert cfg.layer_rope(0) == cfg.local_rope and cfg.layer_rope(5) == cfg.rope
    old = {k: v for k, v in config.items() if k not in ("rope_parameters", "layer_types")}
    old |= {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window_pattern": 4}
    cfg4 = config_from_hf(old, "M")
    assert (cfg4.rope, cfg4.local_rope) == (cfg.rope, cfg.local_rope)
    assert [cfg4.layer_window(i) is None for i in range(8)] == [False, False, False, True] * 2


REFUSED = [
    # (architecture, changes, the key the message must name)
    ("LlamaForCausalLM", dict(mlp_bias=True), "mlp_bias"),
    ("LlamaForCausalLM", dict(attention_bias=True), "attention_bias"),
    ("Qwen3ForCausalLM", dict(attention_bias=True), "attention_bias"),
    ("LlamaForCausalLM", dict(hidden_act="gelu_pytorch_tanh"), "hidden_act"),
    ("LlamaForCausalLM", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}), "rope type \"yarn\""),
    ("LlamaForCausalLM", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "rope type \"dynamic\""),
    ("LlamaForCausalLM", dict(rope_parameters={"rope_type": "longrope", "long_factor": [1.0]}), "rope type \"longrope\""),
    ("LlamaForCausalLM", dict(rope_parameters=None, rope_scaling={"type": "su"}), "rope type \"su\""),
    ("Qwen2ForCausalLM", dict(rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24]}), "mrope_section"),
    ("LlamaForCausalLM", dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    ("LlamaForCausalLM", dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    ("LlamaForCausalLM", dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
    ("LlamaForCausalLM", dict(quantization_config={"quant_method": "gptq", "bits": 4}), "quantization_config"),
    ("Qwen2ForCausalLM", dict(use_mrope=True), "use_mrope"),
    ("LlamaForCausalLM", dict(rope_interleaved=True), "rope_interleaved"),
    ("LlamaForCausalLM", dict(logits_scaling=8.0), "logits_scaling"),
    ("LlamaForCausalLM", dict(model_type="gemma3_text"), "model_type \"gemma3_text\""),
    ("LlamaForCausalLM", dict(residual_multiplier=0.22), "unknown config key(s) residual_multiplier"),
    ("Qwen3ForCausalLM", dict(layer_types=["chunked_attention"] * 4), "layer_types"),
    ("Qwen3ForCausalLM", dict(use_sliding_window=True, layer_types=["sliding_attention"] * 4, sliding_window=None), "sliding_window"),
    ("Gemma3ForCausalLM", dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
    ("Gemma3ForCausalLM", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ("Gemma3ForCausalLM", dict(hidden_activation="gelu"), "hidden_activation"),
    ("Gemma3ForCausalLM", dict(rope_parameters={"global": {"rope_theta": 1e6}}), "rope_parameters"),
]


@pytest.mark.parametrize("arch, changes, names", REFUSED, ids=[f"{a}-{next(iter(c))}" for a, c, _ in REFUSED])
def test_a_key_that_changes_the_model_and_is_not_implemented_is_refused(arch, changes, names):
    assert names in refusal(hf_config(arch, **changes))


@pytest.mark.parametrize("key", ["attn_logit_softcapping", "quantization_config", "use_mrope", "rope_interleaved"])
def test_unimplemented_features_switched_off_are_accepted(key):
    """SmolLM2 writes rope_interleaved false, Qwen2.5 use_mrope false; null or false is no feature."""
    for off in (None, False):
        config_from_hf(hf_config("LlamaForCausalLM", **{key: off}), "MODEL")
