"""The train CLI end to end on a tiny target, in this process: learning (EAGLE-3.1 flags), export,
offline features, gradient accumulation, EAGLE-1 in bfloat16, self-distillation, and bad input."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import numpy as np
import pytest

from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.errors import EagleError
from eagle_jax.loading import load_target
from eagle_jax.train import cli
from eagle_jax.train.data import Conversation
from eagle_jax.train.regenerate import regenerate_conversations
from eagle_jax.train.setup import TrainConfig, check_out_dir
from eagle_jax.train.vocab import DraftVocab, carry_over_rows, select_draft_vocab, used_ids
from test_train_support import read_metrics, tiny_run_args, write_conversations, write_tiny_model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return str(write_tiny_model(str(root / "model"))), write_conversations(str(root / "convs.json"), 200)


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(list(argv)))


LEARN = ("--max-steps", "40", "--lr", "1e-2", "--eval-every", "40", "--log-every", "1", "--draft-vocab", "80", "--fc-norm", "--norm-output",
         "--max-shard-size", "20KB")


@pytest.fixture(scope="module")
def learned(files, tmp_path_factory):
    """40 updates of an EAGLE-3.1 head (fc_norm, norm_output), 3 TTT steps, target features online;
    the head exported in safetensors shards of at most 20 kB."""
    model, data = files
    out = str(tmp_path_factory.mktemp("learned") / "run")
    assert run(*tiny_run_args(model, data, out, *LEARN)) == 0
    return out


def train_losses(out: str) -> np.ndarray:
    return np.array([r["loss"] for r in read_metrics(out) if r["split"] == "train"])


def test_short_run_learns_and_exports_a_loadable_head(files, learned):
    model, _ = files
    records = read_metrics(learned)
    dev = [r for r in records if r["split"] == "dev"]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in dev] == [0, 40]
    untrained, trained = np.array(dev[0]["acc"]), np.array(dev[-1]["acc"])
    assert len(trained) == 3 and untrained.max() < 0.05 and trained.min() > 0.2, (untrained, trained)  # every TTT step learns
    assert np.mean(train_losses(learned)[-5:]) < 0.75 * np.mean(train_losses(learned)[:5])
    assert train[-1]["tokens_per_s"] > 0 and train[-1]["lr"] < train[10]["lr"]
    index = json.loads(open(os.path.join(learned, "draft", "model.safetensors.index.json")).read())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all(os.path.getsize(os.path.join(learned, "draft", s)) < 20_000 + 4096 for s in shards)
    dcfg, params = load_draft(os.path.join(learned, "draft"), load_target(model).cfg)
    assert (dcfg.kind, dcfg.draft_vocab_size, dcfg.fc_norm, dcfg.norm_output) == ("eagle3", 80, True, True)
    np.testing.assert_array_equal(params["d2t"], DraftVocab.load(os.path.join(learned, "vocab.npz")).d2t)
    assert os.path.getsize(os.path.join(learned, "curves.png")) > 0
    assert sorted(os.listdir(os.path.join(learned, "checkpoints"))) == ["40"]
    # tau of greedy speculative decoding of dev questions, through the real generate, rises as the head learns
    assert dev[0]["tau"] >= 1.0 and dev[-1]["tau"] > dev[0]["tau"] + 0.3, [r["tau"] for r in dev]


# With 2 warmup steps the first three losses do not depend on --max-steps: the first update has lr 0,
# the second lr/2 whatever the decay. So 3-step runs check the first real update against `learned`.
def test_offline_features_give_the_online_losses(files, learned, tmp_path):
    model, data = files
    out = str(tmp_path / "offline")
    assert run(*tiny_run_args(model, data, out, *LEARN, "--offline-features", "--max-steps", "3")) == 0
    meta = json.load(open(os.path.join(out, "features", "train.json")))
    assert (meta["vectors"], meta["width"], meta["dtype"]) == (4, 32, "float32")  # 3 fused layers + final hidden
    np.testing.assert_allclose(train_losses(out), train_losses(learned)[:3], rtol=1e-5)
    dev = [r for r in read_metrics(out) if r["split"] == "dev"]
    np.testing.assert_allclose(dev[0]["step_loss"], read_metrics(learned)[0]["step_loss"], rtol=1e-5)  # dev features too


def test_gradient_accumulation_equals_the_big_batch(files, learned, tmp_path):
    """2 micro-batches of 4 (MultiSteps) = 1 batch of 8: same samples (the epoch order is shared), same update."""
    model, data = files
    out = str(tmp_path / "accum")
    args = tiny_run_args(model, data, out, *LEARN, "--max-steps", "3", "--grad-accum", "2")
    args[args.index("--batch-size") + 1] = "4"
    assert run(*args) == 0
    np.testing.assert_allclose(train_losses(out), train_losses(learned)[:3], rtol=1e-5)


def test_eagle1_head_learns_in_bfloat16_from_offline_features_with_an_eval_hook(files, tmp_path):
    model, data = files
    out = str(tmp_path / "eagle1")
    args = ["--model", model, "--data", data, "--out", out, "--head", "eagle1", "--seq-len", "64", "--batch-size", "8", "--grad-accum", "1", "--lr", "1e-2",
            "--max-steps", "20", "--warmup-steps", "2", "--eval-every", "20", "--dtype", "bfloat16", "--offline-features", "--no-progress",
            "--tau-prompts", "0"]
    seen = []

    def hook(context):  # where the lead's speculative-generate tau plugs in
        seen.append((context.step, context.dcfg.kind, sorted(context.draft_params)))
        return {"hook_value": float(context.step)}

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(args), eval_hooks=(hook,)) == 0
    dev = [r for r in read_metrics(out) if r["split"] == "dev"]
    assert len(dev[0]["acc"]) == 1 and dev[-1]["acc"][0] > dev[0]["acc"][0] + 0.2
    assert [r["hook_value"] for r in dev] == [0.0, 20.0] and seen[0][:2] == (0, "eagle1") and "fc" in seen[0][2]
    assert json.load(open(os.path.join(out, "features", "train.json")))["dtype"] == "bfloat16"
    dcfg, _ = load_draft(os.path.join(out, "draft"))
    assert dcfg.kind == "eagle1" and dcfg.draft_vocab_size == 96


def test_training_continues_from_an_exported_head(files, learned, tmp_path):
    """--init-head: the run starts from the head's weights (its step-0 dev metrics are the head's
    last ones) and keeps the head's draft vocabulary even where the new data would pick another."""
    model, data = files
    head = os.path.join(learned, "draft")
    out = str(tmp_path / "continued")
    assert run(*tiny_run_args(model, data, out, *LEARN, "--max-steps", "2", "--init-head", head)) == 0
    start, last = read_metrics(out)[0], [r for r in read_metrics(learned) if r["split"] == "dev"][-1]
    assert start["step"] == 0
    np.testing.assert_allclose(start["acc"], last["acc"], rtol=1e-6)
    np.testing.assert_allclose(start["step_loss"], last["step_loss"], rtol=1e-5)

    other_data = write_conversations(str(tmp_path / "other.json"), 60, seed=3)
    other = str(tmp_path / "other")
    assert run(*tiny_run_args(model, other_data, other, "--max-steps", "2", "--init-head", head, "--draft-vocab", "80",
                              "--tau-prompts", "0")) == 0
    kept = DraftVocab.load(os.path.join(other, "vocab.npz"))
    np.testing.assert_array_equal(kept.d2t, load_draft(head)[1]["d2t"])
    fresh = str(tmp_path / "fresh")
    assert run(*tiny_run_args(model, other_data, fresh, "--max-steps", "2", "--draft-vocab", "80", "--tau-prompts", "0")) == 0
    assert not np.array_equal(DraftVocab.load(os.path.join(fresh, "vocab.npz")).used, kept.used)  # the data alone picks another
    assert 0 < kept.coverage < DraftVocab.load(os.path.join(fresh, "vocab.npz")).coverage

    # --revocab: a new vocabulary of 64, the most frequent tokens of the new data, ties going to the
    # head's tokens; one update at learning rate 0 (the first of the warmup) exports the starting
    # weights: the head's, its lm_head rows carried over to the new vocabulary
    revocab = str(tmp_path / "revocab")
    assert run(*tiny_run_args(model, other_data, revocab, "--max-steps", "1", "--warmup-steps", "1", "--init-head", head, "--revocab",
                              "--tau-prompts", "0")) == 0
    picked = DraftVocab.load(os.path.join(revocab, "vocab.npz"))
    (old_cfg, old), (new_cfg, new) = load_draft(head), load_draft(os.path.join(revocab, "draft"))
    with np.load(os.path.join(revocab, "data", "train.npz")) as train:
        expected_vocab = select_draft_vocab(train["tokens"], train["loss_mask"], picked.target_vocab_size, 64,
                                            preferred=used_ids(np.asarray(old["d2t"])))
    np.testing.assert_array_equal(picked.used, expected_vocab.used)
    assert (old_cfg.draft_vocab_size, new_cfg.draft_vocab_size) == (80, 64)
    np.testing.assert_array_equal(new["d2t"], picked.d2t)
    target = load_target(model).params
    expected = carry_over_rows(np.asarray(old["lm_head"]), used_ids(np.asarray(old["d2t"])), picked.used,
                               np.asarray(target.get("lm_head", target["embed"]), np.float32))
    np.testing.assert_allclose(new["lm_head"], expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(new["fc"], old["fc"])
    with pytest.raises(EagleError, match="--revocab picks a new draft vocabulary"):
        run(*tiny_run_args(model, data, str(tmp_path / "clash"), "--revocab"))

    for flags, message in ((("--draft-vocab", "64"), r"--draft-vocab 64 \(the head: 80\)"), (("--head", "eagle1"), r"--head eagle1 \(the head: eagle3\)")):
        with pytest.raises(EagleError, match=message):
            run(*tiny_run_args(model, data, str(tmp_path / "clash"), "--init-head", head, *flags))
    with pytest.raises(EagleError, match="not a directory"):
        run(*tiny_run_args(model, data, str(tmp_path / "clash"), "--init-head", str(tmp_path / "no-head")))
    assert not os.path.exists(os.path.join(str(tmp_path / "clash"), "train_config.json"))


def test_self_distillation_is_resumable(files, tmp_path):
    model, _ = files
    target = load_target(model)
    convs = [Conversation(f"c{i}", ({"role": "user", "content": f"w{i} w1"}, {"role": "assistant", "content": "w9"},
                                    {"role": "user", "content": "w2"}, {"role": "assistant", "content": "w3"})) for i in range(3)]
    directory = str(tmp_path / "regen")
    first = regenerate_conversations(convs, target, directory, max_new_tokens=6, batch_size=2, seq_len=64)
    assert [c.id for c in first] == ["c0", "c1", "c2"]
    for c in first:  # both answers are the target's own (it counts: w_i -> w_{i+1}), the questions are kept
        assert [m["content"] for m in c.messages if m["role"] == "user"] == [convs[int(c.id[1])].messages[0]["content"], "w2"]
        assert all(m["content"] != "w9" for m in c.messages if m["role"] == "assistant")
    part = os.path.join(directory, "part-00000-of-00001.jsonl")
    lines = open(part).read().splitlines()
    assert len(lines) == 3
    with open(part, "w") as f:  # an interrupted run: one finished conversation, a torn line
        f.write(lines[0] + "\n" + lines[1][:10])
    again = regenerate_conversations(convs, target, directory, max_new_tokens=6, batch_size=2, seq_len=64)
    assert again == first
    tight = regenerate_conversations(convs[:1], target, str(tmp_path / "tight"), max_new_tokens=6, batch_size=2, seq_len=20)
    assert [m["role"] for m in tight[0].messages] == ["user", "assistant"]  # the second question leaves no room


def test_self_distillation_can_keep_the_first_answers(files, tmp_path):
    """keep_turns=1 answers only the later turns: given the target's own first answers it reproduces a
    full regeneration; a conversation with nothing left to answer is dropped."""
    model, _ = files
    target = load_target(model)
    convs = [Conversation(f"c{i}", ({"role": "user", "content": f"w{i} w1"}, {"role": "assistant", "content": "w9"},
                                    {"role": "user", "content": "w2"}, {"role": "assistant", "content": "w3"})) for i in range(2)]
    full = regenerate_conversations(convs, target, str(tmp_path / "full"), max_new_tokens=6, batch_size=2, seq_len=64)
    one_exchange = Conversation("one", convs[0].messages[:2])
    later = regenerate_conversations([*full, one_exchange], target, str(tmp_path / "later"), max_new_tokens=6, batch_size=2,
                                     seq_len=64, keep_turns=1)
    assert later == full
    kept_as_given = regenerate_conversations(convs, target, str(tmp_path / "given"), max_new_tokens=6, batch_size=2, seq_len=64,
                                             keep_turns=1)
    assert [c.messages[:3] for c in kept_as_given] == [c.messages[:3] for c in convs]  # "w9" stays
    assert all(c.messages[3]["content"] not in ("w3", "") for c in kept_as_given)
    assert regenerate_conversations(convs, target, str(tmp_path / "tight"), max_new_tokens=6, batch_size=2, seq_len=20,
                                    keep_turns=1) == []  # the second question leaves no room, the first turn alone is not kept


def test_resume_accepts_a_run_saved_before_a_setting_existed(tmp_path):
    cfg = TrainConfig(model="m", data="d", out=str(tmp_path), resume=True)
    saved = cfg.fingerprint()
    del saved["regen_keep_turns"]  # a run from before --regen-keep-turns, with its default
    (tmp_path / "train_config.json").write_text(json.dumps(saved))
    check_out_dir(cfg)
    with pytest.raises(EagleError, match=r"settings differ .*regen_keep_turns: None -> 1"):
        check_out_dir(dataclasses.replace(cfg, regenerate=True, regen_keep_turns=1))
    with pytest.raises(EagleError, match="--regen-keep-turns .* only with --regenerate"):
        dataclasses.replace(cfg, regen_keep_turns=1)


def test_bad_input_is_a_one_line_error_and_overwrites_nothing(files, learned, tmp_path):
    model, data = files
    out = str(tmp_path / "bad")
    cases = [
        (tiny_run_args(model, str(tmp_path / "missing.json"), out), "does not exist"),
        (tiny_run_args(str(tmp_path / "no-model"), data, out), "model path .*no-model does not exist"),
        (tiny_run_args(model, data, out, "--head", "eagle1"), "eagle1 head predicts over the target's full vocabulary"),
        (tiny_run_args(model, data, out, "--draft-vocab", "500"), "--draft-vocab must be in"),
        (tiny_run_args(model, data, out, "--batch-size", "300"), "cannot fill one update"),
        (tiny_run_args(model, data, out, "--max-shard-size", "1KB"), r"--max-shard-size 1000 bytes is smaller than the head's fc.weight"),
    ]
    questions_only = tmp_path / "questions.json"
    questions_only.write_text(json.dumps([{"conversations": [{"from": "human", "value": "w1"}]}]))
    cases.append((tiny_run_args(model, str(questions_only), out), "no usable conversation with an assistant turn"))
    for args, message in cases:
        with pytest.raises(EagleError, match=message) as e:
            run(*args)
        assert "\n" not in str(e.value)
        assert not os.path.exists(os.path.join(out, "train_config.json"))
    before = {name: os.path.getmtime(os.path.join(learned, name)) for name in os.listdir(learned)}
    with pytest.raises(EagleError, match="already holds a training run"):
        run(*tiny_run_args(model, data, learned, *LEARN))
    with pytest.raises(EagleError, match=r"settings differ.*ttt_steps: 3 -> 2"):
        run(*tiny_run_args(model, data, learned, *LEARN, "--ttt-steps", "2", "--resume"))
    with pytest.raises(EagleError, match="holds no training run"):
        run(*tiny_run_args(model, data, str(tmp_path / "empty"), "--resume"))
    assert {name: os.path.getmtime(os.path.join(learned, name)) for name in os.listdir(learned)} == before
    assert cli.main(tiny_run_args(model, data, learned, *LEARN)) == 2  # `python -m eagle_jax.train` prints it as one line
