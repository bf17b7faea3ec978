"""The training loop: sharded jitted steps, periodic dev evaluation, orbax checkpoints, export.

The global batch of micro-step s is `data.batch_indices(s, ...)`, a pure function of s, so a resumed
run continues with exactly the data the interrupted one would have seen.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from eagle_jax.model import transformer as target_model
from eagle_jax.draft.checkpoint import check_shard_size, export_draft
from eagle_jax.files import remove_leftovers
from eagle_jax.draft.config import DraftConfig
from eagle_jax.draft.model import init_draft_params, project_features
from eagle_jax.errors import EagleError
from eagle_jax.loading import TargetModel, load_target
from eagle_jax import mesh as mesh_lib
from eagle_jax.model.sharding import fsdp_shardings
from eagle_jax.train.checkpoint import Checkpointer, abstract_like
from eagle_jax.train.data import TokenizedSet, batch_indices
from eagle_jax.train.features import FeatureStore, compute_target_features, unpack
from eagle_jax.train.losses import LossOutput, eagle1_loss, eagle3_combine, eagle3_step_terms, restrict_to_draft_vocab
from eagle_jax.train.metrics import EvalContext, EvalHook, MetricsLog, Progress, plot_curves, summarize
from eagle_jax.train.optim import OptimConfig, learning_rate, make_optimizer
from eagle_jax.train.setup import (
    TrainConfig, check_out_dir, draft_config, load_initial_head, prepare_data, prepare_offline_features, prepare_vocab, revocab_initial_head, say,
    warn, write_run_config,
)
from eagle_jax.train.ttt import unroll
from eagle_jax.train.vocab import DraftVocab

STOPPED_BY_SIGNAL = 143  # 128 + SIGTERM: the run saved a checkpoint and can be resumed


class Objective:
    """Loss of the draft head on one batch: target features (online, or read from the batch), the
    draft unrolled over the TTT steps, the EAGLE-1 or EAGLE-3 loss."""

    def __init__(self, tcfg, dcfg: DraftConfig, num_steps: int, compute_dtype):
        self.tcfg, self.dcfg, self.num_steps, self.compute_dtype = tcfg, dcfg, num_steps, compute_dtype

    def __call__(self, params: dict, frozen: dict, batch: dict) -> tuple[jax.Array, LossOutput]:
        """params: the trainable head; frozen: {"target": target params, ["used": (Vd,) draft vocab]};
        batch: tokens (B, L) int32, loss_mask (B, L) bool, [features (B, L, n, dt)]."""
        dparams = jax.tree.map(lambda x: x.astype(self.compute_dtype), params)
        target = frozen["target"]
        if "features" in batch:
            feats = unpack(batch["features"].astype(self.compute_dtype))
        else:
            feats = compute_target_features(target, self.tcfg, self.dcfg, batch["tokens"])
        target_logits = target_model.lm_head(target, feats.hidden)  # (B, L, V) float32
        hidden = project_features(dparams, self.dcfg, feats.as_forward_output())
        mask = batch["loss_mask"]
        if self.dcfg.kind == "eagle1":
            step = unroll(dparams, self.dcfg, target, hidden, batch["tokens"], self.num_steps)[0]
            out = eagle1_loss(step.hidden, step.logits, feats.hidden, target_logits, mask)
        else:
            teacher, in_vocab = restrict_to_draft_vocab(target_logits, frozen.get("used"))
            terms = unroll(dparams, self.dcfg, target, hidden, batch["tokens"], self.num_steps,
                           score=lambda k, logits: eagle3_step_terms(k, logits, teacher, in_vocab, mask))
            out = eagle3_combine(terms, mask.size)
        return out.loss, out


@dataclasses.dataclass
class StepFunctions:
    init_state: Callable  # (key, [initial params]) -> state {"params", "opt_state", "step" (micro-steps done)}
    train_step: Callable  # (state, frozen, batch[, scale]) -> (state, LossOutput); donates state
    eval_step: Callable  # (params, frozen, batch) -> LossOutput
    abstract_state: dict
    state_shardings: dict


def make_step_functions(
    objective: Objective, optimizer: optax.GradientTransformation, dcfg: DraftConfig, mesh: Mesh,
    frozen_shardings: dict, batch_keys: Sequence[str], key: jax.Array, scaled_updates: bool = False,
) -> StepFunctions:
    """The jitted init / train / eval functions with params and optimizer state sharded over the mesh.
    scaled_updates: train_step takes a 4th argument, a () float32 factor on the optimizer's updates,
    for schedules the host sets as it goes (one run against a wall-clock budget)."""

    def init_state(key, initial=None):  # initial: params to start from (an earlier head), else random
        params = init_draft_params(key, dcfg) if initial is None else initial
        params.pop("d2t", None)  # eagle3: fixed by the vocabulary, not trained
        return {"params": params, "opt_state": optimizer.init(params), "step": jnp.zeros((), jnp.int32)}

    def train_step(state, frozen, batch, scale=None):
        grads, out = jax.grad(objective, has_aux=True)(state["params"], frozen, batch)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        if scale is not None:
            updates = jax.tree.map(lambda u: (scale * u).astype(u.dtype), updates)
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state, "step": state["step"] + 1}, out

    abstract_state = jax.eval_shape(init_state, key)
    replicated = mesh_lib.replicated(mesh)
    state_shardings = {
        "params": fsdp_shardings(mesh, abstract_state["params"]),
        "opt_state": fsdp_shardings(mesh, abstract_state["opt_state"]),
        "step": replicated,
    }
    batch_shardings = {k: mesh_lib.batch_sharding(mesh) for k in batch_keys}
    return StepFunctions(
        init_state=jax.jit(init_state, out_shardings=state_shardings),
        train_step=jax.jit(train_step, in_shardings=(state_shardings, frozen_shardings, batch_shardings) + ((replicated,) if scaled_updates else ()),
                           out_shardings=(state_shardings, replicated), donate_argnums=0),
        eval_step=jax.jit(lambda params, frozen, batch: objective(params, frozen, batch)[1],
                          in_shardings=(state_shardings["params"], frozen_shardings, batch_shardings), out_shardings=replicated),
        abstract_state=abstract_state,
        state_shardings=state_shardings,
    )


class BatchLoader:
    """Global batches built from the rows this process's devices hold."""

    def __init__(self, mesh: Mesh, batch_size: int, seq_len: int):
        self.mesh, self.batch_size, self.seq_len = mesh, batch_size, seq_len
        self.rows = mesh_lib.local_rows(mesh, batch_size)

    def __call__(self, dataset: TokenizedSet, store: FeatureStore | None, sample_ids: np.ndarray, real: np.ndarray) -> dict:
        """sample_ids, real: (B,) the global batch's samples and which rows are real (padding rows get no loss)."""
        local_ids = sample_ids[self.rows]
        tokens, loss_mask, _ = dataset.rows(local_ids, self.seq_len)
        host = {"tokens": tokens, "loss_mask": loss_mask & real[self.rows][:, None]}
        if store is not None:
            host["features"] = store.rows(local_ids, self.seq_len)
        return {k: mesh_lib.global_batch(self.mesh, v, self.rows, self.batch_size) for k, v in host.items()}


class SigtermFlag:
    """Set by SIGTERM (preemption) while installed; the loop then saves and stops. Python delivers
    signals to the main thread only, so elsewhere (a notebook worker thread) it stays unset."""

    def __init__(self):
        self.raised, self.previous = False, None
        self.installed = threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self.installed:
            self.previous = signal.signal(signal.SIGTERM, self.handle)
        return self

    def handle(self, signum, frame):
        self.raised = True

    def __exit__(self, *exc):
        if self.installed:
            signal.signal(signal.SIGTERM, self.previous)


def frozen_inputs(
    cfg: TrainConfig, dcfg: DraftConfig, target: TargetModel, vocab: DraftVocab | None, mesh: Mesh, train_set: TokenizedSet, dev_set: TokenizedSet,
) -> tuple[dict, dict, tuple[FeatureStore | None, FeatureStore | None]]:
    """(frozen, its shardings, (train, dev) feature stores): online, the whole target; offline, the
    stores plus only what the step reads of the target (embedding, lm_head)."""
    target_shardings = fsdp_shardings(mesh, target.params)
    target_params = mesh_lib.place(target.params, target_shardings)
    stores = (None, None)
    if cfg.offline_features:
        stores = prepare_offline_features(cfg, dcfg, target, target_params, target_shardings, mesh, train_set, dev_set)
        target_params = {k: v for k, v in target_params.items() if k in ("embed", "lm_head")}
        target_shardings = {k: v for k, v in target_shardings.items() if k in target_params}
    frozen, frozen_shardings = {"target": target_params}, {"target": target_shardings}
    if vocab is not None:
        frozen["used"] = mesh_lib.place(vocab.used, mesh_lib.replicated(mesh))
        frozen_shardings["used"] = mesh_lib.replicated(mesh)
    return frozen, frozen_shardings, stores


def compile_train_step(fns: StepFunctions, frozen: dict, batch: dict, cfg: TrainConfig, dcfg: DraftConfig):
    """The train step compiled for the shapes of `batch`, refused (EagleError) before it runs when
    XLA's accounting of its memory exceeds a device's."""
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), batch)
    compiled = fns.train_step.lower(abstract_like(fns.abstract_state, fns.state_shardings), frozen, abstract).compile()
    need, memory = mesh_lib.compiled_bytes(compiled), mesh_lib.device_memory()
    if need is not None and need > memory:
        gib = 2**30
        raise EagleError(
            f"a training step of --batch-size {cfg.batch_size} x --seq-len {cfg.seq_len} x --ttt-steps {cfg.ttt_steps} "
            f"(draft vocabulary {dcfg.draft_vocab_size}) needs {need / gib:.1f} GiB per device, more than the {memory / gib:.1f} GiB "
            f"a device has; lower --batch-size (a larger --grad-accum keeps {cfg.batch_size * cfg.grad_accum} sequences per update), "
            "--seq-len or --ttt-steps")
    return compiled


def remove_run_leftovers(out: str) -> None:
    """What a run killed in an atomic write (an export, the tokenized data) left in `out`."""
    removed = [os.path.join(where, name) for where in (out, os.path.join(out, "data")) for name in remove_leftovers(where)]
    if removed:
        say(f"removed what an interrupted write left behind: {', '.join(removed)}")


def train(cfg: TrainConfig, eval_hooks: Sequence[EvalHook] = ()) -> int:
    """Run (or resume) training; returns 0 when done, STOPPED_BY_SIGNAL after a SIGTERM save.

    eval_hooks run at every dev evaluation and add their results to the dev record (e.g. tau).
    """
    check_out_dir(cfg)
    mesh = mesh_lib.training_mesh(cfg.fsdp)
    mesh_lib.check_batch_size(mesh, cfg.batch_size)
    compute_dtype = jnp.dtype(cfg.dtype)
    # unrolled: fsdp splits each layer's weights along their own largest axis
    target = load_target(cfg.model, dtype=compute_dtype, shardings=lambda _, params: fsdp_shardings(mesh, params), layers="unrolled",
                         chat_template=cfg.chat_template)
    dcfg, initial, initial_d2t = load_initial_head(cfg, target) if cfg.init_head else (draft_config(cfg, target), None, None)
    check_shard_size(dcfg, cfg.max_shard_bytes)
    os.makedirs(cfg.out, exist_ok=True)
    mesh_lib.on_main_process(lambda: remove_run_leftovers(cfg.out), "leftovers")
    train_set, dev_set = prepare_data(cfg, target)
    vocab = prepare_vocab(cfg, dcfg, train_set, initial_d2t)
    if cfg.revocab:
        initial = revocab_initial_head(initial, initial_d2t, vocab, target)
    steps_per_epoch = len(train_set) // (cfg.batch_size * cfg.grad_accum)
    if steps_per_epoch == 0:
        raise EagleError(f"{len(train_set)} training samples cannot fill one update of {cfg.batch_size} x {cfg.grad_accum} sequences")
    max_steps = cfg.max_steps or cfg.epochs * steps_per_epoch
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else max_steps // 20
    optim_cfg = OptimConfig(cfg.lr, max_steps, warmup, cfg.schedule, weight_decay=cfg.weight_decay, clip_norm=cfg.clip_norm, grad_accum=cfg.grad_accum)
    write_run_config(cfg)

    frozen, frozen_shardings, stores = frozen_inputs(cfg, dcfg, target, vocab, mesh, train_set, dev_set)
    key = jax.random.key(cfg.seed)
    batch_keys = ("tokens", "loss_mask") + (("features",) if cfg.offline_features else ())
    objective = Objective(target.cfg, dcfg, cfg.ttt_steps, compute_dtype)
    fns = make_step_functions(objective, make_optimizer(optim_cfg), dcfg, mesh, frozen_shardings, batch_keys, key)
    load_batch = BatchLoader(mesh, cfg.batch_size, cfg.seq_len)
    first_batch = load_batch(train_set, stores[0], batch_indices(0, len(train_set), cfg.batch_size, cfg.seed), np.ones(cfg.batch_size, bool))
    train_step = compile_train_step(fns, frozen, first_batch, cfg, dcfg)
    checkpointer = Checkpointer(os.path.join(cfg.out, "checkpoints"), cfg.keep)
    log = MetricsLog(os.path.join(cfg.out, "metrics.jsonl"), jax.process_index() == 0)

    def export_ready(params) -> dict:
        host = mesh_lib.to_host(params)
        host["d2t"] = vocab.d2t if vocab is not None else np.zeros(dcfg.draft_vocab_size, np.int32)
        return host

    def evaluate(step: int, params) -> None:
        if not len(dev_set):
            return
        outs = []
        for start in range(0, len(dev_set), cfg.batch_size):
            ids = np.arange(start, start + cfg.batch_size)
            real = ids < len(dev_set)
            outs.append(fns.eval_step(params, frozen, load_batch(dev_set, stores[1], np.where(real, ids, 0), real)))
        record = {"step": step, "split": "dev", **summarize(jax.device_get(outs))}
        del record["loss"]  # padding rows dilute the mean objective; acc and step_loss are exact
        if eval_hooks:
            context = EvalContext(step, dcfg, export_ready(params), target, dev_set)
            for hook in eval_hooks:
                record.update(hook(context))
        log.write(record)
        say(f"step {step} dev: " + json.dumps({k: v for k, v in record.items() if k not in ("step", "split")}))

    restored = checkpointer.restore_latest(abstract_like(fns.abstract_state, fns.state_shardings), warn) if cfg.resume else None
    if restored is not None:
        latest, state, meta = restored
        if meta.get("fingerprint") != cfg.fingerprint():
            raise EagleError(f"--resume: checkpoint {latest} in {cfg.out} was written by a run with other settings")
        log.drop_after(latest)
        say(f"resumed from step {latest} of {max_steps}")
    else:
        state = fns.init_state(key, initial)
        log.drop_after(-1)
        evaluate(0, state["params"])  # the untrained baseline
    micro = int(jax.device_get(state["step"]))
    step = micro // cfg.grad_accum

    progress = Progress(max_steps, step, cfg.progress and jax.process_index() == 0)
    schedule = learning_rate(optim_cfg)
    interval, interval_tokens, interval_start = [], 0, time.perf_counter()
    with SigtermFlag() as sigterm:
        while step < max_steps:
            for _ in range(cfg.grad_accum):
                ids = batch_indices(micro, len(train_set), cfg.batch_size, cfg.seed)
                state, out = train_step(state, frozen, load_batch(train_set, stores[0], ids, np.ones(len(ids), bool)))
                interval.append(out)
                interval_tokens += int(np.minimum(train_set.lengths[ids], cfg.seq_len).sum())
                micro += 1
            step += 1
            record = None
            if step % cfg.log_every == 0 or step == max_steps:
                done = summarize(jax.device_get(interval))  # waits for the interval's steps to finish
                now = time.perf_counter()
                record = {"step": step, "split": "train", **done, "lr": float(schedule(step - 1)),
                          "tokens_per_s": round(interval_tokens / (now - interval_start), 1)}
                log.write(record)
                interval, interval_tokens, interval_start = [], 0, now
            progress.update(1, record)
            paused = time.perf_counter()
            if step % cfg.eval_every == 0 or step == max_steps:
                evaluate(step, state["params"])
            stop = mesh_lib.any_process(sigterm.raised)
            if step % cfg.save_every == 0 or step == max_steps or stop:
                checkpointer.save(step, state, {"fingerprint": cfg.fingerprint(), "micro_step": micro})
            interval_start += time.perf_counter() - paused  # tokens/s counts training time only
            if stop:
                break
    progress.close()
    checkpointer.wait()
    checkpointer.close()
    if step < max_steps:
        say(f"stopped by SIGTERM after step {step}; checkpoint saved; continue with --resume")
        return STOPPED_BY_SIGNAL
    head = export_ready(state["params"])
    if jax.process_index() == 0:
        export_draft(os.path.join(cfg.out, "draft"), dcfg, head, max_shard_bytes=cfg.max_shard_bytes)
        if os.path.exists(log.path):
            plot_curves(log.path, os.path.join(cfg.out, "curves.png"))
    mesh_lib.barrier("exported")
    say(f"trained {step} steps; head exported to {os.path.join(cfg.out, 'draft')}")
    return 0
