"""Tree settings: the benchmark's sweep grids; the tuned tree and batch policy saved with a head
(infer/settings.py) and the one decision made from them and the flags; atomic JSON."""

from __future__ import annotations

import json
import os

import jax
import pytest

from eagle_jax.errors import EagleError
from eagle_jax.files import write_json_atomic
from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.infer.bench_policy import auto_tune_trees, parse_int_list, parse_sweep, parse_trees, sweep_trees
from eagle_jax.infer.settings import (
    TreeChoice, choose_tree, load_batch_policy, load_tuned_tree, save_batch_policy, save_tuned_tree,
)

BASE = TreeConfig(top_k=4, depth=4, num_nodes=16)


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(EagleError) as info:
        fn(*args, **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_sweep_is_a_grid_over_the_base_tree():
    trees = sweep_trees(parse_sweep(["num_nodes=8,16", "depth=2,3"]), BASE)
    assert [(t.top_k, t.depth, t.num_nodes) for t in trees] == [(4, 2, 8), (4, 3, 8), (4, 2, 16), (4, 3, 16)]
    assert sweep_trees(parse_sweep(["top_k=2,2"]), BASE) == [TreeConfig(2, 4, 16)]
    assert [t.lookup for t in sweep_trees(parse_sweep(["lookup=0,6"]), BASE)] == [0, 6]  # lookup may be 0


def test_listed_trees():
    assert parse_trees("2/2/4, 1/1/2/3,2/2/4") == [TreeConfig(2, 2, 4), TreeConfig(1, 1, 2, lookup=3)]
    for text, words in [("2/2", "2 numbers"), ("2/x/4", "top_k/depth/num_nodes"), ("1/1/9", "num_nodes"), (",", "at least one")]:
        assert words in one_line_error(parse_trees, text)


@pytest.mark.parametrize("spec, words", [
    (["width=4"], "AXIS"), (["num_nodes"], "AXIS"), (["num_nodes=8,x"], "integers"),
    (["num_nodes=0"], ">= 1"), (["lookup=-1"], ">= 0"), (["top_k=1"], "not a valid tree"), (["depth=2", "depth=3"], "twice"),
])
def test_bad_sweeps(spec, words):
    assert words in one_line_error(lambda: sweep_trees(parse_sweep(spec), BASE))


def test_auto_tune_budgets_fit_the_tree():
    assert [t.num_nodes for t in auto_tune_trees(BASE)] == [8, 16, 32, 64]
    assert [t.num_nodes for t in auto_tune_trees(TreeConfig(2, 2, 4))] == [8]  # pool 2 + 2*4 = 10 nodes


def test_parse_int_list():
    assert parse_int_list("1,2, 4", "--batch-sizes") == [1, 2, 4]
    assert "--batch-sizes" in one_line_error(parse_int_list, "1,0", "--batch-sizes")


def tuned(draft_dir, **kwargs) -> TreeConfig | None:
    found = load_tuned_tree(str(draft_dir), **kwargs)
    return None if found is None else found.tree


def test_sampling_has_its_own_tuned_tree_and_falls_back_to_the_greedy_one(tmp_path):
    save_tuned_tree(str(tmp_path), TreeConfig(2, 1, 3, lookup=5), {"device_kind": "cpu"})
    assert tuned(tmp_path, sampled=True) == TreeConfig(2, 1, 3, lookup=5)  # none tuned for sampling yet
    path = save_tuned_tree(str(tmp_path), TreeConfig(2, 2, 4), {"device_kind": "cpu"}, sampled=True)
    assert os.path.basename(path) == "tree_sampled.json"
    assert load_tuned_tree(str(tmp_path), device_kind="cpu", sampled=True).path == path
    assert tuned(tmp_path, device_kind="cpu", sampled=True) == TreeConfig(2, 2, 4)
    assert tuned(tmp_path, device_kind="cpu") == TreeConfig(2, 1, 3, lookup=5)


def test_a_tuning_run_where_no_tree_paid_turns_speculation_off_for_its_mode_only(tmp_path):
    save_tuned_tree(str(tmp_path), TreeConfig(1, 1, 2, lookup=3), {"device_kind": "cpu"})
    path = save_tuned_tree(str(tmp_path), TreeConfig(1, 1, 2), {"device_kind": "cpu"}, sampled=True, speculate=False)
    assert not load_tuned_tree(str(tmp_path), device_kind="cpu", sampled=True).speculate
    assert load_tuned_tree(str(tmp_path), device_kind="cpu").speculate  # greedy has its own file
    assert load_tuned_tree(str(tmp_path), device_kind="NVIDIA H200", sampled=True) is None  # measured elsewhere: not applied
    assert tuned(tmp_path, sampled=True) == TreeConfig(1, 1, 2)
    with open(path, "w") as f:  # saved before the field existed: it speculated
        json.dump({"top_k": 1, "depth": 1, "num_nodes": 2}, f)
    assert load_tuned_tree(str(tmp_path), sampled=True).speculate
    with open(path, "w") as f:
        json.dump({"top_k": 1, "depth": 1, "num_nodes": 2, "speculate": "no"}, f)
    assert "tree_sampled.json" in one_line_error(load_tuned_tree, str(tmp_path), sampled=True)


def test_tuned_tree_round_trip(tmp_path):
    assert load_tuned_tree(str(tmp_path)) is None
    path = save_tuned_tree(str(tmp_path), TreeConfig(3, 5, 24), {"device_kind": "cpu"})
    assert json.load(open(path)) == {"top_k": 3, "depth": 5, "num_nodes": 24, "lookup": 0, "scoring": "dynamic", "speculate": True, "measured_on": {"device_kind": "cpu"}}
    assert tuned(tmp_path) == TreeConfig(3, 5, 24)
    assert tuned(tmp_path, device_kind="cpu") == TreeConfig(3, 5, 24)
    assert tuned(tmp_path, device_kind="NVIDIA H200") is None
    save_tuned_tree(str(tmp_path), TreeConfig(2, 1, 3, lookup=6), {"device_kind": "cpu"})
    assert tuned(tmp_path) == TreeConfig(2, 1, 3, lookup=6)
    sampled = save_tuned_tree(str(tmp_path), TreeConfig(2, 1, 3, "sampled"), {"device_kind": "cpu"}, sampled=True)
    assert tuned(tmp_path, sampled=True) == TreeConfig(2, 1, 3, "sampled")
    os.remove(sampled)
    with open(path, "w") as f:  # saved before lookup and scoring existed: none, and dynamic
        json.dump({"top_k": 3, "depth": 5, "num_nodes": 24}, f)
    assert tuned(tmp_path) == TreeConfig(3, 5, 24)
    for bad in ('{"top_k": 3}', '{"top_k": 3, "depth": 5, "num_nodes": 24, "scoring": "best"}', "[3, 5, 24]", "{oops"):
        with open(path, "w") as f:
            f.write(bad)
        assert "tree.json" in one_line_error(load_tuned_tree, str(tmp_path))


def test_the_committed_heads_tuned_files_still_load():
    from eagle_jax.loading.registry import default_head_dir

    head = default_head_dir("smollm2-135m-instruct")
    for sampled, name in ((False, "tree.json"), (True, "tree_sampled.json")):
        saved = json.load(open(os.path.join(head, name)))
        found = load_tuned_tree(head, sampled=sampled)
        assert found.path == os.path.join(head, name) and found.speculate == saved["speculate"]
        assert {field: getattr(found.tree, field) for field in ("top_k", "depth", "num_nodes", "lookup")} == {
            field: saved[field] for field in ("top_k", "depth", "num_nodes", "lookup")}


def row(batch, nodes, ar, spec):
    return {"batch": batch, "top_k": 4, "depth": 4, "num_nodes": nodes, "ar_tokens_per_s": ar, "spec_tokens_per_s": spec}


TABLE = (
    row(1, 8, 10.0, 18.0), row(1, 16, 10.0, 22.0),  # batch 1: the bigger tree is fastest
    row(4, 8, 35.0, 45.0), row(4, 16, 35.0, 40.0),  # batch 4: the smaller tree is fastest
    row(16, 8, 120.0, 90.0), row(16, 16, 120.0, 70.0),  # batch 16: plain decoding wins
)


def test_a_batch_table_picks_the_tree_per_batch_size(tmp_path):
    static = TreeChoice(TreeConfig(4, 4, 12, "static"), batch_table=TABLE)
    assert static.for_batch(1) == TreeConfig(4, 4, 16, "static")  # scoring kept from the given tree
    sampled_table = TreeChoice(BASE, batch_table=tuple(r | {"scoring": "sampled"} for r in TABLE))  # measured while sampling
    assert sampled_table.for_batch(1) == TreeConfig(4, 4, 16)  # greedy decoding keeps its own scoring
    choice = TreeChoice(BASE, batch_table=TABLE, policy_file="DRAFT/batch_policy.json")
    assert choice.for_batch(2) == TreeConfig(4, 4, 8)  # rounds up to the measured batch 4
    assert choice.for_batch(4) == TreeConfig(4, 4, 8) and choice.why_plain(4) is None
    assert choice.for_batch(5) is None and "batch_policy.json" in choice.why_plain(5)
    assert choice.for_batch(64) is None  # beyond the table: its largest batch
    assert TreeChoice(BASE, batch_table=(row(1, 8, 10.0, None),)).for_batch(8) == BASE  # nothing speculative measured
    assert "batch size" in one_line_error(choice.for_batch, 0)
    save_batch_policy(str(tmp_path), list(TABLE), {"device_kind": "cpu"})
    assert load_batch_policy(str(tmp_path)) == list(TABLE)
    assert load_batch_policy(str(tmp_path), device_kind="cpu") == list(TABLE)
    assert load_batch_policy(str(tmp_path), device_kind="TPU v5 lite") is None  # measured elsewhere: not applied


def test_plain_decoding_has_one_spelling():
    assert TreeChoice(None).for_batch(1) is None and TreeChoice(None).why_plain(1) is None  # no head: plain, as asked
    off = TreeChoice(BASE, speculate=False, batch_table=TABLE, tuned_file="DRAFT/tree.json")
    assert off.for_batch(1) is None and "--auto-tune" in off.why_plain(1) and "--tree-" in off.why_plain(1)


def save_head_settings(draft_dir, speculate=True):
    """A greedy tuned tree (k3 d2 n6) and a batch table in which plain decoding wins at every size."""
    machine = {"device_kind": jax.devices()[0].device_kind}
    save_tuned_tree(str(draft_dir), TreeConfig(3, 2, 6, "static"), machine, speculate=speculate)
    save_batch_policy(str(draft_dir), [row(1, 8, 10.0, 8.0), row(4, 8, 30.0, 20.0)], machine)


def test_saved_settings_decide_when_no_tree_flag_is_given(tmp_path):
    assert choose_tree(None, sampled=False) == TreeChoice(None)
    assert choose_tree(str(tmp_path), sampled=False).for_batch(1) == TreeConfig()  # nothing saved: the default tree
    save_head_settings(tmp_path)
    choice = choose_tree(str(tmp_path), sampled=False)
    assert choice.tree == TreeConfig(3, 2, 6, "static")
    assert choice.for_batch(1) is None and "batch_policy.json" in choice.why_plain(1)
    save_head_settings(tmp_path, speculate=False)
    assert "tree.json" in choose_tree(str(tmp_path), sampled=False).why_plain(1)


@pytest.mark.parametrize("flags, tree", [
    ({"num_nodes": 8}, TreeConfig(num_nodes=8)),  # a shape flag replaces the tuned shape as a whole
    ({"top_k": 2, "depth": 1, "num_nodes": 4, "lookup": 2}, TreeConfig(2, 1, 4, lookup=2)),
    ({"scoring": "dynamic"}, TreeConfig(3, 2, 6, "dynamic")),  # scoring alone keeps the tuned shape
])
def test_an_explicit_tree_flag_wins_over_the_saved_settings(tmp_path, flags, tree):
    save_head_settings(tmp_path)
    for speculate in (True, False):  # over a batch policy where plain decoding wins, and over a tuned "speculate": false
        save_head_settings(tmp_path, speculate)
        choice = choose_tree(str(tmp_path), sampled=False, **flags)
        assert [choice.for_batch(b) for b in (1, 4, 64)] == [tree] * 3


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    path = str(tmp_path / "out.json")
    write_json_atomic(path, {"a": 1})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"a": float("nan")})  # not JSON: fails mid-write
    assert json.load(open(path)) == {"a": 1}
    assert os.listdir(tmp_path) == ["out.json"]  # no temporary left behind


def test_the_engine_decodes_each_batch_as_the_choice_says():
    from conftest import tiny_config
    from eagle_jax.draft import DraftConfig, init_draft_params
    from eagle_jax.infer.engine import Engine
    from eagle_jax.loading import TargetModel
    from eagle_jax.model.transformer import init_params

    cfg = tiny_config()
    dcfg = DraftConfig.for_target(cfg, kind="eagle3")
    target = TargetModel(cfg, init_params(jax.random.key(0), cfg), None, "tiny")
    table = (
        {"batch": 1, "top_k": 2, "depth": 1, "num_nodes": 4, "ar_tokens_per_s": 10.0, "spec_tokens_per_s": 20.0},
        {"batch": 2, "top_k": 2, "depth": 1, "num_nodes": 4, "ar_tokens_per_s": 30.0, "spec_tokens_per_s": 20.0},
    )
    choice = TreeChoice(TreeConfig(3, 2, 8), batch_table=table)
    assert choice.for_batch(1) == TreeConfig(2, 1, 4) and choice.for_batch(2) is None
    engine = Engine(target, (dcfg, init_draft_params(jax.random.key(1), dcfg)), max_new_tokens=6)
    one, two = engine.run([[1, 2, 3]], tree=choice.for_batch(1)), engine.run([[1, 2, 3], [4, 5]], tree=choice.for_batch(2))
    assert sum(one.rounds) > 0 and two.rounds == [0, 0]  # batch 2 decodes plainly
    assert two.tokens[0] == one.tokens[0]
    plain_only = Engine(target, max_new_tokens=6)
    assert plain_only.run([[1, 2, 3]], tree=None).tokens == one.tokens
    assert "draft head" in one_line_error(plain_only.run, [[1, 2, 3]], tree=TreeConfig(2, 1, 4))
