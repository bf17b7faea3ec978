"""Draft-head checkpoints: import from the public EAGLE layouts, export in the EAGLE-3 HF layout.

`load_draft` reads a directory holding config.json and safetensors or pytorch_model.bin weights
(sharded with an index or not; .bin files are read without torch, see loading/torch_pickle.py) in
any of these layouts:
  * SafeAILab EAGLE-1/2 (yuhuili/EAGLE-*): a LlamaConfig with num_hidden_layers 1 and "bias" (the
    fc bias, default true); fc.weight (d, 2d) [+ fc.bias], layers.0.{self_attn, mlp,
    post_attention_layernorm}.*; no input_layernorm.
  * SafeAILab / SpecForge EAGLE-3 (LlamaForCausalLMEagle3): fc.weight (d, 3*dt), midlayer.*, norm,
    lm_head (Vd, d), d2t (Vd,) offsets (target id = draft id + d2t[draft id]), t2d (V,) bool.
  * vLLM speculators ("speculators_model_type": "eagle3" | "eagle"): the decoder-layer sizes live in
    transformer_layer_config, saved as a diff against the transformers defaults (missing keys take
    those defaults); weights under layers.0.* (eagle3) or fusion_fc.* / transformer.* (eagle).
  * EAGLE-3.1 (fc_norm, norm_output) and gpt-oss style heads (norm_before_fc, norm_before_residual);
    any weight name may carry a "model." prefix.
Every config key is either interpreted, checked against the one value we implement, or listed as
harmless below; any other key is refused, so no flag that changes the head is silently dropped.
Weights keep the checkpoints' torch (out, in) layout.

Fused target layers are kept in HF hidden-state indexing (index i = the input of decoder layer i,
0 = the embeddings), the indexing of `model.forward(capture=...)`:
  * top-level "eagle_aux_hidden_state_layer_ids" (speculators; vLLM reads it): the same indexing, since
    vLLM captures `hidden_states + residual` just before running layer i;
  * "eagle_config": {"eagle_aux_hidden_state_layer_ids"} (NVIDIA ModelOpt; SGLang reads it): 0-based
    layer *outputs*, so HF index = id + 1 (ModelOpt's default [1, N//2 - 1, N - 4] is HF (2, N//2, N-3);
    SGLang captures `layers_to_capture = [id + 1 ...]`);
  * neither: the target's default (2, N//2, N-3), which needs `target_cfg`.
The engines concatenate the fused states in ascending layer order whatever the listed order, so the
ids are sorted.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from eagle_jax.model.config import ModelConfig, RopeConfig
from eagle_jax.draft.config import DraftConfig
from eagle_jax.dtypes import run_dtype
from eagle_jax.errors import EagleError
from eagle_jax.files import read_json, write_directory_atomic, write_json_atomic
from eagle_jax.loading.config_dict import PRETRAINED_CONFIG_KEYS, ConfigDict
from eagle_jax.loading.hf import read_weights, rope_from_hf
from eagle_jax.loading.hub import resolve_head_path

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
EAGLE1_ARCHITECTURES = ("LlamaForCausalLM",)
NUM_FUSED = 3

# transformers' config defaults for the keys we read: speculators saves transformer_layer_config with
# to_diff_dict(), which leaves out every value equal to the default (e.g. hidden_size 4096).
LAYER_DEFAULTS = {
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=None, head_dim=None, rms_norm_eps=1e-6),
    "qwen3": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, head_dim=128, rms_norm_eps=1e-6),
}

# Keys that do not change the head's computation: transformers' generic config attributes, and
# max_position_embeddings (our RoPE has no table to outgrow; the reference extends its cos/sin cache
# on demand), initializer_range and use_cache, attention_dropout (inference), pretraining_tp (only
# slices the matmuls), max_window_layers (only read when use_sliding_window is on, which we refuse).
HARMLESS_KEYS = PRETRAINED_CONFIG_KEYS | {
    "initializer_range", "use_cache", "max_position_embeddings", "attention_dropout", "pretraining_tp", "max_window_layers",
}
SPECULATORS_HARMLESS_KEYS = HARMLESS_KEYS | {
    "model_type", "speculators_version", "speculators_config", "has_no_defaults_at_init",
    "embed_requires_grad", "enable_sp_ulysses",  # training switches
}
# ModelOpt: next_layer_regular and parallel_draft_heads_num_layers only matter with several layers
# or parallel draft steps, both refused.
EAGLE_CONFIG_HARMLESS_KEYS = frozenset({"next_layer_regular", "parallel_draft_heads_num_layers"})

# Weights the reference never reads at inference: speculators' training-only verifier copies.
UNUSED_WEIGHTS = ("verifier_norm.weight", "verifier_lm_head.weight")

# Checkpoint name under layers.0 -> key in params["layer"] (same (out, in) layout).
LAYER_SLOTS = {
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.o_proj.weight": "wo",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
    "input_layernorm.weight": "input_norm",
    "hidden_norm.weight": "hidden_norm",
    "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
}
# Top-level checkpoint name -> key in params. fc_norm.{i} and d2t are special.
TOP_SLOTS = {
    "fc.weight": "fc",
    "fc.bias": "fc_bias",
    "input_norm.weight": "fc_pre_norm",
    "norm.weight": "final_norm",
    "lm_head.weight": "lm_head",
    "embed_tokens.weight": "embed",
}
LAYER = "layers.0."
# An exported head names no max_position_embeddings of its own; serving engines size their RoPE
# tables from it and a small value breaks long contexts (SafeAILab's 2048), so write a large one.
EXPORT_MAX_POSITIONS = 131072


def load_draft(path: str, target_cfg: ModelConfig | None = None, dtype="auto") -> tuple[DraftConfig, dict]:
    """Load a draft head from a directory in one of the public layouts (see the module docstring),
    or from a Hub id `org/name[@revision]` (a local path of the same spelling wins).

    target_cfg: the target the head will serve; its sizes are checked against the head's, and it
    supplies the default fused layers (2, N//2, N-3) of an EAGLE-3 head that names none.
    dtype: dtype of the float params, as `load_target` takes it ("auto": bfloat16 on GPU/TPU,
    float32 on CPU); None keeps the checkpoint's own. d2t is int32.
    Returns (DraftConfig, params) in the layout of `eagle_jax.draft.model`. Raises EagleError with a
    one-line message for anything it cannot load faithfully.
    """
    path = resolve_head_path(path)
    if not os.path.isdir(path):
        raise EagleError(f"{path}: not a directory (a draft head is a directory with config.json and weights, or a Hub id org/name[@revision])")
    config = read_json(os.path.join(path, "config.json"), what="a draft head's config")
    tensors = canonical_weight_names(read_weights(path), path)
    dcfg, qk_norm = head_config(config, tensors, target_cfg, path)
    return dcfg, _params_from_tensors(tensors, dcfg, qk_norm, None if dtype is None else run_dtype(dtype), path)


def head_config(config: dict, tensors: dict, target_cfg: ModelConfig | None, where: str) -> tuple[DraftConfig, bool]:
    """(DraftConfig, whether the layer has q/k norms) of a head's config.json, checked against the
    target when given. tensors (canonical names) settle what a config may leave unsaid: whether an
    EAGLE-3 head is one (d2t, hidden_norm) and how many target states its fc fuses."""
    if "speculators_model_type" in config:
        dcfg, qk_norm = _speculators_config(config, tensors, target_cfg, where)
    else:
        dcfg, qk_norm = _hf_config(config, tensors, target_cfg, where)
    if target_cfg is not None:
        try:
            dcfg.check_target(target_cfg)
        except EagleError as e:
            raise EagleError(f"{where}: {e}") from None
    return dcfg, qk_norm


def canonical_weight_names(tensors: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """Rename every layout's weights to one set: no "model." prefix, the layer under layers.0.,
    the fc as fc. (SafeAILab EAGLE-3 midlayer.*, speculators eagle transformer.* / fusion_fc.*)."""
    renames = (("midlayer.", LAYER), ("transformer.", LAYER), ("fusion_fc.", "fc."))
    out = {}
    for key, value in tensors.items():
        name = key.removeprefix("model.")
        for old, new in renames:
            if name.startswith(old):
                name = new + name[len(old):]
        if name in out:
            raise EagleError(f"{where}: two weights map to {name} (one is {key}); the checkpoint mixes layouts")
        out[name] = value
    return out


def _layer_config(c: ConfigDict) -> dict:
    """Sizes, norms and RoPE of the head's decoder layer; refuses what our layer does not compute."""
    model_type = c.get("model_type", "llama")
    if not isinstance(model_type, str) or model_type not in LAYER_DEFAULTS:
        raise EagleError(f"{c.where}: decoder layer model_type {model_type!r} is not supported (supported: {', '.join(LAYER_DEFAULTS)})")
    defaults = LAYER_DEFAULTS[model_type]
    layers = c.integer("num_hidden_layers", defaults["num_hidden_layers"])
    if layers != 1:
        raise EagleError(f"{c.where}: the head has {layers} decoder layers; eagle-jax heads have exactly one")
    hidden = c.integer("hidden_size", defaults["hidden_size"])
    heads = c.integer("num_attention_heads", defaults["num_attention_heads"])
    c.expect("hidden_act", "silu", "silu")
    c.expect("attention_bias", False, False)
    c.expect("mlp_bias", False, False)
    c.expect("qkv_bias", False, False)
    c.expect("is_causal", True, True)
    c.expect("logit_scale", 1.0, 1.0)
    c.expect("use_sliding_window", False, False)
    c.get("sliding_window")  # read only by sliding-window layers, refused above and by layer_types
    if c.get("quantization_config") is not None or c.get("compression_config") is not None:
        raise EagleError(f"{c.where}: quantized draft heads are not supported")
    layer_types = c.get("layer_types", [])
    if not isinstance(layer_types, list) or any(t != "full_attention" for t in layer_types):
        raise EagleError(f"{c.where}: layer_types {json.dumps(layer_types)} is not supported (only full_attention)")
    return dict(
        hidden_size=hidden,
        intermediate_size=c.integer("intermediate_size", defaults["intermediate_size"]),
        num_heads=heads,
        num_kv_heads=c.integer("num_key_value_heads", defaults["num_key_value_heads"] or heads),
        head_dim=c.integer("head_dim", defaults["head_dim"] or max(hidden // heads, 1)),
        vocab_size=c.integer("vocab_size", defaults["vocab_size"]),
        rms_norm_eps=c.number("rms_norm_eps", defaults["rms_norm_eps"]),
        rope=rope_from_hf(c),
        qk_norm=model_type == "qwen3",  # Qwen3 decoder layer: RMSNorm on each q/k head before RoPE
    )


def _fused_layers(c: ConfigDict, eagle_config: ConfigDict | None, target_cfg: ModelConfig | None) -> tuple[int, ...]:
    """HF hidden-state indices from top-level (HF-indexed) and/or eagle_config (output-indexed) ids."""
    key = "eagle_aux_hidden_state_layer_ids"
    top_ids, output_ids, where = c.indices(key), eagle_config and eagle_config.indices(key), c.where
    from_top = tuple(sorted(top_ids)) if top_ids else None
    from_outputs = tuple(sorted(i + 1 for i in output_ids)) if output_ids else None
    if from_top and from_outputs and from_top != from_outputs:
        raise EagleError(
            f"{where}: eagle_aux_hidden_state_layer_ids {list(top_ids)} and eagle_config's {list(output_ids)} "
            "(layer outputs, HF index + 1) name different target layers"
        )
    layers = from_top or from_outputs
    if layers is None:
        if target_cfg is None:
            raise EagleError(f"{where}: the head does not name its fused target layers; pass target_cfg to use the default (2, N//2, N-3)")
        return target_cfg.eagle3_feature_layers
    if len(layers) != NUM_FUSED:
        raise EagleError(f"{where}: the head fuses target layers {list(layers)}; eagle-jax heads fuse exactly {NUM_FUSED} layers")
    if target_cfg is not None and any(not 0 <= i < target_cfg.num_layers for i in layers):
        raise EagleError(
            f"{where}: the head fuses target hidden states {list(layers)} (HF indices), the target has "
            f"{target_cfg.num_layers} layers; only the inputs of layers 0..{target_cfg.num_layers - 1} can be fused"
        )
    return layers


def _fc_fused_count(tensors: dict, target_hidden: int, where: str) -> None:
    """Refuse an fc whose input is not 3 fused target states (the config may not say so)."""
    fc = tensors.get("fc.weight")
    if fc is not None and fc.ndim == 2 and fc.shape[1] != NUM_FUSED * target_hidden:
        count = fc.shape[1] / target_hidden
        raise EagleError(
            f"{where}: fc.weight {tuple(fc.shape)} takes {count:g} fused target states of width {target_hidden}; "
            f"eagle-jax heads fuse exactly {NUM_FUSED} (fc input {NUM_FUSED * target_hidden})"
        )


def _eagle3_config(c: ConfigDict, layer: dict, tensors: dict, where: str, *, norm_before_residual: bool,
                   norm_before_fc: bool, fc_norm: bool, norm_output: bool, fused: tuple[int, ...]) -> DraftConfig:
    hidden = layer["hidden_size"]
    target_hidden = c.integer("target_hidden_size", hidden)
    _fc_fused_count(tensors, target_hidden, where)
    try:
        return DraftConfig(
            kind="eagle3",
            hidden_size=hidden,
            intermediate_size=layer["intermediate_size"],
            num_heads=layer["num_heads"],
            num_kv_heads=layer["num_kv_heads"],
            head_dim=layer["head_dim"],
            target_hidden_size=target_hidden,
            target_vocab_size=layer["vocab_size"],
            draft_vocab_size=c.integer("draft_vocab_size", layer["vocab_size"]),
            rms_norm_eps=layer["rms_norm_eps"],
            rope=layer["rope"],
            feature_layers=fused,
            fc_norm=bool(fc_norm),
            norm_before_fc=bool(norm_before_fc),
            norm_output=bool(norm_output),
            norm_before_residual=bool(norm_before_residual),
        )
    except EagleError as e:
        raise EagleError(f"{where}: {e}") from None


def _hf_config(config: dict, tensors: dict, target_cfg, where: str) -> tuple[DraftConfig, bool]:
    """SafeAILab / SpecForge / NVIDIA heads: one flat LlamaConfig-like dict."""
    c = ConfigDict(config, f"{where}/config.json")
    architectures = c.get("architectures", [None])
    if not isinstance(architectures, list):
        raise c.refuse("architectures", "a list of names")
    arch = (architectures or [None])[0]
    eagle3 = arch in EAGLE3_ARCHITECTURES or "draft_vocab_size" in config or "d2t" in tensors or LAYER + "hidden_norm.weight" in tensors
    if not eagle3 and arch not in (None, *EAGLE1_ARCHITECTURES):
        raise EagleError(
            f"{c.where}: architecture {arch} is not a supported draft head "
            f"(supported: {', '.join(EAGLE1_ARCHITECTURES + EAGLE3_ARCHITECTURES)}, or a speculators config)"
        )
    layer = _layer_config(c)
    if not eagle3:
        c.get("tie_word_embeddings")  # an EAGLE-1 head has no lm_head: it uses the target's
        fc_bias = c.flag("bias", True)  # SafeAILab cnets1: Linear(2d, d, bias=config.bias), default true
        c.refuse_unknown(HARMLESS_KEYS)
        return _eagle1_config(layer, fc_bias, where), layer["qk_norm"]
    c.expect("tie_word_embeddings", False, False)
    c.expect("bias", False, False)  # SafeAILab's EAGLE-3 fc has no bias; others read "bias" as attention bias
    c.expect("num_aux_hidden_states", NUM_FUSED, NUM_FUSED)
    ec = ConfigDict(c.get("eagle_config", {}), f"{c.where} eagle_config")
    ec.expect("use_aux_hidden_state", True, True)
    ec.expect("use_input_layernorm_in_first_layer", True, True)
    ec.expect("use_last_layernorm", True, True)
    ec.expect("use_mtp_layernorm", False, False)
    ec.expect("parallel_draft_step", 1, 1)
    # NVIDIA heads may set norm_before_fc inside eagle_config (vLLM #42143 reads it there)
    top, nested = c.flag("norm_before_fc", None), ec.flag("norm_before_fc", None)
    if top is not None and nested is not None and top != nested:
        raise EagleError(f"{c.where}: norm_before_fc is {top} at the top level but {nested} in eagle_config")
    norm_before_fc = bool(top if top is not None else nested)
    fused = _fused_layers(c, ec, target_cfg)
    ec.refuse_unknown(EAGLE_CONFIG_HARMLESS_KEYS)
    target_type = c.get("target_model_type")  # AngelSlim names the target's family
    if target_type is not None and target_cfg is not None and target_type != target_cfg.family:
        raise EagleError(f"{c.where}: the head was trained for a {target_type} target (target_model_type), the target is {target_cfg.family}")
    fc_norm = c.flag("fc_norm", False) or c.flag("use_aux_norm", False)  # use_aux_norm: SGLang's older name
    dcfg = _eagle3_config(
        c, layer, tensors, where, fused=fused,
        norm_before_residual=c.flag("norm_before_residual", False),  # the reference: the raw hidden is the residual
        norm_before_fc=norm_before_fc, fc_norm=fc_norm, norm_output=c.flag("norm_output", False),
    )
    c.refuse_unknown(HARMLESS_KEYS)
    return dcfg, layer["qk_norm"]


def _speculators_config(config: dict, tensors: dict, target_cfg, where: str) -> tuple[DraftConfig, bool]:
    """vllm-project/speculators heads: head flags on top, the layer in transformer_layer_config."""
    c = ConfigDict(config, f"{where}/config.json")
    kind = c.get("speculators_model_type")
    if kind not in ("eagle3", "eagle"):
        raise EagleError(f"{c.where}: speculators_model_type {kind!r} is not supported (supported: eagle3, eagle)")
    lc = ConfigDict(c.get("transformer_layer_config", {}), f"{c.where} transformer_layer_config")
    layer = _layer_config(lc)
    # the layer config is the verifier's own config with the layer count overridden; the speculator
    # never ties its lm_head (eagle: the verifier's; eagle3: its own draft-vocab head)
    lc.get("tie_word_embeddings")
    lc.refuse_unknown(HARMLESS_KEYS)
    if kind == "eagle":
        c.expect("transformer_layer_architecture", "LlamaDecoderLayer", "LlamaDecoderLayer")
        c.expect("layernorms", False, False)  # the HASS/TTT variant's extra norms
        c.get("tie_word_embeddings")  # no lm_head of its own: the verifier's
        dcfg = _eagle1_config(layer, c.flag("fusion_bias", False), where)
        c.refuse_unknown(SPECULATORS_HARMLESS_KEYS)
        return dcfg, layer["qk_norm"]
    if "norm_before_residual" not in config:
        # speculators' class default is false, vLLM's reader of this layout defaults it to true
        raise EagleError(f"{c.where}: a speculators eagle3 config must set norm_before_residual (speculators and vLLM default it differently)")
    c.expect("tie_word_embeddings", False, False)
    fused = _fused_layers(c, None, target_cfg)
    dcfg = _eagle3_config(
        c, layer, tensors, where, fused=fused,
        norm_before_residual=c.flag("norm_before_residual", False), norm_before_fc=c.flag("norm_before_fc", False),
        fc_norm=c.flag("fc_norm", False), norm_output=c.flag("norm_output", False),
    )
    c.refuse_unknown(SPECULATORS_HARMLESS_KEYS)
    return dcfg, layer["qk_norm"]


def _eagle1_config(layer: dict, fc_bias: bool, where: str) -> DraftConfig:
    try:
        return DraftConfig(
            kind="eagle1",
            hidden_size=layer["hidden_size"],
            intermediate_size=layer["intermediate_size"],
            num_heads=layer["num_heads"],
            num_kv_heads=layer["num_kv_heads"],
            head_dim=layer["head_dim"],
            target_hidden_size=layer["hidden_size"],
            target_vocab_size=layer["vocab_size"],
            draft_vocab_size=layer["vocab_size"],
            rms_norm_eps=layer["rms_norm_eps"],
            rope=layer["rope"],
            fc_bias=fc_bias,
        )
    except EagleError as e:
        raise EagleError(f"{where}: {e}") from None


def checkpoint_shapes(dcfg: DraftConfig, qk_norm: bool = False) -> dict[str, tuple[int, ...]]:
    """Every weight of a head in canonical checkpoint names and torch (out, in) shapes."""
    d, f, dt = dcfg.hidden_size, dcfg.intermediate_size, dcfg.target_hidden_size
    q, kv = dcfg.num_heads * dcfg.head_dim, dcfg.num_kv_heads * dcfg.head_dim
    attn_in = d if dcfg.kind == "eagle1" else 2 * d
    layer = {
        "self_attn.q_proj.weight": (q, attn_in), "self_attn.k_proj.weight": (kv, attn_in),
        "self_attn.v_proj.weight": (kv, attn_in), "self_attn.o_proj.weight": (d, q),
        "post_attention_layernorm.weight": (d,),
        "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d), "mlp.down_proj.weight": (d, f),
    }
    if qk_norm:
        layer |= {"self_attn.q_norm.weight": (dcfg.head_dim,), "self_attn.k_norm.weight": (dcfg.head_dim,)}
    if dcfg.kind == "eagle1":
        shapes = {"fc.weight": (d, 2 * d)} | ({"fc.bias": (d,)} if dcfg.fc_bias else {})
        return shapes | {LAYER + k: s for k, s in layer.items()}
    layer |= {"input_layernorm.weight": (d,), "hidden_norm.weight": (d,)}
    shapes = {"fc.weight": (d, NUM_FUSED * dt)}
    if dcfg.fc_norm:
        shapes |= {f"fc_norm.{i}.weight": (dt,) for i in range(NUM_FUSED)}
    if dcfg.norm_before_fc:
        shapes["input_norm.weight"] = (NUM_FUSED * dt,)
    shapes |= {LAYER + k: s for k, s in layer.items()}
    shapes |= {"norm.weight": (d,), "lm_head.weight": (dcfg.draft_vocab_size, d), "d2t": (dcfg.draft_vocab_size,)}
    if d != dt:
        shapes["embed_tokens.weight"] = (dcfg.target_vocab_size, d)
    return shapes


def _ignored_weights(dcfg: DraftConfig) -> set[str]:
    """Weights a checkpoint may carry that the head does not use."""
    ignored = set(UNUSED_WEIGHTS)
    if dcfg.kind == "eagle1" or dcfg.hidden_size == dcfg.target_hidden_size:
        ignored.add("embed_tokens.weight")  # a frozen copy of the target's embedding in every recipe
    if dcfg.kind == "eagle1":
        ignored.add("lm_head.weight")  # speculators' eagle saves the verifier's frozen lm_head
    else:
        ignored.add("t2d")  # derived from d2t; checked in _d2t
    return ignored


def _params_from_tensors(tensors: dict, dcfg: DraftConfig, qk_norm: bool, dtype, where: str) -> dict:
    shapes = checkpoint_shapes(dcfg, qk_norm)
    if dcfg.kind == "eagle3" and "d2t" not in tensors and not dcfg.maps_vocab:
        tensors = tensors | {"d2t": np.zeros((dcfg.draft_vocab_size,), np.int64)}  # identity map, often omitted
    unexpected = sorted(set(tensors) - set(shapes) - _ignored_weights(dcfg))
    if unexpected:
        raise EagleError(f"{where}: unexpected weight(s) {', '.join(unexpected)} for an {dcfg.kind} head with this config")
    missing = [name for name in shapes if name not in tensors]
    if "embed_tokens.weight" in missing and dcfg.hidden_size != dcfg.target_hidden_size:
        widths = f"; its norm.weight is {tuple(tensors['norm.weight'].shape)}" if "norm.weight" in tensors else ""
        raise EagleError(f"{where}: head hidden size {dcfg.hidden_size} (config hidden_size) differs from the target's "
                         f"{dcfg.target_hidden_size} (target_hidden_size){widths}; a head narrower than its target needs an "
                         "embed_tokens.weight of its own, which this one lacks")
    if missing:
        raise EagleError(f"{where}: missing weight(s) {', '.join(missing)} for an {dcfg.kind} head with this config")
    params, fc_norm = {"layer": {}}, []
    for name, shape in shapes.items():
        array = tensors[name]
        if tuple(array.shape) != shape:
            raise EagleError(f"{where}: weight {name} has shape {tuple(array.shape)}, expected {shape} from the config")
        if name == "d2t":
            params["d2t"] = _d2t(array, tensors.get("t2d"), dcfg, where)
            continue
        if not jnp.issubdtype(array.dtype, jnp.floating):  # numpy does not count bfloat16 as floating
            raise EagleError(f"{where}: weight {name} has dtype {array.dtype}, expected a float dtype")
        if name.startswith("fc_norm."):
            fc_norm.append(jnp.asarray(array, dtype or array.dtype))
            continue
        if name.startswith(LAYER):
            key, target = LAYER_SLOTS[name[len(LAYER):]], params["layer"]
        else:
            key, target = TOP_SLOTS[name], params
        target[key] = jnp.asarray(array, dtype or array.dtype)
    if fc_norm:
        params["fc_norm"] = jnp.stack(fc_norm)
    return params


def _d2t(d2t: np.ndarray, t2d: np.ndarray | None, dcfg: DraftConfig, where: str) -> jnp.ndarray:
    """Check the draft->target offsets (and t2d, when given) and return them as int32."""
    if not np.issubdtype(d2t.dtype, np.integer):
        raise EagleError(f"{where}: d2t has dtype {d2t.dtype}, expected integer offsets")
    vocab = dcfg.target_vocab_size
    if not dcfg.maps_vocab:
        if np.any(d2t != 0):
            raise EagleError(f"{where}: d2t is not all zero although draft and target vocabularies have the same size ({vocab})")
        return jnp.zeros(d2t.shape, jnp.int32)
    target_ids = np.arange(d2t.shape[0], dtype=np.int64) + d2t.astype(np.int64)
    if target_ids.min() < 0 or target_ids.max() >= vocab or len(np.unique(target_ids)) != len(target_ids):
        raise EagleError(f"{where}: d2t maps draft ids outside the target vocabulary of {vocab} or onto the same id twice")
    if t2d is not None:
        if t2d.shape != (vocab,):
            raise EagleError(f"{where}: t2d has shape {tuple(t2d.shape)}, expected ({vocab},) (the target vocabulary)")
        if not np.array_equal(t2d.astype(bool), t2d_mask(d2t, vocab)):
            raise EagleError(f"{where}: t2d does not mark exactly the target ids that d2t maps to")
    return jnp.asarray(d2t, jnp.int32)


def t2d_mask(d2t: np.ndarray, vocab_size: int) -> np.ndarray:
    """(V,) bool: which target ids the draft vocabulary covers (target id = draft id + d2t[draft id])."""
    mask = np.zeros((vocab_size,), bool)
    mask[np.arange(d2t.shape[0]) + np.asarray(d2t, np.int64)] = True
    return mask


def export_draft(directory: str, dcfg: DraftConfig, dparams: dict, max_shard_bytes: int | None = None) -> None:
    """Write a head as config.json + model.safetensors in the HF layout vLLM and SGLang load.

    max_shard_bytes: split the weights into model-0000i-of-0000N.safetensors files of at most that
    many tensor bytes each, with the model.safetensors.index.json that HF loaders read (a tensor
    larger than the limit is refused); None writes one file.

    eagle3: LlamaForCausalLMEagle3 (fc, midlayer.*, norm, lm_head, d2t int64, t2d bool), with
    draft_vocab_size, target_hidden_size, the fused layers and the EAGLE-3.1 / speculators flags.
    eagle1: the SafeAILab EAGLE-1 layout (fc, layers.0.*) with "bias". Float dtypes are kept, so
    `load_draft(directory, dtype=None)` returns the same arrays bit for bit. The directory appears
    complete or not at all: it is written beside the target, synced, then renamed over it.
    """
    if "q_norm" in dparams["layer"] or "k_norm" in dparams["layer"]:
        raise EagleError("heads with q/k norms (Qwen3-style layers) cannot be written in the LlamaForCausalLMEagle3 layout")
    tensors = {}
    for name, shape in checkpoint_shapes(dcfg).items():
        array = _export_array(dparams, name)
        if array.shape != shape:
            raise EagleError(f"cannot export: {name} has shape {array.shape}, the DraftConfig says {shape}")
        out_name = "midlayer." + name[len(LAYER):] if dcfg.kind == "eagle3" and name.startswith(LAYER) else name
        tensors[out_name] = np.ascontiguousarray(array)
    if dcfg.kind == "eagle3":
        tensors["t2d"] = t2d_mask(tensors["d2t"], dcfg.target_vocab_size)
    config = _export_config(dcfg, str(np.asarray(dparams["fc"]).dtype))

    shards = [tensors] if max_shard_bytes is None else shard_tensors(tensors, max_shard_bytes)

    def fill(staging: str) -> None:
        if len(shards) == 1:
            save_file(tensors, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
        else:
            names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
            for name, shard in zip(names, shards):
                save_file(shard, os.path.join(staging, name), metadata={"format": "pt"})
            index = {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())},
                     "weight_map": {key: name for name, shard in zip(names, shards) for key in sorted(shard)}}
            write_json_atomic(os.path.join(staging, "model.safetensors.index.json"), index)
        write_json_atomic(os.path.join(staging, "config.json"), config)

    write_directory_atomic(directory, fill)


def check_shard_size(dcfg: DraftConfig, max_shard_bytes: int | None, itemsize: int = 4) -> None:
    """Refuse, before a run, a shard size that the head's largest float tensor would not fit."""
    if max_shard_bytes is None:
        return
    name, shape = max(checkpoint_shapes(dcfg).items(), key=lambda item: np.prod(item[1]))
    need = int(np.prod(shape)) * itemsize
    if need > max_shard_bytes:
        raise EagleError(f"--max-shard-size {max_shard_bytes} bytes is smaller than the head's {name} {shape} "
                         f"({need} bytes in float32); give at least that")


def shard_tensors(tensors: dict[str, np.ndarray], max_bytes: int) -> list[dict[str, np.ndarray]]:
    """Tensors grouped in name order into shards of at most max_bytes tensor bytes each (the
    safetensors header, a few kB, comes on top)."""
    shards, size = [{}], 0
    for key in sorted(tensors):
        nbytes = tensors[key].nbytes
        if nbytes > max_bytes:
            raise EagleError(f"cannot export: {key} holds {nbytes} bytes, more than a shard of at most {max_bytes}")
        if size + nbytes > max_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key]
        size += nbytes
    return shards


def _export_array(dparams: dict, name: str) -> np.ndarray:
    """The weight `name` (canonical checkpoint name) from our params (already in torch layout)."""
    if name == "d2t":
        key, source = "d2t", dparams
    elif name.startswith("fc_norm."):
        key, source = "fc_norm", dparams
    elif name.startswith(LAYER):
        key, source = LAYER_SLOTS[name[len(LAYER):]], dparams["layer"]
    else:
        key, source = TOP_SLOTS[name], dparams
    if key not in source:
        raise EagleError(f"cannot export: the params have no {key!r} (for {name}), which this DraftConfig needs")
    array = np.asarray(source[key])
    if name == "d2t":
        return array.astype(np.int64)  # the public layouts store int64 offsets
    if name.startswith("fc_norm."):
        return array[int(name.split(".")[1])]
    return array


def _rope_to_hf(rope: RopeConfig) -> dict | None:
    if rope.rope_type == "default":
        return None
    if rope.rope_type == "linear":
        return {"rope_type": "linear", "type": "linear", "factor": rope.factor}
    return {
        "rope_type": rope.rope_type, "factor": rope.factor, "low_freq_factor": rope.low_freq_factor,
        "high_freq_factor": rope.high_freq_factor, "original_max_position_embeddings": rope.original_max_position,
    }


def _export_config(dcfg: DraftConfig, dtype_name: str) -> dict:
    config = {
        "model_type": "llama",
        "hidden_size": dcfg.hidden_size,
        "intermediate_size": dcfg.intermediate_size,
        "num_attention_heads": dcfg.num_heads,
        "num_key_value_heads": dcfg.num_kv_heads,
        "head_dim": dcfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": dcfg.rms_norm_eps,
        "vocab_size": dcfg.target_vocab_size,
        "rope_theta": dcfg.rope.theta,
        "rope_scaling": _rope_to_hf(dcfg.rope),
        "max_position_embeddings": EXPORT_MAX_POSITIONS,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype_name,
    }
    if dcfg.kind == "eagle1":
        return config | {"architectures": ["LlamaForCausalLM"], "bias": dcfg.fc_bias}
    config |= {
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": dcfg.draft_vocab_size,
        "target_hidden_size": dcfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(dcfg.feature_layers),  # vLLM: HF hidden-state indices
        "fc_norm": dcfg.fc_norm,
        "norm_output": dcfg.norm_output,
        "norm_before_fc": dcfg.norm_before_fc,
        "norm_before_residual": dcfg.norm_before_residual,
    }
    if min(dcfg.feature_layers) > 0:  # SGLang reads layer-output ids (HF index - 1); the embeddings have none
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in dcfg.feature_layers], "use_aux_hidden_state": True}
    return config
