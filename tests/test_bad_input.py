"""Regression tests of the bad-input campaign (issue 35): what once gave silent wrong output or a
traceback now gives a clear answer, on a tiny random target written as a Hugging Face directory."""

from __future__ import annotations

import json

import pytest

from eagle_jax.decoding.sampling import SamplingConfig
from eagle_jax.errors import EagleError
from eagle_jax.infer.cli import main
from test_cli import assert_one_line_error
from test_train_support import write_tiny_model

PROMPT = "w1 w2 w3 w4 w5"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("bad-input") / "model"))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """The command line in this process: (exit code, stdout, stderr), a flag error's exit included."""
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def generate(capsys, model: str, *flags: str):
    return run_cli(capsys, "generate", "--model", model, "--no-spec", "--prompt", PROMPT, *flags)


@pytest.mark.parametrize("flag, value, says", [
    ("--temperature", "nan", "argument --temperature: expected a finite number >= 0, got nan"),
    ("--temperature", "inf", "argument --temperature: expected a finite number >= 0, got inf"),
    ("--temperature", "-1", "argument --temperature: expected a finite number >= 0, got -1"),
    ("--top-p", "nan", "argument --top-p: expected a finite number, got nan"),
    ("--top-p", "inf", "argument --top-p: expected a finite number, got inf"),
    ("--top-p", "0", "top_p must be in (0, 1], got 0.0"),
    ("--top-p", "1.5", "top_p must be in (0, 1], got 1.5"),
])
def test_non_finite_or_out_of_range_sampling_is_refused(capsys, tiny_model, flag, value, says):
    code, out, err = generate(capsys, tiny_model, flag, value)
    assert_one_line_error(code, err, says)
    assert out == ""


@pytest.mark.parametrize("fields", [dict(temperature=float("nan")), dict(temperature=float("inf")), dict(top_p=float("nan"))])
def test_sampling_config_refuses_non_finite_values(fields):
    with pytest.raises(EagleError, match="temperature must be a finite number|top_p must be in"):
        SamplingConfig(**fields)


def test_every_answer_says_why_it_ended_and_a_full_cache_warns(capsys, tiny_model):
    code, out, err = generate(capsys, tiny_model, "--json", "--max-new-tokens", "8")
    report = json.loads(out)
    assert code == 0 and report["finish_reason"] in ("stop", "max_new_tokens") and "warning" not in err
    assert report["finish_reason"] == ("max_new_tokens" if report["new_tokens"] == 8 else "stop")
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model).apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    prompt_tokens = len(ids["input_ids"] if hasattr(ids, "keys") else ids)
    code, out, err = generate(capsys, tiny_model, "--json", "--max-new-tokens", "8", "--cache-len", str(prompt_tokens + 3))
    report = json.loads(out)
    assert code == 0 and report["finish_reason"] == "cache_full" and report["new_tokens"] == 4
    assert err.count(f"eagle-jax: warning: the answer stopped after 4 of at most 8 tokens because the KV cache ({prompt_tokens + 3} slots") == 1


def test_a_flag_error_is_one_line_not_a_usage_block(capsys, tiny_model):
    for flags in (["--max-new-tokens", "0"], ["--max-new-tokens", "x"], ["--no-such-flag"], ["--tree-scoring", "best"]):
        code, _, err = run_cli(capsys, "generate", "--prompt", "hi", *flags)
        assert_one_line_error(code, err, "")
        assert "usage:" not in err
    code, _, err = run_cli(capsys, "generate")
    assert_one_line_error(code, err, "--prompt")


@pytest.mark.parametrize("seed", [str(10**23), "-1"])
def test_a_seed_out_of_range_is_one_line(capsys, tiny_model, seed):
    code, _, err = generate(capsys, tiny_model, "--seed", seed)
    assert_one_line_error(code, err, "expected a seed from 0 to 4294967295")


def test_train_flag_errors_are_one_line(capsys):
    code, _, err = run_cli(capsys, "train", "--seed", str(10**23))
    assert_one_line_error(code, err, "argument --seed: expected a seed from 0 to 4294967295")


def test_a_tokenizer_with_more_ids_than_the_model_is_refused_at_load(tmp_path):
    from eagle_jax.loading import load_target
    from test_train_support import make_tokenizer

    model = write_tiny_model(str(tmp_path / "model"))  # 96 ids
    make_tokenizer(120).save_pretrained(model)
    with pytest.raises(EagleError, match="the tokenizer has 120 token ids but the model's vocabulary only 96"):
        load_target(model)


@pytest.mark.parametrize("change, says", [
    (lambda c: c.pop("architectures"), "config.json names no architecture"),
    (lambda c: c.update(architectures=[]), "config.json names no architecture"),
    (lambda c: c.pop("num_attention_heads"), "config.json lacks a positive integer 'num_attention_heads'"),
    (lambda c: c.update(hidden_size="32"), "config.json lacks a positive integer 'hidden_size'"),
    (lambda c: c.update(architectures=["GPT2LMHeadModel"]), "unsupported architecture GPT2LMHeadModel"),
])
def test_a_malformed_model_config_is_one_error(tmp_path, change, says):
    from eagle_jax.loading import load_target

    model = write_tiny_model(str(tmp_path / "model"))
    path = tmp_path / "model" / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))
    with pytest.raises(EagleError, match=says):
        load_target(model)


def test_a_model_config_that_is_not_an_object_is_one_error(tmp_path):
    from eagle_jax.loading import load_target

    model = write_tiny_model(str(tmp_path / "model"))
    (tmp_path / "model" / "config.json").write_text("[1, 2]")
    with pytest.raises(EagleError, match="config.json .*expected a JSON object"):
        load_target(model)


def test_a_head_whose_hidden_size_does_not_match_names_the_mismatch(tmp_path):
    import shutil

    from eagle_jax.draft.checkpoint import load_draft
    from eagle_jax.loading.registry import default_head_dir

    head = tmp_path / "head"
    shutil.copytree(default_head_dir("smollm2-135m-instruct"), head)
    config = json.loads((head / "config.json").read_text())
    config["hidden_size"] = 512
    (head / "config.json").write_text(json.dumps(config))
    with pytest.raises(EagleError, match=r"head hidden size 512 \(config hidden_size\) differs from the target's 576 "
                                         r"\(target_hidden_size\); its norm.weight is \(576,\)"):
        load_draft(str(head))


def test_output_paths_are_checked_before_any_work(capsys, tmp_path, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("a bad output path must be refused before the model loads")

    monkeypatch.setattr("eagle_jax.infer.bench.build_engine", no_work)
    monkeypatch.setattr("eagle_jax.train.cli.train", no_work)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "c", "turns": ["hi"]}) + "\n")
    for out, says in [(tmp_path, "is a directory; expected the path of a file"), (a_file / "out.json", "is a file, so nothing can be written")]:
        code, _, err = run_cli(capsys, "bench", "--prompts", str(prompts), "--out", str(out))
        assert_one_line_error(code, err, says)
    code, _, err = run_cli(capsys, "bench", "--prompts", str(prompts), "--out", str(tmp_path / "new" / "o.json"), "--plots", str(a_file))
    assert_one_line_error(code, err, "--plots")
    assert not (tmp_path / "new").exists()  # nothing created
    for out, says in [(a_file, "is a file; expected a directory"), (a_file / "run", "is a file, so nothing can be written")]:
        code, _, err = run_cli(capsys, "train", "--model", "m", "--data", str(prompts), "--out", str(out))
        assert_one_line_error(code, err, says)
