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
CONTROL_TOKEN, USER_DEFINED_TOKEN = 3, 4  # llama.cpp's token types


def tokenizer_from_gguf(reader, source: str):
    """A transformers PreTrainedTokenizerFast equal to the GGUF's tokenizer: byte-level BPE (gpt2),
    or Gemma's SentencePiece BPE (llama, in a gemma3 file)."""
    kind = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if kind == "llama" and field(reader, "general.architecture") == "gemma3":
        return gemma_tokenizer_from_gguf(reader)
    if kind != "gpt2" or pre not in PRETOKENIZER_REGEX:
        raise EagleError(f"{source}: unsupported GGUF tokenizer {kind!r}/{pre!r}; supported: gpt2 with "
                         f"{sorted(PRETOKENIZER_REGEX)}, and llama (SentencePiece) in gemma3 files")
    return byte_level_tokenizer_from_gguf(reader, pre)


def byte_level_tokenizer_from_gguf(reader, pre: str):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

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
    return wrap(reader, tok, tokens)


def gemma_tokenizer_from_gguf(reader):
    """Gemma's SentencePiece BPE with byte fallback: spaces become "▁" and no prefix space is added.
    The file lists no merges: every token that splits into two tokens is the merge of the pair,
    ranked by the token's place in the file (Gemma's scores do not follow its merge order), the
    longer left part first. Tokens of spaces alone are stored with real spaces and looked up as runs
    of "▁". A BOS is added where the file says add_bos_token."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    stored = field(reader, "tokenizer.ggml.tokens")
    tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in stored]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [(t[:k], t[k:]) for t in tokens for k in range(len(t) - 1, 0, -1) if t[:k] in vocab and t[k:] in vocab]
    unk = tokens[field(reader, "tokenizer.ggml.unknown_token_id", 3)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    types = field(reader, "tokenizer.ggml.token_type")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL_TOKEN])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED_TOKEN])
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    if bos is not None and field(reader, "tokenizer.ggml.add_bos_token", True):
        tok.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                           special_tokens=[(tokens[bos], bos)])
    return wrap(reader, tok, tokens)


def wrap(reader, tok, tokens: list[str]):
    """The transformers tokenizer around a `tokenizers` one, with the file's special tokens and chat template."""
    from transformers import PreTrainedTokenizerFast

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
