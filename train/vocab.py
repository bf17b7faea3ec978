"""EAGLE-3 reduced draft vocabulary: the most frequent assistant tokens of the training set.

As the reference (`Model.scandata`): count the target ids at loss-mask positions, keep the
`size` most frequent, sort them by target id (`used`), then
    d2t[i] = used[i] - i          (target_id = draft_id + d2t[draft_id])
    t2d[v] = v in used            (bool over the target vocabulary)
Ties in frequency go to the preferred ids (with --revocab, the initial head's vocabulary, whose rows
are trained), then to the smaller id; so when fewer than `size` distinct tokens occur, the preferred
unseen ids and then the smallest unseen ids fill the vocabulary, which always has exactly `size`
entries.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from eagle_jax.files import read_npz, savez_atomic
from eagle_jax.errors import EagleError


@dataclasses.dataclass(frozen=True)
class DraftVocab:
    used: np.ndarray  # (Vd,) int32 target ids of the draft vocabulary, ascending
    target_vocab_size: int
    coverage: float  # fraction of the counted assistant tokens that are in the draft vocabulary

    @property
    def d2t(self) -> np.ndarray:  # (Vd,) int32
        return (self.used - np.arange(len(self.used))).astype(np.int32)

    @property
    def t2d(self) -> np.ndarray:  # (V,) bool
        mask = np.zeros(self.target_vocab_size, bool)
        mask[self.used] = True
        return mask

    def save(self, path: str) -> None:
        savez_atomic(path, used=self.used, target_vocab_size=self.target_vocab_size, coverage=self.coverage)

    @classmethod
    def from_used(cls, used: np.ndarray, tokens: np.ndarray, loss_mask: np.ndarray, target_vocab_size: int) -> "DraftVocab":
        """A given vocabulary `used` (Vd,), with its coverage of the tokens (N,) where loss_mask (N,) is set."""
        used = np.asarray(used, np.int32)
        if used.min() < 0 or used.max() >= target_vocab_size or np.any(np.diff(used) <= 0):
            raise EagleError(f"a draft vocabulary must list distinct target ids in [0, {target_vocab_size}) in ascending order")
        counted = tokens[loss_mask.astype(bool)]
        coverage = float(np.isin(counted, used).mean()) if counted.size else 0.0
        return cls(used, target_vocab_size, coverage)

    @classmethod
    def load(cls, path: str) -> "DraftVocab":
        f = read_npz(path, ("used", "target_vocab_size", "coverage"), "a draft vocabulary", "delete it to choose the vocabulary again")
        return cls(f["used"], int(f["target_vocab_size"]), float(f["coverage"]))


def select_draft_vocab(
    tokens: np.ndarray, loss_mask: np.ndarray, target_vocab_size: int, size: int, preferred: np.ndarray | tuple = (),
) -> DraftVocab:
    """The `size` most frequent target ids among tokens (N,) where loss_mask (N,) is set; equal counts
    go to the ids in `preferred` (any order) first, then to the smaller id."""
    if not 0 < size <= target_vocab_size:
        raise EagleError(f"draft vocabulary size must be in [1, {target_vocab_size}], got {size}")
    counts = np.bincount(tokens[loss_mask.astype(bool)], minlength=target_vocab_size)
    ids = np.arange(target_vocab_size)
    order = np.lexsort((ids, ~np.isin(ids, preferred), -counts))  # by count descending, preferred first, then id ascending
    return DraftVocab.from_used(np.sort(order[:size]), tokens, loss_mask, target_vocab_size)


def used_ids(d2t: np.ndarray) -> np.ndarray:
    """(Vd,) int32 target ids of a draft vocabulary from its offsets d2t (Vd,)."""
    return (np.arange(len(d2t)) + np.asarray(d2t)).astype(np.int32)


def carry_over_rows(lm_head: np.ndarray, old_used: np.ndarray, new_used: np.ndarray, target_rows: np.ndarray) -> np.ndarray:
    """A draft lm_head (Vd_old, d) over the vocabulary old_used (ascending target ids) -> (Vd_new, d)
    over new_used: a token in both keeps its row; a new one starts from its row of the target's
    lm_head, target_rows (V, dt), mapped into the draft's space by the least-squares fit (dt, d) of the
    shared tokens' target rows to their draft rows."""
    shared = np.isin(new_used, old_used)
    if not shared.any():
        raise EagleError("the new draft vocabulary shares no token with the head's; train a fresh head instead")
    kept = lm_head[np.searchsorted(old_used, new_used[shared])]
    fit, *_ = np.linalg.lstsq(target_rows[new_used[shared]].astype(np.float64), kept.astype(np.float64), rcond=None)
    rows = target_rows[new_used].astype(np.float64) @ fit
    rows[shared] = kept
    return rows.astype(lm_head.dtype)

