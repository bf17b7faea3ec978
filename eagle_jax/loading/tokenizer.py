"""Tokenizers through transformers: from an HF directory, or built from a GGUF file's own vocabulary."""

from __future__ import annotations

from eagle_jax.errors import EagleError
from eagle_jax.loading.gguf_file import field

# llama.cpp pre-tokenizer names -> the split regex applied before byte-level BPE (None: GPT-2's own).
PRETOKENIZER_REGEX = {
    "default": None,
    "gpt2": None,
    "smollm": None,  # GPT-2 regex after splitting digits individually (see DIGITS_FIRST)
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "llama-bpe": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
DIGITS_FIRST = {"smollm"}
CONTROL_TOKEN = 3


def tokenizer_from_gguf(reader, source: str):
    """A transformers PreTrainedTokenizerFast equal to the GGUF's byte-level BPE tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    kind = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in PRETOKENIZER_REGEX:
        raise EagleError(f"{source}: unsupported GGUF tokenizer {kind!r}/{pre!r}; supported: gpt2 with {sorted(PRETOKENIZER_REGEX)}")
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    types = field(reader, "tokenizer.ggml.token_type")
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=pre == "llama-bpe")
    tok = Tokenizer(bpe)
    regex = PRETOKENIZER_REGEX[pre]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if pre in DIGITS_FIRST else []
    if regex is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(regex), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL_TOKEN])

    def token(key):
        i = field(reader, f"tokenizer.ggml.{key}_token_id")
        return None if i is None else tokens[i]

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding") or token("eos"),
        chat_template=field(reader, "tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )


def tokenizer_from_directory(directory: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory)
    except Exception as e:  # transformers raises OSError/ValueError for missing or broken files
        raise EagleError(f"{directory}: cannot load tokenizer: {e}") from None
