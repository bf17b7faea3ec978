"""The inputs of a training run: settings, output directory, draft config, data, vocabulary, features.

Output directory (shared by all processes of a multi-host run):
  train_config.json   the run's settings, written once its inputs are known to be good;
                      --resume refuses different ones, a new run refuses a directory that has one
  data/               tokenized train/dev sets and their statistics
  vocab.npz           the draft vocabulary (EAGLE-3 with a reduced vocabulary)
  features/           offline target features (--offline-features)
  regenerated/        self-distilled conversations (--regenerate)
  checkpoints/        orbax checkpoints, one per saved optimizer step
  metrics.jsonl, curves.png, draft/ (the exported head, loadable by `eagle-jax generate --draft`)
Cached inputs are reused only by --resume; a new run recomputes them.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
from jax.sharding import Mesh

from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.draft.config import DraftConfig
from eagle_jax.draft.model import init_draft_params
from eagle_jax.errors import EagleError
from eagle_jax.files import read_json, write_json_atomic
from eagle_jax.loading import TargetModel
from eagle_jax.train import data as data_lib
from eagle_jax import errors, mesh as mesh_lib
from eagle_jax.train.features import FeatureStore, build_feature_store, compute_target_features, pack
from eagle_jax.train.regenerate import regenerate_conversations
from eagle_jax.train.vocab import DraftVocab, carry_over_rows, select_draft_vocab, used_ids

DEFAULT_DRAFT_VOCAB = 32000  # the EAGLE-3 reference's, capped at the target's vocabulary
DTYPES = ("float32", "bfloat16")
CONFIG_FILE = "train_config.json"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: str
    data: str
    out: str
    chat_template: str | None = None  # a Jinja file replacing (or giving) the tokenizer's template
    head: str = "eagle3"
    ttt_steps: int = 7  # EAGLE-3 unrolled steps (the reference's `length`); eagle1: 1
    fc_norm: bool = False
    norm_output: bool = False
    draft_vocab: int | None = None  # None: DEFAULT_DRAFT_VOCAB (eagle3), the target's (eagle1)
    seq_len: int = 2048
    batch_size: int = 2  # global, in sequences per micro-batch: at --seq-len 2048 a 24 GB machine holds it with room
    max_steps: int | None = None  # optimizer updates; None: `epochs` passes over the training set
    epochs: int = 1
    lr: float = 5e-5
    warmup_steps: int | None = None  # None: 5% of the updates
    schedule: str = "linear"
    clip_norm: float = 0.5
    weight_decay: float = 0.0
    grad_accum: int = 4  # 8 sequences per update
    dtype: str = "float32"  # compute dtype of target and draft (master weights stay float32)
    offline_features: bool = False
    feature_dtype: str | None = None  # offline store dtype; None: `dtype`
    num_conversations: int | None = None
    dev_fraction: float = 0.05
    long_samples: str = "drop"
    regenerate: bool = False
    regen_max_new_tokens: int = 512
    regen_batch_size: int = 8
    regen_keep_turns: int = 0  # the first K assistant answers stay as given (already the target's own)
    init_head: str | None = None  # start from this head's weights, architecture and draft vocabulary
    revocab: bool = False  # with init_head: pick the draft vocabulary from the data, carrying the head's rows over
    seed: int = 0
    # Operational settings: free to change between an interrupted run and its --resume.
    resume: bool = False
    fsdp: int = 1
    eval_every: int = 100
    save_every: int = 100
    log_every: int = 10
    keep: int = 3
    progress: bool = True
    max_shard_bytes: int | None = None  # export the head in safetensors shards of at most this size; None: one file

    OPERATIONAL = ("out", "resume", "fsdp", "eval_every", "save_every", "log_every", "keep", "progress", "max_shard_bytes")

    def __post_init__(self):
        if self.dtype not in DTYPES or (self.feature_dtype or self.dtype) not in DTYPES:
            raise EagleError(f"--dtype and --feature-dtype must be one of {', '.join(DTYPES)}")
        if self.seq_len < 4 or self.batch_size < 1 or self.ttt_steps < 1 or self.epochs < 1:
            raise EagleError("--seq-len must be >= 4; --batch-size, --ttt-steps and --epochs >= 1")
        if min(self.eval_every, self.save_every, self.log_every, self.keep) < 1:
            raise EagleError("--eval-every, --save-every, --log-every and --keep must be >= 1")
        if self.regen_keep_turns < 0 or (self.regen_keep_turns and not self.regenerate):
            raise EagleError("--regen-keep-turns must be >= 0, and applies only with --regenerate")
        if self.revocab and not self.init_head:
            raise EagleError("--revocab picks a new draft vocabulary for the head given by --init-head; pass one")

    def fingerprint(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in self.OPERATIONAL}


def say(text: str) -> None:
    if jax.process_index() == 0:
        print(text, flush=True)


def warn(text: str) -> None:
    if jax.process_index() == 0:
        errors.warn(text)


def check_out_dir(cfg: TrainConfig) -> None:
    """A new run needs a directory without a run; --resume needs the settings of the run it continues."""
    config_path = os.path.join(cfg.out, CONFIG_FILE)
    if not cfg.resume:
        if os.path.exists(config_path):
            raise EagleError(f"{cfg.out} already holds a training run; pass --resume to continue it or choose another --out")
        return
    if not os.path.exists(config_path):
        raise EagleError(f"--resume: {cfg.out} holds no training run (no {CONFIG_FILE})")
    saved = read_json(config_path, what="the settings of a training run")
    now = cfg.fingerprint()
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}  # settings newer than the saved run
    changed = sorted(k for k in set(saved) | set(now) if saved.get(k, defaults.get(k)) != now.get(k))
    if changed:
        diffs = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise EagleError(f"--resume: settings differ from the run in {cfg.out} ({diffs}); use the original ones or a new --out")


def write_run_config(cfg: TrainConfig) -> None:
    mesh_lib.on_main_process(lambda: write_json_atomic(os.path.join(cfg.out, CONFIG_FILE), cfg.fingerprint()), "run-config")


def check_draft_vocab(size: int, target_vocab_size: int) -> None:
    if not 0 < size <= target_vocab_size:
        raise EagleError(f"--draft-vocab must be in [1, {target_vocab_size}] (the target's vocabulary), got {size}")


def draft_config(cfg: TrainConfig, target: TargetModel) -> DraftConfig:
    vocab = target.cfg.vocab_size
    if cfg.head == "eagle1":
        if cfg.draft_vocab not in (None, vocab):
            raise EagleError(f"an eagle1 head predicts over the target's full vocabulary ({vocab}); drop --draft-vocab")
        if cfg.ttt_steps != 1:
            raise EagleError("an eagle1 head trains one step (no training-time test); pass --ttt-steps 1 or --head eagle3")
        draft_vocab = vocab
    else:
        draft_vocab = min(DEFAULT_DRAFT_VOCAB, vocab) if cfg.draft_vocab is None else cfg.draft_vocab
    check_draft_vocab(draft_vocab, vocab)
    try:
        dcfg = DraftConfig.for_target(target.cfg, cfg.head, draft_vocab, fc_norm=cfg.fc_norm, norm_output=cfg.norm_output)
        dcfg.check_target(target.cfg)
    except EagleError as e:
        raise EagleError(f"--head {cfg.head} does not fit {cfg.model}: {e}") from None
    return dcfg


def load_initial_head(cfg: TrainConfig, target: TargetModel) -> tuple[DraftConfig, dict, np.ndarray | None]:
    """--init-head: (config, float32 trainable params, d2t or None) of the head to continue training.

    The head fixes the architecture and the draft vocabulary (with --revocab, the vocabulary is picked
    anew, of --draft-vocab's size if given); head flags given as well must agree, and its weights must
    have exactly the layout the trainer builds. Checked before anything is written."""
    dcfg, params = load_draft(cfg.init_head, target.cfg)
    given = {"--head": (cfg.head, dcfg.kind), "--draft-vocab": (None if cfg.revocab else cfg.draft_vocab, dcfg.draft_vocab_size),
             "--fc-norm": (cfg.fc_norm or None, dcfg.fc_norm), "--norm-output": (cfg.norm_output or None, dcfg.norm_output)}
    clashes = [f"{flag} {mine} (the head: {theirs})" for flag, (mine, theirs) in given.items() if mine is not None and mine != theirs]
    if clashes:
        raise EagleError(f"--init-head {cfg.init_head} does not match {', '.join(clashes)}; pass head flags that match the head, or none")
    if dcfg.kind == "eagle1" and cfg.ttt_steps != 1:
        raise EagleError("an eagle1 head trains one step (no training-time test); pass --ttt-steps 1")
    if cfg.revocab and dcfg.kind != "eagle3":
        raise EagleError(f"--revocab: the {dcfg.kind} head predicts over the target's full vocabulary; it has no draft vocabulary to pick")
    d2t = params.pop("d2t", None)
    expected = jax.eval_shape(lambda: init_draft_params(jax.random.key(0), dcfg))
    expected.pop("d2t", None)
    shapes = lambda tree: jax.tree.map(lambda x: tuple(x.shape), tree)  # noqa: E731
    if shapes(params) != shapes(expected):
        raise EagleError(f"--init-head {cfg.init_head}: its weights do not have the layout this trainer builds (extra or missing tensors)")
    if cfg.revocab and cfg.draft_vocab is not None:
        check_draft_vocab(cfg.draft_vocab, target.cfg.vocab_size)
        dcfg = dataclasses.replace(dcfg, draft_vocab_size=cfg.draft_vocab)
    return dcfg, jax.tree.map(lambda x: np.asarray(x, np.float32), params), None if d2t is None else np.asarray(d2t)


def prepare_data(cfg: TrainConfig, target: TargetModel) -> tuple[data_lib.TokenizedSet, data_lib.TokenizedSet]:
    """Tokenized (train, dev) sets under out/data. Every process computes the same sets (they are
    deterministic), so bad input fails everywhere at once; process 0 writes them."""
    data_dir = os.path.join(cfg.out, "data")
    train_path, dev_path = os.path.join(data_dir, "train.npz"), os.path.join(data_dir, "dev.npz")
    if cfg.resume and os.path.exists(train_path) and os.path.exists(dev_path):
        return data_lib.TokenizedSet.load(train_path), data_lib.TokenizedSet.load(dev_path)
    if target.tokenizer is None or not target.tokenizer.chat_template:
        raise EagleError(f"{target.source}: the model has no chat template to render conversations with (a base model): "
                         "pass one with --chat-template FILE (data/templates/gemma.jinja for Gemma)")
    conversations, stats = data_lib.load_conversations(cfg.data, cfg.num_conversations)
    if cfg.regenerate:
        conversations = regenerate_conversations(
            conversations, target, os.path.join(cfg.out, "regenerated"), cfg.regen_max_new_tokens, cfg.regen_batch_size, cfg.seq_len,
            cfg.regen_keep_turns, progress=cfg.progress,
        )
        stats["regenerated"] = len(conversations)
    train_convs, dev_convs = data_lib.split_dev(conversations, cfg.dev_fraction, cfg.seed)
    train, train_stats = data_lib.tokenize_conversations(train_convs, target.tokenizer, target.stop_ids, cfg.seq_len, cfg.long_samples)
    dev, dev_stats = data_lib.tokenize_conversations(dev_convs, target.tokenizer, target.stop_ids, cfg.seq_len, cfg.long_samples)
    if not len(train):
        raise EagleError(f"no training sample left from {cfg.data} ({dict(train_stats)}); check --seq-len and the data")
    summary = {"read": dict(stats), "train": dict(train_stats), "dev": dict(dev_stats)}
    say(f"data: {json.dumps(summary)}")

    def save():
        os.makedirs(data_dir, exist_ok=True)
        train.save(train_path)
        dev.save(dev_path)
        write_json_atomic(os.path.join(data_dir, "stats.json"), summary)

    mesh_lib.on_main_process(save, "data")
    return train, dev


def revocab_initial_head(initial: dict, initial_d2t: np.ndarray, vocab: DraftVocab, target: TargetModel) -> dict:
    """--revocab: the head's params with its lm_head moved onto the newly picked vocabulary."""
    target_rows = np.asarray(target.params.get("lm_head", target.params["embed"]), np.float32)  # (V, dt)
    return initial | {"lm_head": carry_over_rows(initial["lm_head"], used_ids(initial_d2t), vocab.used, target_rows)}


def prepare_vocab(cfg: TrainConfig, dcfg: DraftConfig, train: data_lib.TokenizedSet, d2t: np.ndarray | None = None) -> DraftVocab | None:
    """The reduced draft vocabulary (None when the draft predicts over the target's vocabulary):
    the one `d2t` (Vd,) of the head training starts from, or (--revocab, or no initial head) the most
    frequent assistant tokens, ties and unseen slots going to the initial head's tokens first."""
    if not dcfg.maps_vocab:
        return None
    path = os.path.join(cfg.out, "vocab.npz")
    if cfg.resume and os.path.exists(path):
        return DraftVocab.load(path)
    if d2t is not None and not cfg.revocab:
        vocab = DraftVocab.from_used(used_ids(d2t), train.tokens, train.loss_mask, dcfg.target_vocab_size)
    else:
        preferred = used_ids(d2t) if d2t is not None else ()
        vocab = select_draft_vocab(train.tokens, train.loss_mask, dcfg.target_vocab_size, dcfg.draft_vocab_size, preferred)
    say(f"draft vocabulary: {dcfg.draft_vocab_size} of {dcfg.target_vocab_size} target ids cover {vocab.coverage:.2%} of assistant tokens")
    mesh_lib.on_main_process(lambda: vocab.save(path), "vocab")
    return vocab


def prepare_offline_features(
    cfg: TrainConfig, dcfg: DraftConfig, target: TargetModel, target_params: dict, target_shardings: dict, mesh: Mesh,
    train: data_lib.TokenizedSet, dev: data_lib.TokenizedSet,
) -> tuple[FeatureStore, FeatureStore]:
    """(train, dev) feature stores under out/features, computed by the sharded target."""
    store_dtype = cfg.feature_dtype or cfg.dtype
    vectors = len(dcfg.feature_layers) + 1
    batch_sharding = mesh_lib.batch_sharding(mesh)
    features_fn = jax.jit(
        lambda params, tokens: pack(compute_target_features(params, target.cfg, dcfg, tokens)).astype(store_dtype),
        in_shardings=(target_shardings, batch_sharding), out_shardings=batch_sharding,
    )
    directory = os.path.join(cfg.out, "features")
    os.makedirs(directory, exist_ok=True)
    stores = tuple(
        build_feature_store(os.path.join(directory, name), dataset, features_fn, target_params, mesh, cfg.batch_size,
                            cfg.seq_len, vectors, target.cfg.hidden_size, store_dtype, reuse=cfg.resume)
        for name, dataset in (("train", train), ("dev", dev))
    )
    tokens = int(train.offsets[-1] + dev.offsets[-1])
    say(f"offline features: {tokens} tokens x {vectors} x {target.cfg.hidden_size} ({store_dtype}) in {directory}")
    return stores
