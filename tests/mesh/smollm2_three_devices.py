"""The real SmolLM2-135M-Instruct (9 heads, 3 KV heads) with the shipped head on 3 simulated CPU
devices; tests/test_mesh.py runs this file in a fresh process with
XLA_FLAGS=--xla_force_host_platform_device_count=3. `eagle-jax generate --mesh model=3` gives the
text of the run without a mesh, `eagle-jax bench --mesh data=3` decodes identically to plain
decoding, a model axis that does not divide the heads is one error line, and the model loads
straight into its shards, from the GGUF and from safetensors."""

from __future__ import annotations

import json

import jax

from eagle_jax.infer.cli import main

assert jax.device_count() == 3, "run with XLA_FLAGS=--xla_force_host_platform_device_count=3"

PROMPT = ["--prompt", "Name three colours of the rainbow.", "--max-new-tokens", "32"]


def generate(capsys, *flags) -> dict:
    assert main(["generate", *PROMPT, "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_on_a_model_axis_of_three_gives_the_text_of_one_device(capsys):
    one, sharded = generate(capsys), generate(capsys, "--mesh", "model=3")
    assert sharded["mesh"] == {"data": 1, "model": 3} and one["mesh"] is None
    assert sharded["mode"] == one["mode"] == "speculative"
    assert sharded["tokens"] == one["tokens"] and sharded["text"] == one["text"]
    assert len(one["tokens"]) > 8


def test_bench_on_a_data_axis_of_three_is_identical_to_plain_decoding(capsys, tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "--prompts", "data/sharegpt_dev.jsonl", "--limit", "2", "--max-new-tokens", "24", "--mesh", "data=3",
                 "--batch-sizes", "3", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["summary"]["identical_to_ar"] is True and report["summary"]["num_prompts"] == 2
    assert report["summary"]["mesh"] == {"data": 3, "model": 1}
    assert report["batch"][0]["batch"] == 3 and report["batch"][0]["tau"] > 1


def test_a_model_axis_that_divides_no_heads_is_one_error_line(capsys):
    assert main(["generate", *PROMPT, "--mesh", "model=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("eagle-jax: error: a model axis of 2 divides neither the 9 attention heads nor the 3 KV heads of the target; "
                   "model sizes that would: 1, 3, 9")


HF_NAMES = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm", "wq": "self_attn.q_proj",
            "wk": "self_attn.k_proj", "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
            "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}


def write_hf_copy(target, directory) -> None:
    """The GGUF's model as a Hugging Face directory (config.json, model.safetensors), weights in float32."""
    import numpy as np
    from safetensors.numpy import save_file

    cfg, p = target.cfg, jax.device_get(target.params)
    tensors = {"model.embed_tokens.weight": p["embed"], "model.norm.weight": p["final_norm"]}
    for i, layer in enumerate(p["layers"]):
        tensors |= {f"model.layers.{i}.{HF_NAMES[k]}.weight": w for k, w in layer.items()}
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}, str(directory / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
              "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
              "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
              "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope.theta, "tie_word_embeddings": True,
              "max_position_embeddings": cfg.max_position, "eos_token_id": list(cfg.eos_token_ids)}
    (directory / "config.json").write_text(json.dumps(config))
    target.tokenizer.save_pretrained(str(directory))


def test_loading_onto_a_model_axis_of_three_gives_each_device_only_its_share(tmp_path, monkeypatch):
    """Straight into shards, from the GGUF (dequantized tensor by tensor, the converted-model cache
    out of the way) and from safetensors, in both layer forms: every tensor the mesh splits is a
    third on each device (heads, KV heads, MLP units, vocabulary), the values are those of the
    single-device load, and an Engine on the mesh decodes the stacked form as it was loaded."""
    import numpy as np

    from eagle_jax.infer.engine import Engine
    from eagle_jax.loading import load_target
    from eagle_jax.mesh import make_mesh
    from eagle_jax.model.sharding import target_shardings, target_specs
    from eagle_jax.model.transformer import stack_layers

    mesh = make_mesh({"model": 3})
    one = load_target("smollm2-135m-instruct")
    write_hf_copy(one, tmp_path)
    monkeypatch.setattr("eagle_jax.loading.converted.entry_dir", lambda path: None)  # no converted cache
    forms = {"unrolled": (one.params, one.cfg.num_layers), "scan": (stack_layers(one.params), 1)}
    for source in ("smollm2-135m-instruct", str(tmp_path)):
        for form, (whole_params, layer_arrays) in forms.items():
            sharded = load_target(source, shardings=lambda cfg, params: target_shardings(mesh, cfg, params), layers=form)
            specs = jax.tree.leaves(target_specs(sharded.cfg, sharded.params, 3), is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
            assert jax.tree.structure(sharded.params) == jax.tree.structure(whole_params)
            split = 0
            for spec, array, whole in zip(specs, jax.tree.leaves(sharded.params), jax.tree.leaves(whole_params)):
                axes = [a for a, name in enumerate(spec) if name == "model"]
                expected = tuple(n // 3 if a in axes else n for a, n in enumerate(array.shape))
                assert len(array.addressable_shards) == 3
                assert all(shard.data.shape == expected for shard in array.addressable_shards), (spec, array.shape)
                np.testing.assert_array_equal(np.asarray(array), np.asarray(whole))
                split += bool(axes)
            assert split == 1 + 7 * layer_arrays  # the embedding, wq wk wv wo w_gate w_up w_down of each layer (or stack)
    engine = Engine(sharded, mesh=mesh, layers="scan")
    assert all(a is b for a, b in zip(jax.tree.leaves(engine.laid_out.params), jax.tree.leaves(sharded.params)))
