"""Write tests/fixtures/torch_bin/: files made by torch.save, for the torch-free reader's tests.

CI has no torch, so eagle_jax.loading.torch_pickle is checked against files that real torch wrote
once, committed with the script. Run it with a Python that has torch and safetensors (no eagle_jax
needed):

    python scripts/tools/make_torch_fixtures.py tests/fixtures/torch_bin

What it writes:
  * dtypes.bin: a state dict whose tensors the test recomputes from their formula: every dtype a
    checkpoint holds (float32/16, bfloat16, int64/32, int8, uint8, bool), a transposed view and an
    offset slice sharing one storage, an nn.Parameter, an empty tensor.
  * eagle1_bin/ (float16, SafeAILab EAGLE-1 layout, sharded in two pytorch_model-*.bin files with
    pytorch_model.bin.index.json) and eagle3_bin/ (bfloat16, SafeAILab EAGLE-3 layout, one
    pytorch_model.bin), each beside *_safetensors/ with the same tensors saved by safetensors.torch;
    tiny sizes, the key set of the published heads' configs.
"""

from __future__ import annotations

import collections
import json
import os
import sys

import torch
from safetensors.torch import save_file

D, HEADS, KV, DH, F, VOCAB, DRAFT_VOCAB = 32, 4, 2, 8, 64, 96, 48


def dtype_cases() -> collections.OrderedDict:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 8 - 1
    state = collections.OrderedDict()
    state["f32"] = base
    state["f32_t"] = base.t()  # a strided view of the same storage
    state["f32_slice"] = base[1:, 2:4]  # an offset into it
    state["f16"] = base.to(torch.float16)
    state["bf16"] = base.to(torch.bfloat16)
    state["i64"] = torch.arange(-3, 5, dtype=torch.int64)
    state["i32"] = torch.arange(5, dtype=torch.int32) * 1000
    state["i8"] = torch.arange(-4, 4, dtype=torch.int8)
    state["u8"] = torch.arange(250, 256, dtype=torch.uint8)
    state["bool"] = torch.arange(6) % 2 == 0
    state["param"] = torch.nn.Parameter(base[0].clone())
    state["empty"] = torch.zeros((0, 3))
    return state


def layer(prefix: str, attn_in: int, gen: torch.Generator, dtype) -> dict:
    def mat(out_dim, in_dim):
        return (torch.randn(out_dim, in_dim, generator=gen) / in_dim**0.5).to(dtype)

    return {
        prefix + "self_attn.q_proj.weight": mat(HEADS * DH, attn_in), prefix + "self_attn.k_proj.weight": mat(KV * DH, attn_in),
        prefix + "self_attn.v_proj.weight": mat(KV * DH, attn_in), prefix + "self_attn.o_proj.weight": mat(D, HEADS * DH),
        prefix + "mlp.gate_proj.weight": mat(F, D), prefix + "mlp.up_proj.weight": mat(F, D),
        prefix + "mlp.down_proj.weight": mat(D, F),
        prefix + "post_attention_layernorm.weight": (1 + 0.1 * torch.randn(D, generator=gen)).to(dtype),
    }


def sizes() -> dict:
    return {"hidden_size": D, "intermediate_size": F, "num_attention_heads": HEADS, "num_key_value_heads": KV,
            "num_hidden_layers": 1, "vocab_size": VOCAB}


def eagle1(gen: torch.Generator) -> tuple[dict, dict]:
    """A SafeAILab EAGLE-1 head (yuhuili/EAGLE-Vicuna-7B-v1.3 key set): fc with bias, layers.0.*, the
    frozen embed_tokens copy."""
    dtype = torch.float16
    tensors = {"fc.weight": (torch.randn(D, 2 * D, generator=gen) / (2 * D) ** 0.5).to(dtype),
               "fc.bias": (0.1 * torch.randn(D, generator=gen)).to(dtype),
               "embed_tokens.weight": torch.randn(VOCAB, D, generator=gen).to(dtype)} | layer("layers.0.", D, gen, dtype)
    config = sizes() | {"architectures": ["LlamaForCausalLM"], "bias": True, "bos_token_id": 1, "eos_token_id": 2,
                        "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 2048,
                        "model_type": "llama", "pad_token_id": 0, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
                        "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True}
    return config, tensors


def eagle3(gen: torch.Generator) -> tuple[dict, dict]:
    """A SafeAILab EAGLE-3 head (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B key set): fc over 3 fused states,
    midlayer.*, norm, a draft-vocabulary lm_head, d2t int64 and t2d bool."""
    dtype = torch.bfloat16
    used = torch.sort(torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB]).values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[used] = True
    tensors = {"fc.weight": (torch.randn(D, 3 * D, generator=gen) / (3 * D) ** 0.5).to(dtype),
               "norm.weight": (1 + 0.1 * torch.randn(D, generator=gen)).to(dtype),
               "lm_head.weight": (torch.randn(DRAFT_VOCAB, D, generator=gen) / D**0.5).to(dtype),
               "d2t": used - torch.arange(DRAFT_VOCAB), "t2d": t2d}
    tensors |= layer("midlayer.", 2 * D, gen, dtype)
    tensors |= {f"midlayer.{n}.weight": (1 + 0.1 * torch.randn(D, generator=gen)).to(dtype) for n in ("input_layernorm", "hidden_norm")}
    config = sizes() | {"architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 1, "eos_token_id": 2,
                        "draft_vocab_size": DRAFT_VOCAB, "hidden_act": "silu", "initializer_range": 0.02,
                        "max_position_embeddings": 2048, "model_type": "llama", "pad_token_id": 0,
                        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": False,
                        "torch_dtype": "bfloat16", "transformers_version": "4.28.1", "use_cache": True}
    return config, tensors


def write_head(out: str, name: str, config: dict, tensors: dict, shards: int) -> None:
    for kind in ("bin", "safetensors"):
        directory = os.path.join(out, f"{name}_{kind}")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        if kind == "safetensors":
            save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
            continue
        if shards == 1:
            torch.save(collections.OrderedDict(tensors), os.path.join(directory, "pytorch_model.bin"))
            continue
        names, weight_map = sorted(tensors), {}
        for i in range(shards):
            file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
            part = collections.OrderedDict((k, tensors[k]) for k in names[i::shards])
            torch.save(part, os.path.join(directory, file))
            weight_map |= {k: file for k in part}
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())}, "weight_map": weight_map}
        with open(os.path.join(directory, "pytorch_model.bin.index.json"), "w") as f:
            json.dump(index, f, indent=2)


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/torch_bin"
    os.makedirs(out, exist_ok=True)
    torch.save(dtype_cases(), os.path.join(out, "dtypes.bin"))
    gen = torch.Generator().manual_seed(0)
    write_head(out, "eagle1", *eagle1(gen), shards=2)
    write_head(out, "eagle3", *eagle3(gen), shards=1)
    print(f"wrote {out} with torch {torch.__version__}")


if __name__ == "__main__":
    main()
