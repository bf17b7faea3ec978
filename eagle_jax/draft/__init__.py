"""Draft heads: EAGLE-1/2, EAGLE-3 and the EAGLE-3.1 options."""

from eagle_jax.draft.config import DraftConfig
from eagle_jax.draft.model import (
    DraftOutput,
    draft_forward,
    draft_to_target_ids,
    init_draft_params,
    make_draft_cache,
    project_features,
)

__all__ = ["DraftConfig", "DraftOutput", "draft_forward", "draft_to_target_ids", "init_draft_params", "make_draft_cache", "project_features"]
