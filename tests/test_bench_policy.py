"""Bench tree settings: sweep grids, the tuned tree saved with a head, the batch policy, atomic JSON."""

from __future__ import annotations

import json
import os

import pytest

from eagle_jax.errors import EagleError
from eagle_jax.files import write_json_atomic
from eagle_jax.infer.bench import load_batch_policy, load_tuned_tree, tree_for_batch
from eagle_jax.infer.bench_policy import (
    auto_tune_trees, parse_int_list, parse_sweep, parse_trees, save_batch_policy, save_tuned_tree, sweep_trees, tuned_speculation_pays,
)
from eagle_jax.decoding.tree import TreeConfig

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


def test_sampling_has_its_own_tuned_tree_and_falls_back_to_the_greedy_one(tmp_path):
    save_tuned_tree(str(tmp_path), TreeConfig(2, 1, 3, lookup=5), {"device_kind": "cpu"})
    assert load_tuned_tree(str(tmp_path), sampled=True) == TreeConfig(2, 1, 3, lookup=5)  # none tuned for sampling yet
    path = save_tuned_tree(str(tmp_path), TreeConfig(2, 2, 4), {"device_kind": "cpu"}, sampled=True)
    assert os.path.basename(path) == "tree_sampled.json"
    assert load_tuned_tree(str(tmp_path), device_kind="cpu", sampled=True) == TreeConfig(2, 2, 4)
    assert load_tuned_tree(str(tmp_path), device_kind="cpu") == TreeConfig(2, 1, 3, lookup=5)


def test_a_tuning_run_where_no_tree_paid_turns_speculation_off_for_its_mode_only(tmp_path):
    assert tuned_speculation_pays(str(tmp_path))  # nothing tuned: the default tree speculates
    save_tuned_tree(str(tmp_path), TreeConfig(1, 1, 2, lookup=3), {"device_kind": "cpu"})
    path = save_tuned_tree(str(tmp_path), TreeConfig(1, 1, 2), {"device_kind": "cpu"}, sampled=True, speculate=False)
    assert not tuned_speculation_pays(str(tmp_path), device_kind="cpu", sampled=True)
    assert tuned_speculation_pays(str(tmp_path), device_kind="cpu")  # greedy has its own file
    assert tuned_speculation_pays(str(tmp_path), device_kind="NVIDIA H200", sampled=True)  # measured elsewhere: not applied
    assert load_tuned_tree(str(tmp_path), sampled=True) == TreeConfig(1, 1, 2)
    with open(path, "w") as f:  # saved before the field existed: it speculated
        json.dump({"top_k": 1, "depth": 1, "num_nodes": 2}, f)
    assert tuned_speculation_pays(str(tmp_path), sampled=True)
    with open(path, "w") as f:
        json.dump({"top_k": 1, "depth": 1, "num_nodes": 2, "speculate": "no"}, f)
    assert "tree_sampled.json" in one_line_error(tuned_speculation_pays, str(tmp_path), sampled=True)


def test_tuned_tree_round_trip(tmp_path):
    assert load_tuned_tree(str(tmp_path)) is None
    path = save_tuned_tree(str(tmp_path), TreeConfig(3, 5, 24), {"device_kind": "cpu"})
    assert json.load(open(path)) == {"top_k": 3, "depth": 5, "num_nodes": 24, "lookup": 0, "scoring": "dynamic", "speculate": True, "measured_on": {"device_kind": "cpu"}}
    assert load_tuned_tree(str(tmp_path)) == TreeConfig(3, 5, 24)
    assert load_tuned_tree(str(tmp_path), device_kind="cpu") == TreeConfig(3, 5, 24)
    assert load_tuned_tree(str(tmp_path), device_kind="NVIDIA H200") is None
    save_tuned_tree(str(tmp_path), TreeConfig(2, 1, 3, lookup=6), {"device_kind": "cpu"})
    assert load_tuned_tree(str(tmp_path)) == TreeConfig(2, 1, 3, lookup=6)
    sampled = save_tuned_tree(str(tmp_path), TreeConfig(2, 1, 3, "sampled"), {"device_kind": "cpu"}, sampled=True)
    assert load_tuned_tree(str(tmp_path), sampled=True) == TreeConfig(2, 1, 3, "sampled")
    os.remove(sampled)
    with open(path, "w") as f:  # saved before lookup and scoring existed: none, and dynamic
        json.dump({"top_k": 3, "depth": 5, "num_nodes": 24}, f)
    assert load_tuned_tree(str(tmp_path)) == TreeConfig(3, 5, 24)
    for bad in ('{"top_k": 3}', '{"top_k": 3, "depth": 5, "num_nodes": 24, "scoring": "best"}'):
        with open(path, "w") as f:
            f.write(bad)
        assert "tree.json" in one_line_error(load_tuned_tree, str(tmp_path))


def row(batch, nodes, ar, spec):
    return {"batch": batch, "top_k": 4, "depth": 4, "num_nodes": nodes, "ar_tokens_per_s": ar, "spec_tokens_per_s": spec}


TABLE = [
    row(1, 8, 10.0, 18.0), row(1, 16, 10.0, 22.0),  # batch 1: the bigger tree is fastest
    row(4, 8, 35.0, 45.0), row(4, 16, 35.0, 40.0),  # batch 4: the smaller tree is fastest
    row(16, 8, 120.0, 90.0), row(16, 16, 120.0, 70.0),  # batch 16: plain decoding wins
]


def test_tree_for_batch_follows_the_measured_table(tmp_path):
    static = TreeConfig(4, 4, 12, "static")
    assert tree_for_batch(static, 1, TABLE) == TreeConfig(4, 4, 16, "static")  # scoring kept from the given tree
    sampled_table = [r | {"scoring": "sampled"} for r in TABLE]  # measured while sampling
    assert tree_for_batch(BASE, 1, sampled_table) == TreeConfig(4, 4, 16)  # greedy decoding keeps its own scoring
    assert tree_for_batch(BASE, 2, TABLE) == TreeConfig(4, 4, 8)  # rounds up to the measured batch 4
    assert tree_for_batch(BASE, 4, TABLE) == TreeConfig(4, 4, 8)
    assert tree_for_batch(BASE, 5, TABLE) is None
    assert tree_for_batch(BASE, 64, TABLE) is None  # beyond the table: its largest batch
    assert tree_for_batch(BASE, 8, [row(1, 8, 10.0, None)]) == BASE  # nothing speculative measured
    assert "batch size" in one_line_error(tree_for_batch, BASE, 0, TABLE)
    save_batch_policy(str(tmp_path), TABLE, {"device_kind": "cpu"})
    assert load_batch_policy(str(tmp_path)) == TABLE


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    path = str(tmp_path / "out.json")
    write_json_atomic(path, {"a": 1})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"a": float("nan")})  # not JSON: fails mid-write
    assert json.load(open(path)) == {"a": 1}
    assert os.listdir(tmp_path) == ["out.json"]  # no temporary left behind


def test_engine_follows_the_batch_policy():
    import jax

    from conftest import tiny_config
    from eagle_jax.draft import DraftConfig, init_draft_params
    from eagle_jax.infer.engine import Engine
    from eagle_jax.loading import TargetModel
    from eagle_jax.model.transformer import init_params

    cfg = tiny_config()
    dcfg = DraftConfig.for_target(cfg, kind="eagle3")
    target = TargetModel(cfg, init_params(jax.random.key(0), cfg), None, "tiny")
    table = [
        {"batch": 1, "top_k": 2, "depth": 1, "num_nodes": 4, "ar_tokens_per_s": 10.0, "spec_tokens_per_s": 20.0},
        {"batch": 2, "top_k": 2, "depth": 1, "num_nodes": 4, "ar_tokens_per_s": 30.0, "spec_tokens_per_s": 20.0},
    ]
    engine = Engine(target, (dcfg, init_draft_params(jax.random.key(1), dcfg)), TreeConfig(3, 2, 8), max_new_tokens=6, batch_policy=table)
    assert engine.tree_for(1) == TreeConfig(2, 1, 4) and engine.tree_for(2) is None
    one, two = engine.run([[1, 2, 3]]), engine.run([[1, 2, 3], [4, 5]])
    assert sum(one.rounds) > 0 and two.rounds == [0, 0]  # batch 2 decodes plainly
    assert two.tokens[0] == one.tokens[0]
