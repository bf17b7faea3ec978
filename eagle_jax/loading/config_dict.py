"""A model's or head's config.json as it is read: every key accounted for (interpreted, checked, or
known to be harmless) and every value of the type it must have, else one error line naming it."""

from __future__ import annotations

import json
import math

from eagle_jax.errors import EagleError

REQUIRED = object()  # the default of a key that must be given
MAX_ID = 2**31 - 1  # token ids and sizes travel as int32

# transformers' PretrainedConfig attributes that no model computes with: provenance, remote-code
# class names (auto_map: we never run a repo's code) and dtype,
# special token ids (read where they matter), output switches, task labels and generation defaults.
PRETRAINED_CONFIG_KEYS = frozenset({
    "_name_or_path", "name_or_path", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "_attn_implementation", "_attn_implementation_autoset", "attn_implementation", "use_bfloat16",
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
    "tie_encoder_decoder", "pruned_heads", "id2label", "label2id", "problem_type", "finetuning_task",
    "tokenizer_class", "prefix", "task_specific_params", "tf_legacy_loss", "max_length", "min_length",
    "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature",
    "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
})


def is_integer(value) -> bool:
    """A JSON integer: true and false are bools, not integers."""
    return isinstance(value, int) and not isinstance(value, bool)


class ConfigDict:
    """config.json's object; `where` names it in errors ("DIR/config.json")."""

    def __init__(self, values, where: str):
        if not isinstance(values, dict):
            raise EagleError(f"{where}: expected a JSON object, got {type(values).__name__}")
        self.values, self.where, self.read = values, where, set()

    def get(self, key: str, default=None):
        """The value of key as given, or default when it is absent or null."""
        self.read.add(key)
        value = self.values.get(key)
        return default if value is None else value

    def refuse(self, key: str, expected: str) -> EagleError:
        given = json.dumps(self.values[key]) if key in self.values else "missing"
        return EagleError(f"{self.where}: {key} is {given}; expected {expected}")

    def expect(self, key: str, supported, default):
        """Refuse any value of a flag other than the one we implement."""
        value = self.get(key, default)
        if value != supported:
            raise EagleError(f"{self.where}: {key}={json.dumps(value)} is not supported (eagle-jax implements {json.dumps(supported)})")

    def integer(self, key: str, default=REQUIRED, minimum: int = 1) -> int:
        """An integer in [minimum, 2**31) (true/false are not integers)."""
        value = self.get(key)
        if value is None and default is not REQUIRED:
            return default
        if not is_integer(value) or not minimum <= value <= MAX_ID:
            raise self.refuse(key, f"an integer from {minimum} to {MAX_ID}")
        return value

    def number(self, key: str, default: float) -> float:
        """A finite positive number."""
        value = self.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
            raise self.refuse(key, "a finite positive number")
        return float(value)

    def flag(self, key: str, default: bool | None) -> bool | None:
        value = self.get(key, default)
        if value is not default and not isinstance(value, bool):
            raise self.refuse(key, "true or false")
        return value

    def token_ids(self, key: str, vocab_size: int) -> tuple[int, ...]:
        """A token id or a list of them, each below vocab_size."""
        value = self.get(key, [])
        ids = value if isinstance(value, list) else [value]
        if not all(is_integer(i) and 0 <= i < vocab_size for i in ids):
            raise self.refuse(key, f"a token id or a list of token ids, each from 0 to {vocab_size - 1}")
        return tuple(ids)

    def indices(self, key: str) -> list[int] | None:
        """A list of non-negative integers, or None when absent."""
        value = self.get(key)
        if value is not None and not (isinstance(value, list) and all(is_integer(i) and 0 <= i <= MAX_ID for i in value)):
            raise self.refuse(key, "a list of indices")
        return value

    def refuse_unknown(self, harmless: frozenset) -> None:
        unknown = sorted(set(self.values) - self.read - harmless)
        if unknown:
            raise EagleError(
                f"{self.where}: unknown config key(s) {', '.join(unknown)}; they may change the model, "
                "so eagle-jax refuses to guess"
            )
