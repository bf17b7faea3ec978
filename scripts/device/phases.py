"""The device kit's measuring and training phases (docs/device.md). `kit.py run` starts them.

    python scripts/device/phases.py PHASE --kit DIR --out OUT --until UNIX_TIME [--smoke]

PHASE is one of
  env       a. the machine: backend, devices, memory, versions;
  generate  c. plain against speculative generate of the default model with the shipped head, row by
            row (dtype, attention, batch, tree), output equality checked, then one round's phases
            timed apart (draft, verify, accept, commit);
  distill   d-f. self-distillation (the target answers the packed prompts in large batches), training
            of the shipped EAGLE-3.1 head on those answers with online target features against the
            wall clock, exported into OUT/head every minute, then the new head's tau against the
            shipped one's on the dev questions.
  compile   not a device phase: compiles what the others would, with the full plan's shapes, and
            times each compile (`--smoke` changes nothing here; run it on CPU for the estimate).
(Phase b, the kernel check, is scripts/tools/device_check_kernels.py.) Each phase adds its record to
OUT/results.json as each unit of work finishes, so a kill at the device's limit keeps what was done,
and stops starting units when the next would pass --until. Compile counts and seconds are recorded
per unit: on a fresh machine nothing is cached and compiling is part of the budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax.decoding.plain import generate_ar_jit
from eagle_jax.decoding.prompts import pad_prompts
from eagle_jax.decoding.speculative import generate_spec_jit
from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.draft.checkpoint import export_draft, load_draft
from eagle_jax.files import read_json, write_json_atomic
from eagle_jax.infer.engine import Engine
from eagle_jax.infer.settings import load_tuned_tree
from eagle_jax.loading import TargetModel, load_target
from eagle_jax.loading.registry import DEFAULT_MODEL, default_head_dir
from eagle_jax import mesh as mesh_lib
from eagle_jax.model.sharding import fsdp_shardings
from eagle_jax.train.data import TokenizedSet, batch_indices
from eagle_jax.train.metrics import summarize
from eagle_jax.train.optim import OptimConfig, make_optimizer
from eagle_jax.train.trainer import BatchLoader, Objective, make_step_functions
from eagle_jax.train.ttt import for_training
from eagle_jax.train.vocab import used_ids

RESULTS = "results.json"
HEAD_DIR = "head"  # OUT/head: the trained head, loadable by `eagle-jax generate --draft`
MAX_SHARD_BYTES = 15 * 2**20  # what comes back from the device: files of at most 16 MiB


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured configuration of phase c."""

    dtype: str
    attention: str
    batch: int
    tree: TreeConfig

    @property
    def name(self) -> str:
        t = self.tree
        return f"{self.dtype}/{self.attention}/b{self.batch}/{t.top_k}-{t.depth}-{t.num_nodes}" + (f"-L{t.lookup}" if t.lookup else "")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sizes of every phase. One prompt width and cache per phase keeps the compiles few."""

    generate_prompts: int  # phase c: Spec-Bench and dev prompts, alternating
    generate_new_tokens: int
    rows: tuple[Row, ...]  # in priority order: the budget cuts the tail
    split_row: Row  # the row whose round is timed phase by phase
    split_reps: int
    distill_batch: int
    distill_new_tokens: int
    train_batch: int
    ttt_steps: int
    lr: float
    warmup_steps: int
    max_train_steps: int | None  # None: until the budget
    export_every_s: float
    log_every: int
    tau_prompts: int
    tau_new_tokens: int
    tau_trees: tuple[TreeConfig, ...]  # the shipped head's tuned tree is measured as well
    layers: str = "auto"  # the target's layer form (scan on the GPU); the smoke runs the GPU's on CPU


MAIN_TREE = TreeConfig(8, 5, 32)
FULL = Plan(
    generate_prompts=8, generate_new_tokens=128,
    rows=(
        Row("bfloat16", "xla", 1, MAIN_TREE), Row("bfloat16", "pallas", 1, MAIN_TREE), Row("bfloat16", "xla", 1, TreeConfig(10, 7, 60)),
        Row("bfloat16", "xla", 1, TreeConfig.chain(5)), Row("bfloat16", "xla", 8, MAIN_TREE), Row("float32", "xla", 1, MAIN_TREE),
        Row("bfloat16", "pallas", 8, MAIN_TREE), Row("bfloat16", "pallas", 1, TreeConfig(10, 7, 60)), Row("bfloat16", "xla", 1, TreeConfig(4, 4, 16)),
        Row("float32", "pallas", 1, MAIN_TREE), Row("bfloat16", "xla", 8, TreeConfig(10, 7, 60)), Row("bfloat16", "xla", 8, TreeConfig.chain(5)),
    ),
    split_row=Row("bfloat16", "xla", 1, MAIN_TREE), split_reps=10,
    distill_batch=512, distill_new_tokens=256,
    train_batch=32, ttt_steps=7, lr=3e-4, warmup_steps=20, max_train_steps=None, export_every_s=60.0, log_every=20,
    tau_prompts=10, tau_new_tokens=128, tau_trees=(MAIN_TREE,), layers="scan",  # the GPU's form, also where compiles are measured on CPU
)
SMOKE = Plan(  # the same code on CPU in a minute or two: tiny counts, the real model
    generate_prompts=2, generate_new_tokens=8,
    rows=(Row("float32", "xla", 1, TreeConfig(2, 2, 4)),),
    split_row=Row("float32", "xla", 1, TreeConfig(2, 2, 4)), split_reps=1,
    distill_batch=4, distill_new_tokens=8,
    train_batch=2, ttt_steps=2, lr=3e-4, warmup_steps=1, max_train_steps=3, export_every_s=0.0, log_every=1,
    tau_prompts=2, tau_new_tokens=8, tau_trees=(), layers="scan",
)


# --- bookkeeping ------------------------------------------------------------------------------

class Compiles:
    """Backend compilations seen so far in this process (count, seconds), from jax.monitoring."""

    count, seconds = 0, 0.0

    @classmethod
    def install(cls) -> None:
        def listen(name: str, duration: float, **_) -> None:
            if name == "/jax/core/compile/backend_compile_duration":
                cls.count += 1
                cls.seconds += duration

        jax.monitoring.register_event_duration_secs_listener(listen)

    @classmethod
    def since(cls, mark: tuple[int, float]) -> dict:
        return {"compiles": cls.count - mark[0], "compile_s": round(cls.seconds - mark[1], 2)}

    @classmethod
    def mark(cls) -> tuple[int, float]:
        return cls.count, cls.seconds


def record(out: str, phase: str, value: dict) -> None:
    """Set results.json[phase] = value, atomically (a kill leaves the previous file)."""
    path = os.path.join(out, RESULTS)
    results = read_json(path, expect=dict, what="the kit's results") if os.path.exists(path) else {}
    results[phase] = value
    write_json_atomic(path, results)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


@dataclasses.dataclass(frozen=True)
class Kit:
    """What the kit's last call assembled: the target GGUF and the tokenized prompt sets."""

    gguf: str
    prompts: dict  # name -> np.ndarray, from prompts.npz

    @classmethod
    def open(cls, directory: str) -> "Kit":
        ggufs = sorted(f for f in os.listdir(os.path.join(directory, "model")) if f.endswith(".gguf"))
        with np.load(os.path.join(directory, "prompts.npz")) as f:
            prompts = {k: f[k] for k in f.files}
        return cls(os.path.join(directory, "model", ggufs[0]), prompts)

    def prompt_set(self, name: str, count: int | None = None) -> list[list[int]]:
        tokens, offsets = self.prompts[f"{name}_tokens"], self.prompts[f"{name}_offsets"]
        n = len(offsets) - 1 if count is None else min(count, len(offsets) - 1)
        return [tokens[offsets[i]: offsets[i + 1]].astype(np.int32).tolist() for i in range(n)]

    @property
    def width(self) -> int:  # the padded width of every distillation prompt: one compiled shape for d and e
        return padded_width([[0] * int(self.prompts["max_prompt_tokens"])])

    def generate_prompts(self, plan: Plan) -> list[list[int]]:
        """Phase c's prompts: Spec-Bench and dev questions, alternating."""
        specbench, dev = self.prompt_set("specbench"), self.prompt_set("dev")
        return [p for pair in zip(specbench, dev) for p in pair][: plan.generate_prompts]

    def tau_prompts(self, plan: Plan) -> list[list[int]]:
        return self.prompt_set("dev", plan.tau_prompts)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return tuple(int(i) for i in self.prompts["stop_ids"])


def padded_width(prompts: list[list[int]]) -> int:
    """The one padded prompt width (a multiple of 64) that holds every prompt of a set."""
    return -(-max(len(p) for p in prompts) // 64) * 64


def cast(target: TargetModel, dtype: str) -> TargetModel:
    return dataclasses.replace(target, params=jax.tree.map(lambda a: a.astype(dtype), target.params))


def head(dtype, cfg):
    return load_draft(default_head_dir(DEFAULT_MODEL), cfg, dtype=jnp.dtype(dtype))


def on_xla(target: TargetModel, draft=None):
    """The target (and a (config, params) head) with XLA attention: phases d-f must not depend on
    a kernel that phase b is the first to compile on the GPU."""
    target = dataclasses.replace(target, cfg=dataclasses.replace(target.cfg, attention="xla"))
    return target if draft is None else (target, (dataclasses.replace(draft[0], attention="xla"), draft[1]))


# --- a. the machine ---------------------------------------------------------------------------

def phase_env(plan: Plan, kit: Kit, out: str, until: float) -> None:
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False) if device.platform == "gpu" else None
    record(out, "env", {
        "jax": jax.__version__, "python": platform.python_version(), "platform": device.platform, "device_kind": device.device_kind,
        "devices": [str(d) for d in jax.devices()], "memory_bytes": stats.get("bytes_limit"),
        "nvidia_smi": smi.stdout.strip() if smi is not None else None, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "prompts": {k: int(len(v) - 1) for k, v in kit.prompts.items() if k.endswith("_offsets")},
    })
    say(f"jax {jax.__version__} on {device.device_kind} x{jax.device_count()}")


# --- c. plain against speculative generate ----------------------------------------------------

def equal_rows(a: list[list[int]], b: list[list[int]]) -> tuple[int, list[int]]:
    """(rows equal, first differing position of each row that differs)."""
    diffs = [next((i for i, (x, y) in enumerate(zip(r, s)) if x != y), min(len(r), len(s))) for r, s in zip(a, b) if r != s]
    return len(a) - len(diffs), diffs


def run_batches(engine: Engine, prompts: list[list[int]], batch: int, tree: TreeConfig | None, width: int) -> dict:
    results = [engine.run(prompts[i: i + batch], tree=tree, pad_to=width) for i in range(0, len(prompts), batch)]
    new = sum(r.new_tokens for r in results)
    rounds = sum(sum(r.rounds) for r in results)
    wall = sum(r.wall_s for r in results)
    return {
        "tokens": [row for r in results for row in r.tokens], "new_tokens": new, "wall_s": round(wall, 4),
        "tokens_per_s": round(new / wall, 2), "compile_s": round(sum(r.compile_s for r in results), 2),
        "tau": round((new - len(prompts)) / rounds, 4) if rounds else None,
    }


def phase_generate(plan: Plan, kit: Kit, out: str, until: float) -> None:
    prompts = kit.generate_prompts(plan)
    width = padded_width(prompts)
    cache_len = width + plan.generate_new_tokens
    target = load_target(kit.gguf, dtype=jnp.float32, with_tokenizer=False, layers=plan.layers)
    targets = {"float32": target, "bfloat16": cast(target, "bfloat16")}
    heads = {dtype: head(dtype, target.cfg) for dtype in targets}
    done, skipped, plain_runs, spent = [], [], {}, []
    for row in plan.rows:
        if spent and time.time() + max(spent) > until:  # the next row would not finish: a cut row costs a compile for nothing
            skipped.append(row.name)
            continue
        start, mark = time.time(), Compiles.mark()
        try:
            engine = Engine(targets[row.dtype], draft=heads[row.dtype], max_new_tokens=plan.generate_new_tokens,
                            cache_len=cache_len, attention=row.attention, layers=plan.layers)
            key = (row.dtype, row.attention, row.batch)
            if key not in plain_runs:
                plain_runs[key] = run_batches(engine, prompts, row.batch, None, width)
            plain = plain_runs[key]
            spec = run_batches(engine, prompts, row.batch, row.tree, width)
        except Exception as error:  # a row that fails (a kernel that does not compile) must not cost the others
            done.append({"row": row.name, "error": f"{type(error).__name__}: {error}"[:1500]})
            say(f"{row.name}: FAILED {error!r:.300}")
        else:
            equal, diffs = equal_rows(spec["tokens"], plain["tokens"])
            done.append({
                "row": row.name, **dataclasses.asdict(row) | {"tree": dataclasses.asdict(row.tree)},
                "plain_tokens_per_s": plain["tokens_per_s"], "spec_tokens_per_s": spec["tokens_per_s"],
                "speedup": round(spec["tokens_per_s"] / plain["tokens_per_s"], 3), "tau": spec["tau"],
                "new_tokens": spec["new_tokens"], "rows_equal_to_plain": equal, "rows": len(prompts), "first_difference_at": diffs,
                "plain_compile_s": plain["compile_s"], "spec_compile_s": spec["compile_s"], **Compiles.since(mark),
                "seconds": round(time.time() - start, 2),
            })
            say(f"{row.name}: plain {plain['tokens_per_s']} tok/s, spec {spec['tokens_per_s']} tok/s, tau {spec['tau']}, "
                f"equal {equal}/{len(prompts)}, {Compiles.since(mark)}")
        spent.append(time.time() - start)
        record(out, "generate", {"prompts": len(prompts), "new_tokens": plan.generate_new_tokens, "width": width,
                                 "cache_len": cache_len, "layers": plan.layers, "rows": done, "skipped": skipped})
    if time.time() + 2 * max(spent, default=0) > until:
        record(out, "round_split", {"skipped": plan.split_row.name})
        return
    mark = Compiles.mark()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from profile_round import round_split  # noqa: E402 (a benchmark script's function, on its own path)

    row = plan.split_row
    pieces = round_split(targets[row.dtype].params, target.cfg, *heads[row.dtype], row.tree, row.batch, plan.split_reps)
    record(out, "round_split", {"row": row.name, "ms": pieces, **Compiles.since(mark)})
    say(f"round split {row.name}: {pieces} ms")


# --- d-f. self-distillation, training, tau ----------------------------------------------------

def distill(plan: Plan, kit: Kit, target: TargetModel, until: float, out: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Greedy answers to the distillation prompts, batch after batch until the budget: samples of
    (prompt + answer tokens (L,), loss mask (L,) on the answer)."""
    prompts = kit.prompt_set("distill")
    width, b, n = kit.width, plan.distill_batch, plan.distill_new_tokens
    samples, batch_s, stopped, mark, start = [], [], 0, Compiles.mark(), time.time()
    for first in range(0, len(prompts), b):
        if batch_s and time.time() + 1.2 * max(batch_s[-3:]) > until:
            break
        batch = prompts[first: first + b]
        rows = batch + [batch[0]] * (b - len(batch))  # a short last batch keeps the compiled shape
        tokens, lengths = pad_prompts(rows, multiple=width)
        t0 = time.time()
        result = generate_ar_jit(target.params, target.cfg, tokens, lengths, jax.random.key(0),
                                 max_new_tokens=n, cache_len=width + n, stop_ids=kit.stop_ids)
        answers, counts = np.asarray(result.tokens), np.asarray(result.num_tokens)
        batch_s.append(time.time() - t0)
        for prompt, answer, count in zip(batch, answers, counts):
            reply = answer[:count]
            stopped += bool(count and reply[-1] in kit.stop_ids)
            samples.append((np.concatenate([prompt, reply]).astype(np.int32),
                            np.concatenate([np.zeros(len(prompt), bool), np.ones(count, bool)])))
        new = sum(int(m.sum()) for _, m in samples)
        steady = sum(batch_s[1:])
        record(out, "distill", {
            "prompts_answered": len(samples), "prompts_packed": len(prompts), "batch": b, "width": width, "max_new_tokens": n,
            "new_tokens": new, "stopped_by_stop_token": stopped, "seconds": round(time.time() - start, 2),
            "first_batch_s": round(batch_s[0], 2),
            "steady_tokens_per_s": round(new * (len(batch_s) - 1) / len(batch_s) / steady, 1) if steady else None,
            **Compiles.since(mark),
        })
    say(f"distilled {len(samples)} answers")
    return samples


def export_head(out: str, dcfg, params, d2t: np.ndarray) -> None:
    """The head in bfloat16 (as shipped), in shards that each fit a file that comes back."""
    host = jax.tree.map(lambda x: np.asarray(x).astype(jnp.bfloat16), mesh_lib.to_host(params))
    export_draft(os.path.join(out, HEAD_DIR), dcfg, host | {"d2t": d2t}, max_shard_bytes=MAX_SHARD_BYTES)


@dataclasses.dataclass
class Training:
    """The shipped head set up for training on the target: jitted steps, state, frozen inputs."""

    dcfg: object
    d2t: np.ndarray  # (Vd,) the head's draft vocabulary, kept
    fns: object  # trainer.StepFunctions, train_step with an update scale
    state: dict
    frozen: dict
    load: BatchLoader

    @classmethod
    def of_shipped_head(cls, plan: Plan, target: TargetModel, seq_len: int) -> "Training":
        dcfg, initial = load_draft(default_head_dir(DEFAULT_MODEL), target.cfg, dtype=jnp.float32)
        d2t = np.asarray(initial.pop("d2t"))
        dcfg, tcfg = for_training(dcfg), for_training(target.cfg)
        mesh = mesh_lib.training_mesh(1)
        frozen_shardings = {"target": fsdp_shardings(mesh, target.params), "used": mesh_lib.replicated(mesh)}
        frozen = {"target": mesh_lib.place(target.params, frozen_shardings["target"]), "used": mesh_lib.place(used_ids(d2t), frozen_shardings["used"])}
        objective = Objective(tcfg, dcfg, plan.ttt_steps, target.params["embed"].dtype)
        optimizer = make_optimizer(OptimConfig(plan.lr, total_steps=1, warmup_steps=0, schedule="constant"))
        key = jax.random.key(0)
        fns = make_step_functions(objective, optimizer, dcfg, mesh, frozen_shardings, ("tokens", "loss_mask"), key, scaled_updates=True)
        return cls(dcfg, d2t, fns, fns.init_state(key, initial), frozen, BatchLoader(mesh, plan.train_batch, seq_len))

    def batch(self, dataset: TokenizedSet, ids: np.ndarray) -> dict:
        return self.load(dataset, None, ids, np.ones(len(ids), bool))


def train_head(plan: Plan, kit: Kit, target: TargetModel, samples, until: float, out: str) -> None:
    """Train the shipped head on the samples until the budget, exporting it into OUT/head every
    plan.export_every_s and at the end; the update's scale follows the clock (linear warmup over
    steps, then linear decay to zero at `until`). Samples are cut or padded to the longest a
    distilled one can be (one compiled shape)."""
    dataset = TokenizedSet.from_samples(samples)
    seq_len = kit.width + plan.distill_new_tokens
    training = Training.of_shipped_head(plan, target, seq_len)
    fns, state, frozen, dcfg, d2t = training.fns, training.state, training.frozen, training.dcfg, training.d2t
    log, interval, mark, start = [], [], Compiles.mark(), time.time()
    clock_start, last_export, step, tokens = None, time.time(), 0, 0
    while plan.max_train_steps is None or step < plan.max_train_steps:
        now = time.time()
        if now > until:
            break
        warm = min(1.0, (step + 1) / plan.warmup_steps)
        decay = 1.0 if clock_start is None else max(0.0, (until - now) / (until - clock_start))
        ids = batch_indices(step, len(dataset), plan.train_batch, 0)
        state, result = fns.train_step(state, frozen, training.batch(dataset, ids), np.float32(warm * decay))
        interval.append(result)
        tokens += int(np.minimum(dataset.lengths[ids], seq_len).sum())
        step += 1
        if clock_start is None:  # the first step compiles: the schedule's clock starts after it
            jax.block_until_ready(state)
            clock_start, first_step_s = time.time(), time.time() - start
        if step % plan.log_every == 0:
            log.append({"step": step, "seconds": round(time.time() - start, 1), **summarize(jax.device_get(interval))})
            interval = []
            say(f"train step {step}: {log[-1]}")
        if time.time() - last_export >= plan.export_every_s:
            export_head(out, dcfg, state["params"], d2t)
            last_export = time.time()
            record(out, "train", train_record(plan, dataset, seq_len, step, tokens, start, clock_start, first_step_s, mark, log))
    export_head(out, dcfg, state["params"], d2t)
    record(out, "train", train_record(plan, dataset, seq_len, step, tokens, start, clock_start, first_step_s, mark, log))
    say(f"trained {step} steps on {tokens} tokens; head in {os.path.join(out, HEAD_DIR)}")


def train_record(plan, dataset, seq_len, step, tokens, start, clock_start, first_step_s, mark, log) -> dict:
    steady = time.time() - clock_start
    return {
        "samples": len(dataset), "sample_tokens": int(dataset.offsets[-1]), "seq_len": seq_len, "batch": plan.train_batch,
        "ttt_steps": plan.ttt_steps, "lr": plan.lr, "steps": step, "tokens": tokens, "epochs": round(tokens / max(int(dataset.offsets[-1]), 1), 3),
        "seconds": round(time.time() - start, 2), "first_step_s": round(first_step_s, 2),
        "steady_tokens_per_s": round(tokens * (step - 1) / step / steady, 1) if step > 1 and steady > 0 else None,
        "log": log, **Compiles.since(mark),
    }


def tau_trees(plan: Plan) -> list[TreeConfig]:
    tuned = load_tuned_tree(default_head_dir(DEFAULT_MODEL))
    return ([tuned.tree] if tuned else []) + list(plan.tau_trees)


def measure_tau(plan: Plan, kit: Kit, target: TargetModel, heads: dict, until: float, out: str) -> None:
    """tau of each head on the dev prompts, batch 1, greedy, float32, per tree (one compile per tree:
    the heads are arguments of the same executable)."""
    prompts = kit.tau_prompts(plan)
    width = padded_width(prompts)
    trees = tau_trees(plan)
    cache_len = width + plan.tau_new_tokens
    rows, mark = [], Compiles.mark()
    for tree in trees:
        for name, (dcfg, dparams) in heads.items():
            if time.time() > until:
                break
            new = rounds = 0
            for prompt in prompts:
                tokens, lengths = pad_prompts([prompt], multiple=width)
                result = generate_spec_jit(target.params, target.cfg, dparams, dcfg, tokens, lengths, jax.random.key(0),
                                           max_new_tokens=plan.tau_new_tokens, cache_len=cache_len, tree=tree, stop_ids=kit.stop_ids)
                new += int(result.num_tokens[0]) - 1
                rounds += int(result.rounds[0])
            rows.append({"head": name, "tree": dataclasses.asdict(tree), "tau": round(new / rounds, 4), "prompts": len(prompts)})
            say(f"tau {name} {tree}: {rows[-1]['tau']}")
            record(out, "tau", {"dtype": "float32", "new_tokens": plan.tau_new_tokens, "rows": rows, **Compiles.since(mark)})


def phase_distill(plan: Plan, kit: Kit, out: str, until: float, distill_until: float, tau_s: float) -> None:
    target = on_xla(load_target(kit.gguf, dtype=jnp.float32, with_tokenizer=False, layers=plan.layers))
    working = cast(target, "bfloat16") if jax.devices()[0].platform != "cpu" else target  # bf16 where it is fast
    samples = distill(plan, kit, working, distill_until, out)
    if not samples:
        return
    train_head(plan, kit, working, samples, until - tau_s, out)
    trained = load_draft(os.path.join(out, HEAD_DIR), target.cfg, dtype=jnp.float32)  # as exported, in bfloat16
    heads = {"shipped": on_xla(target, head("float32", target.cfg))[1], "trained": on_xla(target, trained)[1]}
    measure_tau(plan, kit, target, heads, until, out)


# --- compile times, without running (measured on CPU for the note; Pallas rows need a GPU) ------

def phase_compile(plan: Plan, kit: Kit, out: str, until: float) -> None:
    """Compile every executable the phases would, with their shapes, and time each compile: what
    a fresh machine spends before it measures or trains anything."""
    target = load_target(kit.gguf, dtype=jnp.float32, with_tokenizer=False, layers=plan.layers)
    targets = {"float32": target, "bfloat16": cast(target, "bfloat16")}
    heads = {dtype: head(dtype, target.cfg) for dtype in targets}
    working = on_xla(targets["bfloat16" if jax.devices()[0].platform != "cpu" else "float32"])
    rows, width = [], kit.width
    generate_width, tau_width = padded_width(kit.generate_prompts(plan)), padded_width(kit.tau_prompts(plan))

    def timed(phase: str, what: str, compile_fn) -> None:
        if time.time() > until:
            rows.append({"phase": phase, "what": what, "skipped": True})
            return
        mark = Compiles.mark()
        start = time.time()
        compile_fn()
        rows.append({"phase": phase, "what": what, "seconds": round(time.time() - start, 2), **Compiles.since(mark)})
        say(f"compile {phase} {what}: {rows[-1]}")
        record(out, "compile", {"platform": jax.devices()[0].platform, "rows": rows})

    engines = {}
    for row in plan.rows:
        if row.attention == "pallas" and jax.devices()[0].platform == "cpu":
            continue
        key = (row.dtype, row.attention, row.batch)
        if key not in engines:
            engines[key] = Engine(targets[row.dtype], draft=heads[row.dtype], max_new_tokens=plan.generate_new_tokens,
                                  cache_len=generate_width + plan.generate_new_tokens, attention=row.attention, layers=plan.layers)
            timed("generate", f"plain {row.dtype}/{row.attention}/b{row.batch}",
                  lambda: engines[key].compile(None, row.batch, generate_width))
        timed("generate", f"spec {row.name}", lambda: engines[key].compile(row.tree, row.batch, generate_width))
    shapes = np.zeros((plan.distill_batch, width), np.int32), np.ones(plan.distill_batch, np.int32)
    n = plan.distill_new_tokens
    timed("distill", f"plain b{plan.distill_batch}", lambda: generate_ar_jit.lower(
        working.params, working.cfg, *shapes, jax.random.key(0), max_new_tokens=n, cache_len=width + n, stop_ids=kit.stop_ids).compile())

    def train_step():
        training = Training.of_shipped_head(plan, working, width + n)
        dataset = TokenizedSet.from_samples([(np.ones(width + n, np.int32), np.ones(width + n, bool))])
        batch = training.batch(dataset, np.zeros(plan.train_batch, np.int64))
        training.fns.train_step.lower(training.state, training.frozen, batch, np.float32(1)).compile()

    timed("train", f"train step b{plan.train_batch} x {width + n}, {plan.ttt_steps} TTT steps", train_step)
    for tree in tau_trees(plan):
        timed("tau", f"spec float32 b1 {tree}", lambda: generate_spec_jit.lower(
            target.params, target.cfg, heads["float32"][1], heads["float32"][0], np.zeros((1, tau_width), np.int32), np.ones(1, np.int32),
            jax.random.key(0), max_new_tokens=plan.tau_new_tokens, cache_len=tau_width + plan.tau_new_tokens, tree=tree,
            stop_ids=kit.stop_ids).compile())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("env", "generate", "distill", "compile"))
    parser.add_argument("--kit", required=True, help="the assembled kit directory (model/, prompts.npz)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--until", type=float, required=True, help="unix time by which the phase must be done")
    parser.add_argument("--distill-until", type=float, help="distill: unix time at which answering stops and training starts")
    parser.add_argument("--tau-s", type=float, default=60.0, help="distill: seconds kept for the tau measurement")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU)")
    args = parser.parse_args()
    plan = SMOKE if args.smoke else FULL
    Compiles.install()
    kit = Kit.open(args.kit)
    os.makedirs(args.out, exist_ok=True)
    if args.phase == "env":
        phase_env(plan, kit, args.out, args.until)
    elif args.phase == "generate":
        phase_generate(plan, kit, args.out, args.until)
    elif args.phase == "compile":
        phase_compile(FULL, kit, args.out, args.until)
    else:
        phase_distill(plan, kit, args.out, args.until, args.distill_until or args.until, args.tau_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
