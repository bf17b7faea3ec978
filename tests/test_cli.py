"""The eagle-jax command line: one-line errors for bad input; a real SmolLM2 answer."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from eagle_jax.infer.cli import main, speedup_estimate
from eagle_jax.infer.engine import RunResult


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, fragment):
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("eagle-jax: error:") and fragment in lines[0], err


@dataclasses.dataclass
class FirstCallSlowEngine:
    """Decodes max_new_tokens tokens at step_s a token (speculative twice as fast), plus first_call_s
    on the first call of each (mode, max_new_tokens) program, as XLA:CPU's first calls are slower."""

    draft: object = "head"
    max_new_tokens: int = 20
    step_s: float = 0.02
    first_call_s: float = 1.0
    called: set = dataclasses.field(default_factory=set)  # shared by dataclasses.replace copies

    def run(self, prompts, speculative=True, seed=0):
        program = (speculative, self.max_new_tokens)
        first = program not in self.called
        self.called.add(program)
        wall = self.max_new_tokens * self.step_s / (2 if speculative else 1) + (self.first_call_s if first else 0.0)
        return RunResult([[7] * self.max_new_tokens], wall, 3.0 if first else 0.0, [1], np.zeros((1, 1), np.int32))


def test_speedup_estimate_times_calls_after_each_programs_first():
    engine = FirstCallSlowEngine()
    engine.run([[1, 2]])  # the answer
    assert speedup_estimate(engine, [1, 2], seed=0) == pytest.approx(2.0)  # the first calls would give 1.17x


def test_unknown_model_name(capsys):
    code, _, err = run_cli(capsys, "generate", "--no-spec", "--prompt", "hi", "--model", "llama-9000")
    assert_one_line_error(code, err, "unknown model 'llama-9000'")


def test_missing_gguf_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "generate", "--no-spec", "--prompt", "hi", "--model", str(tmp_path / "nope.gguf"))
    assert_one_line_error(code, err, "does not exist")


def test_corrupt_gguf_file(capsys, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    code, _, err = run_cli(capsys, "generate", "--no-spec", "--prompt", "hi", "--model", str(bad))
    assert_one_line_error(code, err, "is not a readable GGUF file")


def test_unsupported_architecture(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPTNeoXForCausalLM"]}))
    code, _, err = run_cli(capsys, "generate", "--no-spec", "--prompt", "hi", "--model", str(tmp_path))
    assert_one_line_error(code, err, "unsupported architecture GPTNeoXForCausalLM")


def test_missing_weights(capsys, tmp_path):
    src = os.path.join(os.path.dirname(__file__), "fixtures", "llama", "config.json")
    (tmp_path / "config.json").write_text(open(src).read())
    code, _, err = run_cli(capsys, "generate", "--no-spec", "--prompt", "hi", "--model", str(tmp_path))
    assert_one_line_error(code, err, "no *.safetensors weights found")


def test_spec_without_draft_head(capsys, tmp_path):
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--model", "smollm2-135m-instruct", "--draft", str(tmp_path / "none"))
    assert_one_line_error(code, err, "none")


def test_invalid_flag_value_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "hi", "--max-new-tokens", "-3"])
    assert e.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err


@pytest.mark.slow
def test_prompt_longer_than_the_cache(capsys):
    code, _, err = run_cli(capsys, "generate", "--no-spec", "--prompt", "word " * 100, "--cache-len", "64")
    assert_one_line_error(code, err, "does not fit a cache of 64 tokens")


@pytest.mark.slow
def test_plain_generate_answers_with_json():
    cmd = [sys.executable, "-m", "eagle_jax.infer", "generate", "--no-spec", "--json", "--max-new-tokens", "24",
           "--prompt", "What is the capital of France? Answer in one short sentence."]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "Paris" in report["text"]
    assert 0 < report["new_tokens"] <= 24 and report["tokens_per_s"] > 0


@pytest.mark.slow
def test_speculative_generate_with_a_head_directory_matches_plain(tmp_path, smollm2_target):
    import jax

    from eagle_jax.draft import DraftConfig, init_draft_params
    from eagle_jax.draft.checkpoint import export_draft
    from eagle_jax.infer.bench_policy import save_tuned_tree
    from eagle_jax.infer.bench_report import describe_machine
    from eagle_jax.decoding.tree import TreeConfig

    dcfg = DraftConfig.for_target(smollm2_target.cfg, kind="eagle3", draft_vocab_size=2048)
    export_draft(str(tmp_path / "head"), dcfg, init_draft_params(jax.random.key(0), dcfg))
    common = ["generate", "--json", "--max-new-tokens", "16", "--prompt", "Name a fruit."]
    reports = {}
    for mode in (["--no-spec"], ["--draft", str(tmp_path / "head"), "--top-k", "3", "--depth", "2", "--num-nodes", "8", "--lookup", "3", "--no-estimate"]):
        done = subprocess.run([sys.executable, "-m", "eagle_jax.infer", *common, *mode], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        reports[mode[0]] = json.loads(done.stdout)
    spec = reports["--draft"]
    assert spec["text"] == reports["--no-spec"]["text"]
    assert spec["mode"] == "speculative" and spec["rounds"] >= 1 and spec["tau"] >= 1.0
    assert spec["tree"] == {"top_k": 3, "depth": 2, "num_nodes": 8, "scoring": "dynamic", "lookup": 3}
    # a sampling tune that found no tree faster than plain: sampled generate then decodes plainly
    save_tuned_tree(str(tmp_path / "head"), TreeConfig(1, 1, 2), describe_machine(), sampled=True, speculate=False)
    done = subprocess.run([sys.executable, "-m", "eagle_jax.infer", *common, "--draft", str(tmp_path / "head"), "--temperature", "1"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    sampled = json.loads(done.stdout)
    assert sampled["mode"] == "plain" and "rounds" not in sampled and "--auto-tune" in sampled["why_plain"]
    # --scoring alone speculates anyway, with the tuned tree's shape
    done = subprocess.run([sys.executable, "-m", "eagle_jax.infer", *common, "--draft", str(tmp_path / "head"), "--temperature", "1",
                           "--scoring", "sampled", "--no-estimate"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    sampled = json.loads(done.stdout)
    assert sampled["mode"] == "speculative" and sampled["tree"] == {"top_k": 1, "depth": 1, "num_nodes": 2, "scoring": "sampled", "lookup": 0}
    done = subprocess.run([sys.executable, "-m", "eagle_jax.infer", *common, "--draft", str(tmp_path / "head"), "--scoring", "sampled"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "only sampling can accept" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_second_run_loads_its_compiled_program_from_the_disk_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env |= {"EAGLE_JAX_CACHE": str(tmp_path), "JAX_LOG_COMPILES": "1"}  # cache hits are logged
    cmd = [sys.executable, "-m", "eagle_jax.infer", "generate", "--no-spec", "--json", "--max-new-tokens", "4", "--prompt", "Hi!"]
    runs = [subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr
    assert os.listdir(tmp_path / "xla")
    hit = "Persistent compilation cache hit"
    assert hit not in runs[0].stderr and hit in runs[1].stderr
    assert json.loads(runs[1].stdout)["text"] == json.loads(runs[0].stdout)["text"]
