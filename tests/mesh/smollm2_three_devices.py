"""The real SmolLM2-135M-Instruct (9 heads, 3 KV heads) with the shipped head on 3 simulated CPU
devices; tests/test_mesh.py runs this file in a fresh process with
XLA_FLAGS=--xla_force_host_platform_device_count=3. `eagle-jax generate --mesh model=3` gives the
text of the run without a mesh, `eagle-jax bench --mesh data=3` decodes identically to plain
decoding, and a model axis that does not divide the heads is one error line."""

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
