"""The config.json files of public EAGLE heads (tests/fixtures/published_heads, sources in its
README) read as the heads they are, against the targets they serve."""

from __future__ import annotations

import json
import os

import pytest

from eagle_jax.draft.checkpoint import head_config
from eagle_jax.errors import EagleError
from eagle_jax.model.config import ModelConfig, RopeConfig

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "published_heads")

# the targets' own sizes (their config.json files)
VICUNA_7B = ModelConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32,
                        num_kv_heads=32, head_dim=128)
LLAMA3_8B = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                        num_kv_heads=8, head_dim=128, rope=RopeConfig(theta=500000.0))
QWEN3_8B = ModelConfig(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
                       num_kv_heads=8, head_dim=128, family="qwen3", qk_norm=True)

# file -> (target, the DraftConfig fields the head must read as)
HEADS = {
    "yuhuili_EAGLE-Vicuna-7B-v1.3": (VICUNA_7B, dict(
        kind="eagle1", hidden_size=4096, intermediate_size=11008, num_heads=32, num_kv_heads=32, head_dim=128,
        draft_vocab_size=32000, fc_bias=True, rms_norm_eps=1e-6, rope=RopeConfig(theta=10000.0))),
    "yuhuili_EAGLE-LLaMA3-Instruct-8B": (LLAMA3_8B, dict(
        kind="eagle1", num_kv_heads=8, intermediate_size=14336, draft_vocab_size=128256, fc_bias=False,
        rms_norm_eps=1e-5, rope=RopeConfig(theta=500000.0))),
    "yuhuili_EAGLE3-LLaMA3.1-Instruct-8B": (LLAMA3_8B, dict(
        kind="eagle3", target_hidden_size=4096, target_vocab_size=128256, draft_vocab_size=32000, num_kv_heads=8,
        feature_layers=(2, 16, 29), rope=RopeConfig(theta=10000.0), norm_before_residual=False, fc_norm=False)),
    "SpecForge_qwen3-8b-eagle3": (QWEN3_8B, dict(
        kind="eagle3", intermediate_size=12288, head_dim=128, target_vocab_size=151936, draft_vocab_size=32000,
        feature_layers=(2, 18, 33), rms_norm_eps=1e-6, rope=RopeConfig(theta=1000000.0))),
    "nm-testing_EAGLE3-LLaMA3.1-Instruct-8B-converted": (LLAMA3_8B, dict(
        kind="eagle3", target_hidden_size=4096, draft_vocab_size=32000, feature_layers=(2, 16, 29),
        norm_before_residual=False, rope=RopeConfig(theta=10000.0), rms_norm_eps=1e-5)),
}


@pytest.mark.parametrize("name", list(HEADS))
def test_a_published_config_reads_as_its_head(name):
    with open(os.path.join(FIXTURES, name + ".json")) as f:
        config = json.load(f)
    target, expected = HEADS[name]
    dcfg, qk_norm = head_config(config, {}, target, name)
    assert {key: getattr(dcfg, key) for key in expected} == expected
    assert not qk_norm  # every published head's layer is a Llama layer, Qwen3 targets included


def test_the_fixture_readme_names_a_source_for_each_config():
    readme = open(os.path.join(FIXTURES, "README.md")).read()
    files = sorted(f for f in os.listdir(FIXTURES) if f.endswith(".json"))
    assert files == sorted(name + ".json" for name in HEADS)
    for file in files:
        row = next(line for line in readme.splitlines() if line.startswith(f"| {file} |"))
        assert "huggingface.co/" in row or "SafeAILab/EAGLE" in row, row


def test_angelslim_names_the_target_family():
    """AngelSlim's Qwen3-8B EAGLE-3 config is SpecForge's with architecture Eagle3LlamaForCausalLM and
    target_model_type "qwen3" (Tencent/AngelSlim configs/qwen3-8b-eagle3.json)."""
    with open(os.path.join(FIXTURES, "SpecForge_qwen3-8b-eagle3.json")) as f:
        config = json.load(f) | {"architectures": ["Eagle3LlamaForCausalLM"], "target_model_type": "qwen3"}
    assert head_config(config, {}, QWEN3_8B, "angelslim")[0].draft_vocab_size == 32000
    with pytest.raises(EagleError, match="trained for a qwen3 target \\(target_model_type\\), the target is llama"):
        head_config(config, {}, LLAMA3_8B, "angelslim")
