"""Training metrics: per-TTT-step accuracy and loss, a JSON-lines log, a tqdm bar, curves.

Each log line is a JSON object with "step" (optimizer updates done), "split" ("train" or "dev"),
"acc" and "step_loss" (lists, one entry per TTT step: top-1 agreement with the target's choice,
and the loss per trained token). Train records add "loss" (the objective, mean over the batches
since the last record), "lr" and "tokens_per_s"; dev records add what the eval hooks return.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence

import numpy as np
from tqdm import tqdm

from eagle_jax.draft.config import DraftConfig
from eagle_jax.files import atomic_path, write_jsonl_atomic
from eagle_jax.loading import TargetModel
from eagle_jax.train.data import TokenizedSet
from eagle_jax.train.losses import LossOutput


@dataclasses.dataclass(frozen=True)
class EvalContext:
    """What an eval hook sees at a dev evaluation: the head as exported, and the frozen target."""

    step: int
    dcfg: DraftConfig
    draft_params: dict  # numpy arrays in the eagle_jax.draft.model layout, d2t included (what `export_draft` takes)
    target: TargetModel
    dev: TokenizedSet  # the held-out samples


EvalHook = Callable[[EvalContext], dict[str, float]]  # e.g. tau from speculative generate on dev prompts


def summarize(outputs: Sequence[LossOutput]) -> dict[str, object]:
    """Mean loss and per-step acc / step_loss over several batches' LossOutputs (host numpy)."""
    correct = np.sum([o.correct for o in outputs], axis=0)
    count = np.maximum(np.sum([o.count for o in outputs], axis=0), 1)
    token_loss = np.sum([o.token_loss for o in outputs], axis=0)
    return {
        "loss": float(np.mean([o.loss for o in outputs])),
        "acc": [round(float(x), 5) for x in correct / count],
        "step_loss": [round(float(x), 5) for x in token_loss / count],
    }


class MetricsLog:
    """Append-only JSON lines at `path`, written by process 0 only."""

    def __init__(self, path: str, enabled: bool):
        self.path, self.enabled = path, enabled

    def drop_after(self, step: int) -> None:
        """On resume: forget records of steps after the restored checkpoint (they will be redone)."""
        if not self.enabled or not os.path.exists(self.path):
            return
        write_jsonl_atomic(self.path, [r for r in self.read(self.path) if r["step"] <= step])

    def write(self, record: dict) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    @staticmethod
    def read(path: str) -> list[dict]:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]


class Progress:
    """tqdm bar over optimizer steps: loss, accuracy of each TTT step, tokens/s, ETA."""

    def __init__(self, total: int, initial: int, enabled: bool):
        self.bar = tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True)

    def update(self, steps: int, record: dict | None) -> None:
        if record is not None:
            acc = "/".join(f"{a:.2f}" for a in record["acc"])
            self.bar.set_postfix_str(f"loss={record['loss']:.4f} acc={acc} tok/s={record['tokens_per_s']:.0f}", refresh=False)
        self.bar.update(steps)

    def write(self, text: str) -> None:
        self.bar.write(text)

    def close(self) -> None:
        self.bar.close()


def plot_curves(log_path: str, png_path: str) -> None:
    """Train loss, and train/dev accuracy of each TTT step, against optimizer steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = MetricsLog.read(log_path)
    train = [r for r in records if r["split"] == "train"]
    dev = [r for r in records if r["split"] == "dev"]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train objective")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    num_steps = len(train[-1]["acc"]) if train else 0
    for k in range(num_steps):
        line = ax_acc.plot([r["step"] for r in train], [r["acc"][k] for r in train], alpha=0.5, label=f"train step {k}")[0]
        if dev:
            ax_acc.plot([r["step"] for r in dev], [r["acc"][k] for r in dev], "o-", color=line.get_color(), label=f"dev step {k}")
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("top-1 accuracy vs target")
    ax_acc.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    with atomic_path(png_path, suffix=".png") as tmp:  # savefig picks the format from the extension
        fig.savefig(tmp, dpi=100)
    plt.close(fig)
