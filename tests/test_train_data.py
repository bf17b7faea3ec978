"""Training data: streaming reader, conversation normalisation, assistant-only loss masks, long
samples, dev split, batch order, draft vocabulary."""

from __future__ import annotations

import collections
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import tiny_config
from eagle_jax.draft import DraftConfig, init_draft_params
from eagle_jax.draft.checkpoint import export_draft
from eagle_jax.errors import EagleError
from eagle_jax.train import data as data_lib
from eagle_jax.train.vocab import carry_over_rows, select_draft_vocab
from test_train_support import make_tokenizer, synthetic_conversations

STOP_IDS = (1,)  # <|im_end|> of the test tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer(96)


def conv(*turns: tuple[str, str], cid: str = "x") -> dict:
    return {"id": cid, "conversations": [{"from": r, "value": v} for r, v in turns]}


def test_streams_json_array_jsonl_and_a_truncated_file(tmp_path):
    records = [conv(("human", f"w{i}"), ("gpt", f"w{i + 1}"), cid=str(i)) for i in range(5)]
    array = tmp_path / "a.json"
    array.write_text(json.dumps(records, indent=1))
    lines = tmp_path / "a.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(records)[:-30])  # ends inside the last record, like the packaged ShareGPT V3
    for path, expected, truncated in ((array, 5, 0), (lines, 5, 0), (cut, 4, 1)):
        stats = collections.Counter()
        got = list(data_lib.iter_records(str(path), stats, chunk_chars=7))  # records span many chunks
        assert [r["id"] for r in got] == [str(i) for i in range(expected)]
        assert stats["truncated_file"] == truncated
    convs, stats = data_lib.load_conversations(str(array), limit=2)
    assert [c.id for c in convs] == ["0", "1"] and stats["conversations"] == 2


def test_normalise_roles_leading_model_turn_and_alternation():
    stats = collections.Counter()
    c = data_lib.normalise(conv(("system", "s"), ("gpt", "hello"), ("human", "q1"), ("gpt", "a1"), ("human", "q2"),
                                ("human", "again"), ("gpt", "a2")), 0, stats)
    assert [m["role"] for m in c.messages] == ["system", "user", "assistant"]  # cut at the broken alternation
    assert stats["truncated_conversations"] == 1
    assert data_lib.normalise(conv(("human", "q")), 1, stats) is None
    assert data_lib.normalise(conv(("robot", "q"), ("gpt", "a")), 2, stats) is None
    assert stats["skipped_no_assistant"] == 1 and stats["skipped_malformed"] == 1
    messages = data_lib.normalise({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, 3, stats)
    assert messages.id == "3" and messages.messages[1] == {"role": "assistant", "content": "a"}


def test_assistant_mask_from_prefix_rendering(tokenizer):
    messages = ({"role": "user", "content": "w1 w2"}, {"role": "assistant", "content": "w3 w4"},
                {"role": "user", "content": "w5"}, {"role": "assistant", "content": "w6"})
    ids, mask = data_lib.tokenize_conversation(tokenizer, messages, STOP_IDS)
    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    assert tokens == ["<|im_start|>", "user", "w1", "w2", "<|im_end|>", "<|im_start|>", "assistant", "w3", "w4", "<|im_end|>",
                      "<|im_start|>", "user", "w5", "<|im_end|>", "<|im_start|>", "assistant", "w6", "<|im_end|>"]
    # each answer and its end-of-turn token; never the header or the user's turn
    assert [t for t, m in zip(tokens, mask) if m] == ["w3", "w4", "<|im_end|>", "w6", "<|im_end|>"]


def test_assistant_mask_from_the_templates_generation_markers():
    tokenizer = make_tokenizer(96)
    # this template marks the answer without its end-of-turn token: the mask follows the template
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{% generation %}"
        "{{ m['content'] }}{% endgeneration %}<|im_end|>{% else %}{{ m['content'] }}<|im_end|>{% endif %}\n{% endfor %}"
    )
    messages = ({"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2 w3"})
    ids, mask = data_lib.tokenize_conversation(tokenizer, messages, STOP_IDS)
    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    assert [t for t, m in zip(tokens, mask) if m] == ["w2", "w3"]


def test_long_samples_dropped_or_split_and_counted(tokenizer):
    convs = [data_lib.normalise(r, i, collections.Counter()) for i, r in enumerate(synthetic_conversations(20))]
    full, _ = data_lib.tokenize_conversations(convs, tokenizer, STOP_IDS, 1000, "drop")
    seq_len = int(np.median(full.lengths))
    long = int((full.lengths > seq_len).sum())
    dropped, stats = data_lib.tokenize_conversations(convs, tokenizer, STOP_IDS, seq_len, "drop")
    assert stats["long_dropped"] == long and len(dropped) == len(convs) - long
    split, stats = data_lib.tokenize_conversations(convs, tokenizer, STOP_IDS, seq_len, "split")
    assert stats["long_split"] == long and split.lengths.max() <= seq_len
    assert split.loss_mask.sum() <= full.loss_mask.sum() and len(split) > len(dropped)
    with pytest.raises(EagleError, match="long-samples"):
        data_lib.tokenize_conversations(convs, tokenizer, STOP_IDS, seq_len, "truncate")


def test_tokenized_set_rows_and_round_trip(tmp_path):
    ds = data_lib.TokenizedSet.from_samples([(np.array([5, 6, 7]), np.array([0, 1, 1], bool)), (np.array([8, 9]), np.array([1, 0], bool))])
    tokens, mask, lengths = ds.rows(np.array([1, 0]), 4)
    np.testing.assert_array_equal(tokens, [[8, 9, 0, 0], [5, 6, 7, 0]])
    np.testing.assert_array_equal(mask, [[1, 0, 0, 0], [0, 1, 1, 0]])
    np.testing.assert_array_equal(lengths, [2, 3])
    ds.save(str(tmp_path / "d.npz"))
    back = data_lib.TokenizedSet.load(str(tmp_path / "d.npz"))
    np.testing.assert_array_equal(back.offsets, ds.offsets)


def test_dev_split_and_batch_order_are_deterministic():
    convs = [data_lib.Conversation(str(i), ()) for i in range(40)]
    train, dev = data_lib.split_dev(convs, 0.1, seed=3)
    assert len(dev) == 4 and not {c.id for c in train} & {c.id for c in dev}
    assert data_lib.split_dev(convs, 0.1, seed=3) == (train, dev)
    first = [data_lib.batch_indices(s, 40, 8, seed=1) for s in range(5)]  # one epoch: a permutation
    assert sorted(np.concatenate(first).tolist()) == list(range(40))
    np.testing.assert_array_equal(data_lib.batch_indices(2, 40, 8, seed=1), first[2])
    assert not np.array_equal(data_lib.batch_indices(5, 40, 8, seed=1), first[0])  # next epoch reshuffled
    with pytest.raises(EagleError, match="batch"):
        data_lib.batch_indices(0, 4, 8, seed=1)


def test_bad_data_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(EagleError, match="does not exist"):
        data_lib.load_conversations(str(tmp_path / "missing.json"))
    no_answers = tmp_path / "q.json"
    no_answers.write_text(json.dumps([conv(("human", "q")), conv(("gpt", "a"))]))
    with pytest.raises(EagleError, match="no usable conversation with an assistant turn"):
        data_lib.load_conversations(str(no_answers))
    garbage = tmp_path / "g.json"
    garbage.write_text("not json")
    with pytest.raises(EagleError, match="not a JSON array or JSON lines"):
        data_lib.load_conversations(str(garbage))


def test_draft_vocab_as_the_reference():
    # frequencies of assistant tokens: 7 x5, 3 x4, 9 x4, 1 x1; 2 is frequent but never an assistant token
    tokens = np.array([7] * 5 + [3] * 4 + [9] * 4 + [1] + [2] * 9)
    mask = np.array([1] * 14 + [0] * 9, bool)
    vocab = select_draft_vocab(tokens, mask, target_vocab_size=12, size=3)
    np.testing.assert_array_equal(vocab.used, [3, 7, 9])  # top 3 by frequency, sorted by target id
    np.testing.assert_array_equal(vocab.d2t, [3, 6, 7])  # d2t[i] = used[i] - i
    assert np.flatnonzero(vocab.t2d).tolist() == [3, 7, 9]
    np.testing.assert_array_equal(np.arange(3) + vocab.d2t, vocab.used)  # target = draft + d2t[draft]
    assert vocab.coverage == pytest.approx(13 / 14)
    filled = select_draft_vocab(tokens, mask, target_vocab_size=12, size=6)  # fewer seen ids than slots
    np.testing.assert_array_equal(filled.used, [0, 1, 2, 3, 7, 9])
    # preferred ids (a head's old vocabulary) win ties and take the unseen slots before smaller ids
    preferred = select_draft_vocab(tokens, mask, target_vocab_size=12, size=6, preferred=np.array([11, 1, 5]))
    np.testing.assert_array_equal(preferred.used, [1, 3, 5, 7, 9, 11])
    tie = select_draft_vocab(tokens, mask, target_vocab_size=12, size=2, preferred=np.array([9]))
    np.testing.assert_array_equal(tie.used, [7, 9])  # 3 and 9 are tied at 4; 9 is preferred
    with pytest.raises(EagleError):
        select_draft_vocab(tokens, mask, target_vocab_size=12, size=13)


def test_carry_over_rows_keeps_shared_rows_and_maps_new_ones():
    rng = np.random.default_rng(0)
    target_rows = rng.normal(size=(20, 6))  # (V, dt)
    to_draft = rng.normal(size=(6, 4))  # a head whose rows are a linear image of the target's: the fit recovers it
    old_used, new_used = np.array([1, 4, 5, 8, 9, 11, 13, 15, 17, 19]), np.array([0, 4, 5, 8, 9, 11, 12, 13, 15, 17, 18])
    shared, new = np.isin(new_used, old_used), ~np.isin(new_used, old_used)  # new: ids 0, 12, 18
    lm_head = (target_rows[old_used] @ to_draft).astype(np.float32)
    rows = carry_over_rows(lm_head, old_used, new_used, target_rows)
    assert rows.shape == (11, 4) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows[shared], lm_head[np.isin(old_used, new_used)])
    np.testing.assert_allclose(rows[new], target_rows[new_used[new]] @ to_draft, rtol=1e-4, atol=1e-4)
    lm_head[1] += 5.0  # token 4's row, off the linear image: kept as it is, not refitted
    np.testing.assert_array_equal(carry_over_rows(lm_head, old_used, new_used, target_rows)[1], lm_head[1])
    with pytest.raises(EagleError, match="shares no token"):
        carry_over_rows(lm_head, old_used, np.array([0, 2, 3]), target_rows)


def test_vocab_coverage_script_measures_held_out_coverage(tmp_path):
    # training assistant tokens: 7 x3, 3 x2 (5 is a prompt token); dev assistant tokens: 7, 3, 4, 4
    train = data_lib.TokenizedSet.from_samples([(np.array([5, 7, 7, 3, 7, 3]), np.array([0, 1, 1, 1, 1, 1], bool))])
    dev = data_lib.TokenizedSet.from_samples([(np.array([5, 7, 3, 4, 4]), np.array([0, 1, 1, 1, 1], bool))])
    (tmp_path / "data").mkdir()
    train.save(str(tmp_path / "data" / "train.npz"))
    dev.save(str(tmp_path / "data" / "dev.npz"))
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "tools" / "vocab_coverage.py"
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--sizes", "1", "2", "5", "--target-vocab-size", "8"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert (report["train_assistant_tokens"], report["dev_assistant_tokens"]) == (5, 4)
    rows = {r["size"]: (r["train_coverage"], r["dev_coverage"]) for r in report["sizes"]}
    # size 1: {7}; size 2: {3, 7}; size 5: {3, 7} then the smallest unseen ids {0, 1, 2}, still no 4
    assert rows == {1: (0.6, 0.25), 2: (1.0, 0.5), 5: (1.0, 0.5)}

    # --pick-from two runs (the second adds 4 x3: size 2 is now {4, 7}, ties to the smaller id) and a
    # head whose vocabulary is {4, 7}
    other = tmp_path / "other"
    (other / "data").mkdir(parents=True)
    data_lib.TokenizedSet.from_samples([(np.array([5, 4, 4, 4]), np.array([0, 1, 1, 1], bool))]).save(str(other / "data" / "train.npz"))
    dcfg = DraftConfig.for_target(tiny_config(), kind="eagle3", draft_vocab_size=2)
    export_draft(str(tmp_path / "head"), dcfg, init_draft_params(jax.random.key(0), dcfg) | {"d2t": np.array([4, 6], np.int32)})
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--pick-from", str(tmp_path), str(other), "--head", str(tmp_path / "head"),
         "--sizes", "2", "--target-vocab-size", "8"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["train_assistant_tokens"] == 8 and report["sizes"] == [{"size": 2, "train_coverage": 0.75, "dev_coverage": 0.75}]
    assert (report["head"]["size"], report["head"]["train_coverage"], report["head"]["dev_coverage"]) == (2, 0.75, 0.75)


def test_sharegpt_slice_leaves_out_held_out_questions(tmp_path):
    # six conversations; the held-out file names c1 by id and c4's question by text
    records = [conv(("human", f"question {i}"), ("gpt", f"answer {i}"), cid=f"c{i}") for i in range(6)]
    records[4] = conv(("human", "  Repeated question "), ("gpt", "answer 4"), cid="c4")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(
        json.dumps({"question_id": "sharegpt-c1", "category": "sharegpt", "turns": ["other text"]}) + "\n"
        + json.dumps({"question_id": "x9", "category": "sharegpt", "turns": ["Repeated question"]}) + "\n"
    )
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "tools" / "sharegpt_slice.py"
    out = tmp_path / "slice.jsonl"
    run = subprocess.run(
        [sys.executable, str(script), "--data", str(data), "--start", "1", "--count", "3", "--first-turn",
         "--exclude", str(held_out), "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "2 held-out conversations left out" in run.stdout
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["c2", "c3", "c5"]


def test_sharegpt_slice_takes_earlier_answers_from_a_regeneration(tmp_path):
    """--turns 2 --answers: the first answer comes from the regenerated file, the second is the
    original (to be regenerated with --regen-keep-turns 1); conversations with one exchange, without a
    regenerated answer, or whose regenerated file asks another question are left out."""
    two = (("human", "q1"), ("gpt", "original 1"), ("human", "q2"), ("gpt", "original 2"))
    records = [
        conv(("system", "be brief"), *two, ("human", "q3"), ("gpt", "a3"), cid="c0"),
        conv(*two[:2], cid="c1"),
        conv(*two, cid="c2"),
        conv(*two, cid="c3"),
        conv(*two, cid="c4"),
    ]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    regenerated = tmp_path / "part-00000-of-00001.jsonl"
    answered = lambda cid, question: {"id": cid, "messages": [["system", "be brief"], ["user", question], ["assistant", f"own {cid}"]]}  # noqa: E731
    regenerated.write_text("".join(json.dumps(r) + "\n" for r in (answered("c0", "q1"), answered("c1", "q1"), answered("c3", "other"),
                                                                  answered("c4", "q1"))))
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "tools" / "sharegpt_slice.py"
    out = tmp_path / "slice.jsonl"
    argv = [sys.executable, str(script), "--data", str(data), "--count", "5", "--turns", "2", "--out", str(out)]
    run = subprocess.run([*argv, "--answers", str(regenerated)], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in kept] == ["c0", "c4"]
    assert [t["value"] for t in kept[0]["conversations"]] == ["be brief", "q1", "own c0", "q2", "original 2"]
    assert [t["value"] for t in kept[1]["conversations"]] == ["q1", "own c4", "q2", "original 2"]
    run = subprocess.run([*argv, "--answers", str(tmp_path / "missing.jsonl")], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode != 0 and "--answers" in run.stderr and "does not exist" in run.stderr
