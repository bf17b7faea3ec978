"""Regression tests of the bad-input campaign (issue 35): what once gave silent wrong output or a
traceback now gives a clear answer, on a tiny random target written as a Hugging Face directory."""

from __future__ import annotations

import argparse
import json

import pytest

from eagle_jax.decoding.sampling import SamplingConfig
from eagle_jax.errors import EagleError
from eagle_jax.infer.arguments import byte_size
from eagle_jax.infer.cli import main
from test_cli import assert_one_line_error
from test_train_support import write_tiny_head, write_tiny_model

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


def with_positions(tiny_model: str, tmp_path, positions: int) -> str:
    """A copy of the tiny model whose config declares `positions` maximum positions."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": positions}))
    return str(model)


def test_prompt_and_answer_are_checked_against_the_model_positions(capsys, tiny_model, tmp_path):
    code, _, err = generate(capsys, tiny_model, "--max-new-tokens", str(10**9))
    assert_one_line_error(code, err, f"--max-new-tokens {10**9} after a prompt of ")
    assert "more than the model's 8192 positions (max_position_embeddings); give at most 81" in err
    code, _, err = generate(capsys, tiny_model, "--cache-len", "100000")
    assert_one_line_error(code, err, "--cache-len 100000 exceeds the model's 8192 positions (max_position_embeddings); give at most 8192")
    short = with_positions(tiny_model, tmp_path, 8)
    code, _, err = generate(capsys, short, "--cache-len", "8")
    assert_one_line_error(code, err, "tokens does not fit the model's 8 positions (max_position_embeddings); shorten it")


def test_caches_larger_than_the_device_memory_are_refused_before_compiling(capsys, tiny_model, tmp_path, monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("caches that cannot fit must be refused before compiling")

    monkeypatch.setattr("eagle_jax.infer.engine.Engine._lower", no_compile)
    vast = with_positions(tiny_model, tmp_path, 2**31 - 1)  # 6 layers x 2 KV heads x 8 dims: 768 bytes a slot
    code, _, err = generate(capsys, vast, "--max-new-tokens", str(10**9))
    assert_one_line_error(code, err, "the KV caches of 1 row x 1000000256 slots need 715.3 GiB per device and the weights 0.0 GiB, more than the ")
    assert "lower --max-new-tokens (or --cache-len) or --batch-size" in err


@pytest.fixture(scope="module")
def tiny_head(tiny_model, tmp_path_factory) -> str:
    return write_tiny_head(str(tmp_path_factory.mktemp("bad-input-head") / "head"), tiny_model)


def test_a_step_larger_than_the_device_memory_is_refused_after_compiling_before_running(capsys, tiny_model, tiny_head):
    # found by the fuzz test: a lookup chain of 4096 tokens compiled, then died out of memory (66.7 GiB)
    code, _, err = run_cli(capsys, "generate", "--model", tiny_model, "--draft", tiny_head, "--prompt", PROMPT,
                           "--tree-lookup", "4096", "--max-new-tokens", "4")
    assert_one_line_error(code, err, "generating for 1 row with a cache of ")
    assert "verifying 4112 tokens a round, needs " in err and "lower --tree-nodes, --tree-lookup, --max-new-tokens" in err


def test_a_sampling_top_k_past_the_vocabulary_keeps_every_token():
    import jax

    from eagle_jax.decoding.sampling import processed_log_probs

    # found by the fuzz test: --top-k-sampling 8192 on a 96-token vocabulary was a traceback
    logits = jax.random.normal(jax.random.key(0), (2, 96))
    every = processed_log_probs(logits, SamplingConfig(temperature=0.7))
    for top_k in (96, 8192):
        assert (processed_log_probs(logits, SamplingConfig(temperature=0.7, top_k=top_k)) == every).all()
    assert int((processed_log_probs(logits, SamplingConfig(temperature=0.7, top_k=95)) == -float("inf")).sum()) == 2


def test_a_broken_chat_template_is_one_line(capsys, tiny_model, tmp_path):
    import shutil

    # found by the fuzz test: a truncated chat_template.jinja was jinja2's traceback
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    template = model / "chat_template.jinja"
    template.write_text(template.read_text()[:138])
    code, _, err = generate(capsys, str(model))
    assert_one_line_error(code, err, f"the chat template of {model} cannot render this conversation: ")
    assert "or pass --raw for a raw-text prompt" in err
    assert generate(capsys, str(model), "--raw")[0] == 0


def test_a_model_without_a_chat_template_is_one_line(capsys, tiny_model, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "chat_template.jinja").unlink()
    code, _, err = generate(capsys, str(model))
    assert_one_line_error(code, err, f"{model} has no chat template (a base model, such as gemma3-270m): pass --raw")
    assert generate(capsys, str(model), "--raw")[0] == 0


def test_a_chat_template_file_that_is_missing_or_not_jinja_is_one_line(capsys, tiny_model, tmp_path):
    missing = tmp_path / "none.jinja"
    code, _, err = generate(capsys, tiny_model, "--chat-template", str(missing))
    assert_one_line_error(code, err, f"cannot read the chat template {missing}: No such file or directory")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }}")
    code, _, err = generate(capsys, tiny_model, "--chat-template", str(broken))
    assert_one_line_error(code, err, f"the chat template {broken} is not valid Jinja: ")
    given = tmp_path / "plain.jinja"
    given.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    assert generate(capsys, tiny_model, "--chat-template", str(given))[0] == 0


def test_a_flag_error_is_one_line_not_a_usage_block(capsys, tiny_model):
    for flags in (["--max-new-tokens", "0"], ["--max-new-tokens", "x"], ["--no-such-flag"], ["--tree-scoring", "best"]):
        code, _, err = run_cli(capsys, "generate", "--prompt", "hi", *flags)
        assert_one_line_error(code, err, "")
        assert "usage:" not in err
    code, _, err = run_cli(capsys, "generate")
    assert_one_line_error(code, err, "--prompt")


def test_invalid_utf8_on_the_command_line_is_one_line(capsys, tiny_model):
    not_utf8 = b"w1 \xff\xfe w2".decode("utf-8", "surrogateescape")  # what Python makes of such bytes in argv
    for flag in ("--prompt", "--system"):
        argv = ["generate", "--model", tiny_model, "--no-spec", "--prompt", PROMPT, flag, not_utf8]
        code, _, err = run_cli(capsys, *argv)
        assert_one_line_error(code, err, f"argument {flag}: expected UTF-8 text, got bytes that are not (at character 4)")


def test_invalid_utf8_in_a_prompt_file_names_the_line(capsys, tiny_model, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    good = json.dumps({"question_id": 1, "category": "c", "turns": ["hi"]}).encode()
    prompts.write_bytes(good + b"\n" + good.replace(b"hi", b"h\xffi") + b"\n")
    code, _, err = run_cli(capsys, "bench", "--model", tiny_model, "--prompts", str(prompts), "--out", str(tmp_path / "o.json"))
    column = good.index(b"hi") + 2  # 1-based, of the byte after "h"
    assert_one_line_error(code, err, f"{prompts}:2: not UTF-8 text (invalid start byte: byte 0xff at column {column})")


def test_invalid_utf8_in_training_data_is_one_line(capsys, tiny_model, tmp_path):
    data = tmp_path / "convs.json"
    data.write_bytes(b'[{"conversations": [{"from": "human", "value": "w1 \xff"}]}]')
    code, _, err = run_cli(capsys, "train", "--model", tiny_model, "--data", str(data), "--out", str(tmp_path / "run"))
    assert_one_line_error(code, err, f"{data} is not UTF-8 text (invalid start byte: byte 0xff)")


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
    (lambda c: c.pop("num_attention_heads"), "config.json: num_attention_heads is missing; expected an integer from 1"),
    (lambda c: c.update(hidden_size="32"), "config.json: hidden_size is \"32\"; expected an integer from 1"),
    (lambda c: c.update(architectures=["GPT2LMHeadModel"]), "unsupported architecture GPT2LMHeadModel"),
    # found by the fuzz test: each of these was a traceback (an int32 overflow, a TypeError)
    (lambda c: c.update(eos_token_id=2**40), "eos_token_id is 1099511627776; expected a token id or a list of token ids, each from 0 to 95"),
    (lambda c: c.update(eos_token_id="32"), "eos_token_id is \"32\"; expected a token id"),
    (lambda c: c.update(eos_token_id={}), "eos_token_id is {}; expected a token id"),
    (lambda c: c.update(rms_norm_eps="1e-5"), "rms_norm_eps is \"1e-5\"; expected a finite positive number"),
    (lambda c: c.update(tie_word_embeddings=1), "tie_word_embeddings is 1; expected true or false"),
    (lambda c: c.update(rope_scaling=[1, 2]), "rope_scaling: expected a JSON object, got list"),
    (lambda c: c.update(max_position_embeddings=2**40), "max_position_embeddings is 1099511627776; expected an integer"),
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


# --- a damaged training run on --resume ---

SAVING = ("--max-steps", "6", "--save-every", "2", "--keep", "3", "--eval-every", "6")


@pytest.fixture(scope="module")
def saved_run(tiny_model, tmp_path_factory):
    """A finished 6-step run with checkpoints 2, 4 and 6, and the data it trained on."""
    from test_train_support import tiny_run_args, write_conversations

    root = tmp_path_factory.mktemp("saved-run")
    data = write_conversations(str(root / "convs.json"), 60)
    out = str(root / "run")
    assert main(["train", *tiny_run_args(tiny_model, data, out, *SAVING)]) == 0
    return data, out


def damaged_copy(tiny_model, saved_run, tmp_path) -> tuple[list[str], str]:
    """A copy of the saved run and the arguments that resume it."""
    import shutil

    from test_train_support import tiny_run_args

    data, out = saved_run
    copy = str(tmp_path / "run")
    shutil.copytree(out, copy)
    return ["train", *tiny_run_args(tiny_model, data, copy, *SAVING, "--resume")], copy


def truncate_arrays(checkpoint) -> None:
    for f in checkpoint.glob("state/**/d/*"):
        f.write_bytes(f.read_bytes()[:10])


def test_resume_skips_damaged_checkpoints_to_the_newest_that_restores(capsys, tiny_model, saved_run, tmp_path):
    import pathlib

    import numpy as np
    from safetensors.numpy import load_file

    from test_train_support import read_metrics

    args, copy = damaged_copy(tiny_model, saved_run, tmp_path)
    checkpoints = pathlib.Path(copy) / "checkpoints"
    truncate_arrays(checkpoints / "6")  # a truncated array file
    (checkpoints / "4" / "meta" / "metadata").write_text("{garbled")  # garbled metadata
    capsys.readouterr()
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "resumed from step 2 of 6" in out
    warnings = [line for line in err.splitlines() if line.strip()]
    assert len(warnings) == 2 and all(w.startswith("eagle-jax: warning: checkpoint ") and "skipping it" in w for w in warnings), err
    assert "checkpoint 6 in" in warnings[0] and "checkpoint 4 in" in warnings[1]
    dev = [r for r in read_metrics(copy) if r["split"] == "dev" and r["step"] == 6]
    assert dev == [r for r in read_metrics(saved_run[1]) if r["split"] == "dev" and r["step"] == 6]  # the uninterrupted result
    head, resumed = load_file(f"{saved_run[1]}/draft/model.safetensors"), load_file(f"{copy}/draft/model.safetensors")
    assert head.keys() == resumed.keys() and all(np.array_equal(head[k], resumed[k]) for k in head)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["2", "4", "6"]  # the damaged ones were saved again


def test_resume_where_no_checkpoint_restores_is_one_line(capsys, tiny_model, saved_run, tmp_path):
    import pathlib

    args, copy = damaged_copy(tiny_model, saved_run, tmp_path)
    for step in ("2", "4", "6"):
        truncate_arrays(pathlib.Path(copy) / "checkpoints" / step)
    capsys.readouterr()
    code = main(args)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eagle-jax: error:")]
    assert code == 2 and len(err) == 1 and "no checkpoint in" in err[0] and "restores (the newest, 6:" in err[0]
    assert sorted(p.name for p in (pathlib.Path(copy) / "checkpoints").iterdir()) == ["2", "4", "6"]  # nothing deleted


@pytest.mark.parametrize("damage, says", [
    (lambda run: (run / "train_config.json").write_text('{"model": '), "train_config.json (the settings of a training run): cannot read it as JSON"),
    (lambda run: (run / "train_config.json").write_text("[]"), "expected a JSON object, got array"),
    (lambda run: (run / "data" / "train.npz").write_bytes((run / "data" / "train.npz").read_bytes()[:100]),
     "train.npz (a tokenized training set): cannot read it"),
    (lambda run: (run / "vocab.npz").write_bytes(b"PK\x03\x04garbage"), "vocab.npz (a draft vocabulary): cannot read it"),
])
def test_a_damaged_run_file_on_resume_is_one_line(capsys, tiny_model, saved_run, tmp_path, damage, says):
    import pathlib

    args, copy = damaged_copy(tiny_model, saved_run, tmp_path)
    damage(pathlib.Path(copy))
    capsys.readouterr()
    code = main(args)
    assert_one_line_error(code, capsys.readouterr().err, says)


def test_what_a_killed_export_left_is_removed_at_the_next_start(capsys, tiny_model, saved_run, tmp_path):
    import pathlib

    args, copy = damaged_copy(tiny_model, saved_run, tmp_path)
    run = pathlib.Path(copy)
    litter = [run / ".draft.partial-0123456789ab", run / "data" / ".train.npz.partial-0123456789ab.npz"]
    litter[0].mkdir()
    (litter[0] / "model.safetensors").write_bytes(b"\0" * 1000)
    litter[1].write_bytes(b"PK")
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"removed what an interrupted write left behind: {litter[0]}, {litter[1]}" in out
    assert not any(p.exists() for p in litter) and (run / "draft" / "model.safetensors").exists()


@pytest.mark.parametrize("text, size", [("2GB", 2 * 10**9), ("500MB", 5 * 10**8), ("1.5GiB", 3 * 2**29), ("1000", 1000), ("20 kb", 20000)])
def test_sizes_read_as_hugging_face_writes_them(text, size):
    assert byte_size(text) == size


@pytest.mark.parametrize("text", ["", "GB", "0", "-1GB", "1e3MB", "nanGB", "2TB", "2 G B"])
def test_a_size_that_is_not_one_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a size such as 2GB"):
        byte_size(text)
