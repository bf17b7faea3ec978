"""A property-based test of the command line (issue 35): random flags and values (at and past their
bounds, nan/inf, empty, huge, wrong types), prompt files with random damage, and model or head
directories with one file truncated or one config key changed. Every run either succeeds or exits
2 with exactly one `eagle-jax: error:` line: never a traceback, never a hang.

Cheap by default (a tiny random target and head, 25 runs a property); EAGLE_JAX_FUZZ_EXAMPLES=N runs
N examples per property instead (a longer local setting)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from eagle_jax.infer.cli import main
from test_train_support import write_tiny_head, write_tiny_model

LONG = os.environ.get("EAGLE_JAX_FUZZ_EXAMPLES")
# No shrinking by default: each run compiles, so shrinking a failure takes many minutes; the failing
# example's draws are printed as they are.
FUZZ = settings(max_examples=int(LONG or 25), deadline=None, derandomize=not LONG, database=None,
                phases=list(Phase) if LONG else [Phase.explicit, Phase.reuse, Phase.generate],
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
RUN_LIMIT_S = 300  # one run's limit: the tiny model decodes in well under a second once compiled

NUMBERS = st.sampled_from(["0", "1", "2", "-1", "3", "7", "64", "4096", "8192", "8193", str(2**31), str(10**23), "1e3", "0.5",
                           "nan", "inf", "-inf", "", "x", "1,2", " 4"])
FLOATS = st.sampled_from(["0", "0.0", "1", "0.7", "1e-9", "1.5", "-0.1", "1e308", "nan", "inf", "-inf", "", "x"])
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "w1 w2", "\udcff\udcfe", "a" * 3000]))
FLAGS = {
    "--max-new-tokens": NUMBERS, "--cache-len": NUMBERS, "--seed": NUMBERS, "--top-k-sampling": NUMBERS,
    "--temperature": FLOATS, "--top-p": FLOATS,
    "--tree-top-k": NUMBERS, "--tree-depth": NUMBERS, "--tree-nodes": NUMBERS, "--tree-lookup": NUMBERS,
    "--tree-scoring": st.sampled_from(["dynamic", "static", "sampled", "best", ""]),
    "--mesh": st.sampled_from(["data=1", "model=1", "data=1,model=1", "data=2", "model=3", "data=0", "x", "data=1,data=1", ""]),
    "--dtype": st.sampled_from(["float32", "bfloat16", "float16"]),
    "--attention": st.sampled_from(["auto", "xla", "cuda"]),
    "--system": TEXT,
}
SWITCHES = ["--raw", "--json", "--no-spec"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[str, str]:
    """A tiny random target (HF directory) and an EAGLE-3 head for it."""
    root = tmp_path_factory.mktemp("fuzz")
    model = write_tiny_model(str(root / "model"))
    return model, write_tiny_head(str(root / "head"), model)


@contextlib.contextmanager
def time_limit(seconds: int):
    def hang(signum, frame):
        raise AssertionError(f"the command ran past {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_command(capsys, argv: list[str]) -> None:
    """Run `eagle-jax ARGV` in this process and assert: exit 0, or exit 2 with one error line."""
    capsys.readouterr()
    with time_limit(RUN_LIMIT_S):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, (argv, err)
    if code == 0:
        return
    errors = [line for line in err.splitlines() if line.startswith("eagle-jax: error:")]
    others = [line for line in err.splitlines() if line.strip() and not line.startswith(("eagle-jax: error:", "eagle-jax: warning:"))]
    assert code == 2 and len(errors) == 1 and not others, (argv, code, err)


@FUZZ
@given(data=st.data())
def test_random_generate_flags_succeed_or_fail_in_one_line(capsys, tiny, data):
    model, head = tiny
    chosen = data.draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=4, unique=True))
    argv = ["generate", "--model", model, "--draft", head, "--prompt", data.draw(TEXT, label="prompt")]
    if "--max-new-tokens" not in chosen:
        argv += ["--max-new-tokens", "4"]  # keeps the successful runs short
    for flag in chosen:
        argv += [flag, data.draw(FLAGS[flag], label=flag)]
    argv += data.draw(st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
    run_command(capsys, argv)


PROMPT_LINES = [json.dumps({"question_id": i, "category": c, "turns": t}) for i, (c, t) in
                enumerate([("writing", ["w1 w2 w3"]), ("math", ["w4", "w5 w6"]), ("writing", ["w7"])])]


def damage_line(draw, line: bytes) -> bytes:
    kind = draw(st.sampled_from(["truncate", "utf8", "type", "drop", "empty-turns", "not-object", "keep"]))
    record = json.loads(line)
    if kind == "truncate":
        return line[: draw(st.integers(0, len(line) - 1))]
    if kind == "utf8":
        at = draw(st.integers(0, len(line)))
        return line[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])) + line[at:]
    if kind == "type":
        key = draw(st.sampled_from(sorted(record)))
        record[key] = draw(st.sampled_from([None, 3, 1.5, [], {}, [1], "", ["", "x"], [None]]))
    elif kind == "drop":
        del record[draw(st.sampled_from(sorted(record)))]
    elif kind == "empty-turns":
        record["turns"] = []
    elif kind == "not-object":
        record = draw(st.sampled_from([[1, 2], "text", 3, None]))
    return json.dumps(record).encode()


@FUZZ
@given(data=st.data())
def test_damaged_prompt_files_succeed_or_fail_in_one_line(capsys, tiny, tmp_path, data):
    model, head = tiny
    lines = [line.encode() for line in PROMPT_LINES]
    which = data.draw(st.integers(0, len(lines) - 1), label="damaged line")
    lines[which] = damage_line(data.draw, lines[which])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"\n".join(lines) + b"\n")
    mode = data.draw(st.sampled_from([["--ar-only"], ["--draft", head, "--tree-top-k", "2", "--tree-depth", "2", "--tree-nodes", "4"]]))
    run_command(capsys, ["bench", "--model", model, "--prompts", str(prompts), "--out", str(tmp_path / "out.json"),
                         "--max-new-tokens", "3", *mode])


CONFIG_VALUES = st.sampled_from([None, 0, -1, 1, 3, 2**40, 1.5, "32", "", [], {}, True, [1, 2]])


@FUZZ
@given(data=st.data())
def test_damaged_model_and_head_directories_succeed_or_fail_in_one_line(capsys, tiny, tmp_path, data):
    model, head = tiny
    target = data.draw(st.sampled_from(["model", "head"]), label="damaged directory")
    copies = {"model": tmp_path / "model", "head": tmp_path / "head"}
    for name, source in (("model", model), ("head", head)):
        if copies[name].exists():
            shutil.rmtree(copies[name])
        shutil.copytree(source, copies[name])
    directory = copies[target]
    if data.draw(st.booleans(), label="truncate a file (else change a config key)"):
        victim = directory / data.draw(st.sampled_from(sorted(p.name for p in directory.iterdir() if p.is_file())), label="file")
        content = victim.read_bytes()
        victim.write_bytes(content[: data.draw(st.integers(0, max(len(content) - 1, 0)), label="kept bytes")])
    else:
        config_path = directory / "config.json"
        config = json.loads(config_path.read_text())
        key = data.draw(st.sampled_from(sorted(config)), label="key")
        value = data.draw(CONFIG_VALUES, label="value")
        if value is None:
            del config[key]
        else:
            config[key] = value
        config_path.write_text(json.dumps(config))
    run_command(capsys, ["generate", "--model", str(copies["model"]), "--draft", str(copies["head"]), "--prompt", "w1 w2",
                         "--max-new-tokens", "3", "--tree-top-k", "2", "--tree-depth", "2", "--tree-nodes", "4"])
