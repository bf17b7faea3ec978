"""Benchmark harness: prompt files and one-line errors, multi-turn assembly, variants, tau and speedup
arithmetic, and one `eagle-jax bench` run through argparse on a tiny random target and head
(OUT.json schema, identical_to_ar at temperature 0, per-category sums, tuned files, plots)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from conftest import tiny_config
from eagle_jax.draft import DraftConfig, init_draft_params
from eagle_jax.draft.checkpoint import export_draft, load_draft
from eagle_jax.errors import EagleError
from eagle_jax.infer import arguments, bench_measure, bench_report
from eagle_jax.infer import bench as bench_cli
from eagle_jax.infer.bench_measure import Conversation, PromptRecord, measure_prompts
from eagle_jax.infer.engine import Engine, RunResult
from eagle_jax.infer.prompts import (
    VARIANTS,
    Prompt,
    apply_variant,
    load_prompts,
    long_context,
    messages_for_turn,
    parse_variants,
    select_prompts,
)
from eagle_jax.infer.settings import load_batch_policy, load_tuned_tree
from eagle_jax.loading import TargetModel
from eagle_jax.model.cpu_layout import CpuWeight
from eagle_jax.model.transformer import init_params
from eagle_jax.decoding.sampling import SamplingConfig
from eagle_jax.decoding.tree import TreeConfig

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer(vocab_size: int):
    """Word-level tokenizer: 3 specials, 3 roles, then w0, w1, ...; ChatML chat template."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|im_start|>", "<|im_end|>", "<unk>"]
    words = specials + ["system", "user", "assistant"] + [f"w{i}" for i in range(vocab_size - 6)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials[:2]])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", unk_token="<unk>", chat_template=CHAT_TEMPLATE)


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(EagleError) as info:
        fn(*args, **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


def write_lines(path, lines: list) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


PROMPTS = [
    {"question_id": 1, "category": "a", "turns": ["w1 w2 w3", "w4 w5"]},
    {"question_id": 2, "category": "b", "turns": ["w6 w7"], "system": "w8 w9"},
    {"question_id": 3, "category": "a", "turns": ["w10 w11 w12 w13"]},
    {"question_id": 4, "category": "a", "turns": ["w14"]},
]
TREE = TreeConfig(2, 2, 4)


# ----------------------------------------------------------------------------- prompt files


def test_load_and_select_prompts(tmp_path):
    prompts = load_prompts(write_lines(tmp_path / "p.jsonl", PROMPTS[:2] + [""] + PROMPTS[2:]))  # a blank line is skipped
    assert [p.question_id for p in prompts] == [1, 2, 3, 4]
    assert prompts[0].turns == ("w1 w2 w3", "w4 w5") and prompts[1].system == "w8 w9"
    assert [p.question_id for p in select_prompts(prompts, limit=2)] == [1, 2, 3]  # 2 per category
    assert [p.question_id for p in select_prompts(prompts, categories=["b"])] == [2]
    assert "--limit" in one_line_error(select_prompts, prompts, limit=0)
    assert "unknown categories c" in one_line_error(select_prompts, prompts, categories=["c"])


@pytest.mark.parametrize("lines, words", [
    ([], "no prompts"),
    ([PROMPTS[0], '{"question_id": 2, "category": "a", "turns": ["x"]'], "p.jsonl:2: not valid JSON"),
    ([PROMPTS[0], PROMPTS[1], "[1, 2]"], "p.jsonl:3: expected a JSON object"),
    ([{"question_id": 1, "turns": ["x"]}], "p.jsonl:1: missing category"),
    ([{"question_id": 1, "category": "a", "turns": []}], "p.jsonl:1: turns must be"),
    ([{"question_id": 1, "category": "a", "turns": ["x"], "system": 3}], "p.jsonl:1: system must be"),
])
def test_bad_prompt_files(tmp_path, lines, words):
    assert words in one_line_error(load_prompts, write_lines(tmp_path / "p.jsonl", lines))


def test_missing_prompt_file(tmp_path):
    assert "does not exist" in one_line_error(load_prompts, str(tmp_path / "none.jsonl"))


# ----------------------------------------------------------------------------- turns and variants


def test_each_turn_follows_the_previous_answers():
    prompt = Prompt(1, "a", ("q0", "q1", "q2"), system="sys")
    assert messages_for_turn(prompt, [], 0) == [{"role": "system", "content": "sys"}, {"role": "user", "content": "q0"}]
    assert [m["content"] for m in messages_for_turn(prompt, ["a0", "a1"], 2)] == ["sys", "q0", "a0", "q1", "a1", "q2"]
    assert [m["role"] for m in messages_for_turn(prompt, ["a0", "a1"], 2)] == ["system", "user", "assistant", "user", "assistant", "user"]


def test_variants():
    prompt = Prompt(1, "a", ("q0", "q1"))
    assert apply_variant(prompt, "as_given") == prompt
    assert apply_variant(prompt, "system", system_prompt="be brief").system == "be brief"
    assert apply_variant(prompt, "raw").raw
    assert apply_variant(prompt, "long_context", context="filler").turns == ("filler\n\nq0", "q1")
    assert parse_variants("all") == list(VARIANTS)
    assert parse_variants("raw") == ["as_given", "raw"]
    assert "unknown variant" in one_line_error(parse_variants, "raw,bogus")


def test_long_context_has_the_asked_length():
    tokenizer = tiny_tokenizer(96)
    for n in (1, 50, 700):
        count = len(tokenizer.encode(long_context(tokenizer, n), add_special_tokens=False))
        assert n <= count < n + 30  # whole sentences: at most one sentence more
    assert "--long-context-tokens" in one_line_error(long_context, tokenizer, 0)


# ----------------------------------------------------------------------------- measuring, with a scripted engine


class ScriptedEngine:
    """Engine stand-in without a model: turn t of a mode answers script[speculative][t] in 0.5 s
    (speculative: run with a tree); the first run of each mode "compiles"; records (speculative,
    messages) of every run."""

    def __init__(self, script: dict[bool, list[list[int]]], greedy: bool = True):
        self.script, self.asked, self.compiled = script, [], set()
        self.max_new_tokens, self.cache_len = 4, None
        self.target = SimpleNamespace(cfg=SimpleNamespace(max_position=64))
        self.sampling = SamplingConfig(0.0 if greedy else 1.0)

    def encode_chat(self, messages, raw=False):
        self.messages = messages
        return [7] * sum(len(m["content"].split()) for m in messages)

    def decode(self, ids):
        return " ".join(f"t{i}" for i in ids)

    def run(self, prompts, *, tree, seed=0):
        speculative = tree is not None
        self.asked.append((speculative, self.messages))
        tokens = self.script[speculative][(len(self.messages) - 1) // 2]
        compile_s = 0.0 if speculative in self.compiled else 1.0
        self.compiled.add(speculative)
        histogram = np.array([[len(tokens) - 2, 1, 0]]) if speculative else np.zeros((1, 0), np.int32)
        return RunResult([tokens], 0.5, compile_s, [len(tokens) - 1 if speculative else 0], histogram, ["stop"])


def test_each_mode_continues_its_own_answers():
    engine = ScriptedEngine({True: [[1, 2, 3], [4, 5]], False: [[1, 2, 9], [6]]})
    (record,) = measure_prompts(engine, [Prompt(1, "a", ("q0", "q1"))], tree=TREE)
    assert record.spec.answers == ["t1 t2 t3", "t4 t5"] and record.plain.answers == ["t1 t2 t9", "t6"]
    second = {spec: messages for spec, messages in engine.asked if len(messages) == 3}
    assert second[True][1] == {"role": "assistant", "content": "t1 t2 t3"}
    assert second[False][1] == {"role": "assistant", "content": "t1 t2 t9"}
    assert record.identical_to_ar is False  # turn 0 differs
    # the compiling run of each mode was repeated for the timing: 2 + 1 runs per mode
    assert [spec for spec, _ in engine.asked] == [True, True, True, False, False, False]
    assert record.spec.results[0].compile_s == 1.0 and record.spec.results[1].compile_s == 0.0


def test_identical_to_ar_needs_greedy_decoding():
    script = {True: [[1, 2]], False: [[1, 2]]}
    assert measure_prompts(ScriptedEngine(script), [Prompt(1, "a", ("q",))], tree=TREE)[0].identical_to_ar is True
    assert measure_prompts(ScriptedEngine(script, greedy=False), [Prompt(1, "a", ("q",))], tree=TREE)[0].identical_to_ar is None
    assert measure_prompts(ScriptedEngine(script), [Prompt(1, "a", ("q",))], tree=TREE, plain=False)[0].identical_to_ar is None
    assert measure_prompts(ScriptedEngine(script), [Prompt(1, "a", ("q",))], tree=None)[0].identical_to_ar is None


def test_prompt_that_cannot_fit_is_refused():
    engine = ScriptedEngine({True: [[1]], False: [[1]]})
    assert "positions" in one_line_error(measure_prompts, engine, [Prompt(1, "a", (" ".join(["w"] * 61),))], tree=TREE)
    engine.cache_len = 32
    assert "--cache-len 32" in one_line_error(measure_prompts, engine, [Prompt(1, "a", (" ".join(["w"] * 30),))], tree=TREE)


def conversation(*turns: tuple[int, int, float]) -> Conversation:
    """Turns of (new tokens, rounds, wall seconds)."""
    results = [RunResult([[5] * n], wall, 0.0, [r], np.zeros((1, 3), np.int32), ["max_new_tokens"]) for n, r, wall in turns]
    return Conversation(results, ["x"] * len(turns), [10] * len(turns))


def test_tau_and_speedup_arithmetic():
    records = [
        PromptRecord(Prompt(1, "x", ("q0", "q1")), conversation((5, 2, 1.0), (3, 1, 1.0)), conversation((5, 0, 2.0), (3, 0, 2.0)), True),
        PromptRecord(Prompt(2, "y", ("q0",)), conversation((4, 3, 1.0)), conversation((4, 0, 1.0)), True),
    ]
    s = bench_report.summarize(records)
    # tau: each turn's first token is prefill's; (8 + 4 - 3 turns) tokens over 2 + 1 + 3 rounds
    assert s["tau"] == pytest.approx(9 / 6)
    assert bench_measure.merge(records[0].spec.results).tau == pytest.approx((8 - 2) / 3)
    assert s["spec_tokens_per_s"] == pytest.approx(12 / 3) and s["ar_tokens_per_s"] == pytest.approx(12 / 5)
    assert s["speedup"] == pytest.approx(5 / 3)
    assert s["mean_speedup"] == pytest.approx((4 / 2 + 4 / 4) / 2)  # per-prompt ratios 2.0 and 1.0
    assert (s["num_prompts"], s["num_turns"], s["new_tokens"], s["rounds"]) == (2, 3, 12, 6)
    by_category = bench_report.per_category(records)
    assert by_category["x"]["tau"] == pytest.approx(2.0) and by_category["y"]["tau"] == pytest.approx(1.0)
    assert by_category["x"]["speedup"] == pytest.approx(2.0)


def test_acceptance_by_depth_is_conditional_on_reaching_the_depth():
    # rounds that accepted 0, 1, 2, 3 draft tokens: 1950 rounds, 1150 accepted one, 542 two, 329 three
    assert bench_report.acceptance_by_depth([800, 608, 213, 329]) == pytest.approx([1150 / 1950, 542 / 1150, 329 / 542])
    assert bench_report.acceptance_by_depth([5, 0, 0]) == [0.0, None]  # no round reached depth 1


# ----------------------------------------------------------------------------- `eagle-jax bench` end to end

SUMMARY_KEYS = {
    "tau", "spec_tokens_per_s", "ar_tokens_per_s", "speedup", "mean_speedup", "identical_to_ar", "num_prompts",
    "new_tokens", "model", "draft", "tree", "sampling", "max_new_tokens", "dtype", "attention", "machine",
    "spec_compile_s", "ar_compile_s", "accept_histogram", "acceptance_by_depth",
}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A loader returning a tiny random target with a word-level tokenizer; a random EAGLE-3 head on disk."""
    cfg = tiny_config()
    target = TargetModel(cfg, init_params(jax.random.key(0), cfg, scale=0.3), tiny_tokenizer(cfg.vocab_size), "tiny")
    dcfg = DraftConfig.for_target(cfg)
    draft = str(tmp_path_factory.mktemp("head") / "draft")
    export_draft(draft, dcfg, init_draft_params(jax.random.key(1), dcfg, scale=0.3))

    def load_target(name, dtype=None, with_tokenizer=True, shardings=None, layers="auto", chat_template=None):
        assert shardings is None and chat_template is None  # these benches run on one device, with the tokenizer's template
        return target  # in the form the engine converts to if `layers` asks for another

    return load_target, draft


def bench(argv: list[str], load_target) -> int:
    """`eagle-jax bench --model tiny --max-new-tokens 8 ARGV` as infer/cli.py wires it (model arguments,
    then the bench's; an EagleError exits 2 with one line), loading the target with `load_target`."""
    parser = argparse.ArgumentParser(prog="eagle-jax bench")
    arguments.add_model_arguments(parser)
    bench_cli.add_arguments(parser)
    args = parser.parse_args(["--model", "tiny", "--max-new-tokens", "8", *argv])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("eagle_jax.loading.load_target", load_target)
        try:
            return bench_cli.run(args)
        except EagleError as e:
            print(f"eagle-jax: error: {e}", file=sys.stderr)
            return 2


@pytest.fixture(scope="module")
def full_run(tiny_model, tmp_path_factory):
    """One run with every option: variants, a sweep (a grid and listed trees), batch sizes, auto-tuning and plots."""
    load_target, draft = tiny_model
    tmp = tmp_path_factory.mktemp("bench")
    out, plots = str(tmp / "results" / "out.json"), str(tmp / "plots")
    rc = bench([
        "--prompts", write_lines(tmp / "p.jsonl", PROMPTS), "--out", out, "--draft", draft, "--limit", "2",
        "--tree-top-k", "2", "--tree-depth", "2", "--tree-nodes", "4", "--variants", "--long-context-tokens", "20",
        "--sweep", "num_nodes=4", "--trees", "2/2/6,2/2/4", "--batch-sizes", "1,2", "--auto-tune", "--plots", plots,
    ], load_target)
    assert rc == 0
    with open(out) as f:
        return json.load(f), draft, plots


def test_out_json_schema(full_run):
    report, draft, _ = full_run
    assert set(report) == {"summary", "per_prompt", "per_category", "per_variant", "sweep", "batch", "auto_tune"}
    s = report["summary"]
    assert SUMMARY_KEYS <= set(s)
    assert s["tree"] == {"top_k": 2, "depth": 2, "num_nodes": 4, "lookup": 0, "scoring": "dynamic"} and s["draft"] == draft and s["max_new_tokens"] == 8
    assert s["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
    assert s["dtype"] == "float32"  # --dtype auto, on CPU
    assert {"platform", "device_kind", "cpu_count", "jax_version"} <= set(s["machine"])
    assert s["tau"] >= 1.0 and s["spec_tokens_per_s"] > 0 and s["ar_tokens_per_s"] > 0
    assert s["speedup"] == pytest.approx(s["spec_tokens_per_s"] / s["ar_tokens_per_s"])
    assert sum(s["accept_histogram"]) == s["rounds"]
    reached = s["rounds"]  # rounds that accepted >= d draft tokens, rebuilt from the conditional shares
    for d, share in enumerate(s["acceptance_by_depth"]):
        reached = reached * share if share is not None else 0
        assert reached == pytest.approx(sum(s["accept_histogram"][d + 1:]))


def test_greedy_speculative_output_is_plain_output(full_run):
    report, _, _ = full_run
    assert report["summary"]["identical_to_ar"] is True
    assert all(row["identical_to_ar"] for row in report["per_prompt"] + report["sweep"])
    assert all(v["identical_to_ar"] for v in report["per_variant"].values())


def test_per_prompt_and_per_category(full_run, tiny_model):
    report, _, _ = full_run
    rows = report["per_prompt"]
    assert [r["question_id"] for r in rows] == [1, 2, 3]  # --limit 2 per category
    assert list(report["per_category"]) == ["a", "b"] and report["per_category"]["a"]["num_prompts"] == 2
    first = rows[0]  # two turns: the second is asked after the first answer
    tokenizer = tiny_model[0]("tiny").tokenizer
    prompt = Prompt(1, "a", tuple(PROMPTS[0]["turns"]))
    second = tokenizer.apply_chat_template(messages_for_turn(prompt, first["answers"][:1], 1), add_generation_prompt=True)["input_ids"]
    answer = tokenizer.encode(first["answers"][0], add_special_tokens=False)
    assert len(first["answers"]) == 2 and first["prompt_tokens"][1] == len(second)
    assert any(second[i : i + len(answer)] == answer for i in range(len(second)))
    s = report["summary"]
    assert sum(c["new_tokens"] for c in report["per_category"].values()) == s["new_tokens"]
    assert s["new_tokens"] == sum(r["new_tokens"] for r in rows)
    assert s["spec_tokens_per_s"] == pytest.approx(s["new_tokens"] / s["spec_wall_s"])


def test_variants_sweep_and_batch(full_run):
    report, _, _ = full_run
    variants = report["per_variant"]
    assert list(variants) == list(VARIANTS)
    tokens = {v: variants[v]["mean_prompt_tokens"] for v in VARIANTS}
    assert tokens["long_context"] >= tokens["as_given"] + 20 and tokens["raw"] < tokens["as_given"]
    assert variants["as_given"] == {k: v for k, v in report["summary"].items() if k in variants["as_given"]}
    assert [r["num_nodes"] for r in report["sweep"]] == [4, 6]  # the grid, then the listed trees not in it
    base_row, other = report["sweep"]
    assert base_row["ar_wall_s"] == report["summary"]["ar_wall_s"]  # the main tree: the main run's numbers
    assert other["ar_new_tokens"] == base_row["ar_new_tokens"] and other["ar_wall_s"] != base_row["ar_wall_s"]  # its own plain runs
    assert [(r["batch"], r["num_nodes"], r["sequences"]) for r in report["batch"]] == [(1, 4, 3), (1, 6, 3), (2, 4, 4), (2, 6, 4)]
    assert all(r["ar_tokens_per_s"] > 0 and r["spec_tokens_per_s"] > 0 for r in report["batch"])


def test_auto_tune_saves_the_fastest_tree_and_the_batch_table(full_run):
    report, draft, _ = full_run
    fastest = max(report["sweep"], key=lambda r: r["speedup"])
    assert load_tuned_tree(draft).tree == TreeConfig(2, 2, fastest["num_nodes"])
    pays = fastest["speedup"] > 1
    assert report["auto_tune"]["speculate"] == pays == load_tuned_tree(draft).speculate
    assert report["auto_tune"]["tree_file"] == os.path.join(draft, "tree.json")
    assert load_batch_policy(draft) == report["batch"]


def test_auto_tune_ranks_trees_by_speedup_over_their_own_plain_runs(tmp_path):
    # The host slowed down while the first tree ran: it has the higher raw rate, the second the higher speedup.
    sweep = [
        {"top_k": 2, "depth": 1, "num_nodes": 3, "lookup": 5, "tau": 2.0, "spec_tokens_per_s": 52.0, "ar_tokens_per_s": 50.0, "speedup": 1.04},
        {"top_k": 1, "depth": 1, "num_nodes": 2, "lookup": 3, "tau": 1.8, "spec_tokens_per_s": 48.0, "ar_tokens_per_s": 42.0, "speedup": 48 / 42},
    ]
    report = bench_cli.auto_tune(str(tmp_path), sweep, [], {}, sampled=False)
    assert load_tuned_tree(str(tmp_path)).tree == TreeConfig(1, 1, 2, lookup=3) and report["speculate"]
    sweep[1] |= {"spec_tokens_per_s": 40.0, "speedup": 40 / 42}
    sweep[0] |= {"spec_tokens_per_s": 49.0, "speedup": 0.98}
    report = bench_cli.auto_tune(str(tmp_path), sweep, [], {}, sampled=False)
    assert load_tuned_tree(str(tmp_path)).tree == TreeConfig(2, 1, 3, lookup=5) and not report["speculate"]
    assert not load_tuned_tree(str(tmp_path)).speculate


def test_plots(full_run):
    _, _, plots = full_run
    assert sorted(os.listdir(plots)) == ["acceptance.png", "batch.png", "categories.png", "sweep.png"]
    for name in os.listdir(plots):
        with open(os.path.join(plots, name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_ar_only(tiny_model, tmp_path, capsys):
    out = str(tmp_path / "out.json")
    prompts = write_lines(tmp_path / "p.jsonl", PROMPTS[2:])
    assert bench(["--prompts", prompts, "--out", out, "--ar-only", "--batch-sizes", "2"], tiny_model[0]) == 0
    report = json.load(open(out))
    s = report["summary"]
    assert s["ar_tokens_per_s"] > 0 and s["tau"] is None and s["speedup"] is None and s["identical_to_ar"] is None
    assert s["draft"] is None and s["mode"] == "plain"
    assert [(r["batch"], r["spec_tokens_per_s"]) for r in report["batch"]] == [(2, None)]
    table = capsys.readouterr().out
    assert "category" in table and "\nall " in table


def no_model(*args, **kwargs):
    raise AssertionError("bad inputs must be refused before the model is loaded")


@pytest.mark.parametrize("lines, args, words", [
    (None, [], "does not exist"),
    ([PROMPTS[0], "{oops"], [], "p.jsonl:2: not valid JSON"),
    ([], [], "no prompts"),
    ([PROMPTS[0]], ["--limit", "0"], "--limit must be >= 1"),
    ([PROMPTS[0]], ["--sweep", "width=3"], "--sweep expects"),
    ([PROMPTS[0]], ["--ar-only", "--auto-tune"], "--auto-tune"),
])
def test_bad_inputs_are_one_line_errors(tmp_path, capsys, lines, args, words):
    prompts = str(tmp_path / "p.jsonl") if lines is None else write_lines(tmp_path / "p.jsonl", lines)
    assert bench(["--prompts", prompts, "--out", str(tmp_path / "o.json"), *args], no_model) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eagle-jax: error:") and words in err and "\n" not in err
    assert not os.path.exists(tmp_path / "o.json")


def test_plots_without_matplotlib_fail_before_any_work(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    prompts = write_lines(tmp_path / "p.jsonl", PROMPTS[:1])
    assert bench(["--prompts", prompts, "--out", str(tmp_path / "o.json"), "--plots", str(tmp_path / "plots")], no_model) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("eagle-jax: error: --plots needs the matplotlib package") and 'pip install -e ".[train]"' in err
    assert "\n" not in err and not os.path.exists(tmp_path / "o.json")


def test_engine_keeps_at_most_max_compiled_executables(tiny_model, monkeypatch):
    """Each batch size is its own executable; past MAX_COMPILED the least recently used goes, and
    a run that needs it again recompiles it (reported as compile time) with the same tokens."""
    from eagle_jax.infer import engine as engine_module

    monkeypatch.setattr(engine_module, "MAX_COMPILED", 2)
    load_target, draft = tiny_model
    target = load_target("tiny")
    engine = engine_module.Engine(target, load_draft(draft, target.cfg), max_new_tokens=4)
    engine.run([[1, 2, 3]], tree=TREE)
    pair = engine.run([[1, 2, 3]] * 2, tree=TREE)
    assert engine.run([[1, 2, 3]], tree=TREE).compile_s == 0.0  # still there, and now the most recent
    engine.run([[1, 2, 3]] * 3, tree=TREE)  # evicts the batch-2 executable
    assert len(engine._compiled) == 2
    assert engine.run([[1, 2, 3]], tree=TREE).compile_s == 0.0
    again = engine.run([[1, 2, 3]] * 2, tree=TREE)
    assert again.compile_s > 0.0 and again.tokens == pair.tokens
    engine.run([[1, 2, 3]], tree=None)  # plain decoding evicts the least recent one (batch 1 with TREE)
    engine.release(TREE)  # a tree's executables only
    assert [tree for tree, *_ in engine._compiled] == [None]
    engine.release()
    assert not engine._compiled


def test_replaced_engines_share_the_laid_out_params_of_their_own_target(tiny_model):
    """Engines made by dataclasses.replace reuse the first engine's `backend_layout` params; one
    given another target lays out that target's."""
    load_target, draft = tiny_model
    target = load_target("tiny")
    engine = Engine(target, load_draft(draft, target.cfg), max_new_tokens=4)
    assert engine.laid_out.source is target.params
    assert isinstance(engine.laid_out.params["layers"][0]["wq"], CpuWeight)  # the tests run on CPU
    assert engine.laid_out.params["layers"][0]["wq"].in_out is not None  # a head verifies: copies for its blocks
    assert dataclasses.replace(engine, max_new_tokens=6).laid_out is engine.laid_out
    other = dataclasses.replace(target, params=init_params(jax.random.key(5), target.cfg, scale=0.3))
    moved = dataclasses.replace(engine, target=other)
    assert moved.laid_out.source is other.params
    assert moved.run([[1, 2, 3]], tree=TREE).tokens == Engine(other, engine.draft, max_new_tokens=4).run([[1, 2, 3]], tree=TREE).tokens
    assert Engine(target, max_new_tokens=4).laid_out.params["layers"][0]["wq"].in_out is None  # plain decoding only: no copies
