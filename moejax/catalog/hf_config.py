"""A ModelSpec straight from a Hugging Face `config.json`.

Families read (by `model_type`, else by `architectures[0]`): Mixtral, Phi-3.5-MoE (`phimoe`),
Qwen2-MoE, Qwen3-MoE, DeepSeek-MoE (`deepseek`), DeepSeek-V2 / V3 (MLA), OLMoE, DBRX and
gpt-oss. Each family's keys are the ones its `transformers` configuration class defines; a
missing key or an unknown family is one ConfigError naming it. Weights take the bytes of
`torch_dtype` (bf16 when absent); quantization configs are not read (override `weight_bytes`).
"""

from __future__ import annotations

import json
from pathlib import Path

from moejax.catalog.modelspec import ModelSpec
from moejax.errors import ConfigError

# architectures[0] -> model_type, for configs that lack model_type
ARCHITECTURES = {
    "MixtralForCausalLM": "mixtral",
    "PhiMoEForCausalLM": "phimoe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekForCausalLM": "deepseek",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "OlmoeForCausalLM": "olmoe",
    "DbrxForCausalLM": "dbrx",
    "GptOssForCausalLM": "gpt_oss",
}
DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "float8_e4m3fn": 1.0}


class _Cfg:
    """Keys of one config.json, each read by name; a missing one names itself."""

    def __init__(self, data: dict, where: str, family: str):
        self.data, self.where, self.family = data, where, family

    def get(self, key: str, default=None, *, sub: str | None = None):
        d = self.data.get(sub, {}) if sub else self.data
        return d.get(key, default) if isinstance(d, dict) else default

    def int(self, key: str, default: int | None = None, *, sub: str | None = None,
            lo: int = 1) -> int:
        v = self.get(key, default, sub=sub)
        name = f"{sub}.{key}" if sub else key
        if v is None:
            raise ConfigError(f"{self.where}: missing field {name!r} (needed for model_type "
                              f"{self.family!r})")
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"{self.where}: field {name!r} = {v!r} must be an integer >= {lo}")
        return v


def supported() -> list[str]:
    return sorted(set(ARCHITECTURES.values()))


def read_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face config.json file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    archs = data.get("architectures") or []
    family = data.get("model_type") or ARCHITECTURES.get(archs[0] if archs else "", "")
    if family not in _READERS:
        what = (f"model_type {family!r}" if family else
                f"architectures {archs!r}" if archs else "no model_type or architectures")
        raise ConfigError(f"{path}: unknown architecture ({what}); supported model_type: "
                          f"{', '.join(supported())}")
    c = _Cfg(data, str(path), family)
    if name is None:
        name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
    dtype = data.get("torch_dtype") or data.get("dtype") or "bfloat16"
    fields = _READERS[family](c)
    tie = data.get("tie_word_embeddings", False)
    try:
        return ModelSpec(
            name=name, source=f"{path} (Hugging Face config.json, model_type {family})",
            weight_bytes=DTYPE_BYTES.get(dtype, 2.0), act_bytes=2.0,
            tie_embeddings=bool(tie), **fields)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _heads(c: _Cfg, hidden: int, kv_key: str = "num_key_value_heads") -> dict:
    heads = c.int("num_attention_heads")
    kv = c.int(kv_key, heads)
    head_dim = c.get("head_dim") or hidden // heads
    kind = "MHA" if kv == heads else "MQA" if kv == 1 else "GQA"
    return dict(num_heads=heads, num_kv_heads=kv, head_dim=head_dim, attention_kind=kind)


def _window(c: _Cfg, layers: int, windowed: int | None = None) -> dict:
    w = c.get("sliding_window")
    if not w:
        return {}
    return dict(sliding_window=c.int("sliding_window"),
                sliding_window_layers=layers if windowed is None else windowed)


def _every_block_moe(c: _Cfg, ffn_key: str, experts_key: str) -> dict:
    hidden, layers = c.int("hidden_size"), c.int("num_hidden_layers")
    return dict(hidden_size=hidden, expert_ffn_size=c.int(ffn_key),
                num_experts=c.int(experts_key), top_k=c.int("num_experts_per_tok"),
                num_shared_experts=0, shared_ffn_size=0, num_sparse_layers=layers,
                num_layers=layers, dense_ffn_size=0, vocab_size=c.int("vocab_size"),
                **_heads(c, hidden))


def _mixtral(c: _Cfg) -> dict:
    f = _every_block_moe(c, "intermediate_size", "num_local_experts")
    return {**f, **_window(c, f["num_layers"])}


def _olmoe(c: _Cfg) -> dict:
    return _every_block_moe(c, "intermediate_size", "num_experts")


def _gpt_oss(c: _Cfg) -> dict:
    if c.get("num_experts_per_tok") is None and c.get("experts_per_token") is not None:
        c.data = {**c.data, "num_experts_per_tok": c.get("experts_per_token")}
    f = _every_block_moe(c, "intermediate_size", "num_local_experts")
    types = c.get("layer_types")
    windowed = (sum(t == "sliding_attention" for t in types) if isinstance(types, list)
                else f["num_layers"] // 2)  # gpt-oss alternates banded and dense blocks
    return {**f, **_window(c, f["num_layers"], windowed)}


def _qwen_moe(c: _Cfg, shared: bool) -> dict:
    hidden, layers = c.int("hidden_size"), c.int("num_hidden_layers")
    step = c.int("decoder_sparse_step", 1)
    dense_only = set(c.get("mlp_only_layers") or [])
    sparse = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    out = dict(hidden_size=hidden, expert_ffn_size=c.int("moe_intermediate_size"),
               num_experts=c.int("num_experts"), top_k=c.int("num_experts_per_tok"),
               num_sparse_layers=sparse, num_layers=layers,
               dense_ffn_size=c.int("intermediate_size") if sparse < layers else 0,
               vocab_size=c.int("vocab_size"), num_shared_experts=0, shared_ffn_size=0,
               **_heads(c, hidden))
    if shared:
        out.update(num_shared_experts=1,
                   shared_ffn_size=c.int("shared_expert_intermediate_size"))
    if c.get("use_sliding_window"):  # Qwen2: blocks from max_window_layers on are windowed
        out.update(_window(c, layers, layers - c.int("max_window_layers", layers, lo=0)))
    return out


def _deepseek(c: _Cfg, mla: bool) -> dict:
    hidden, layers = c.int("hidden_size"), c.int("num_hidden_layers")
    first, freq = c.int("first_k_dense_replace", 0, lo=0), c.int("moe_layer_freq", 1)
    sparse = sum(1 for i in range(first, layers) if i % freq == 0)
    out = dict(hidden_size=hidden, expert_ffn_size=c.int("moe_intermediate_size"),
               num_experts=c.int("n_routed_experts"), top_k=c.int("num_experts_per_tok"),
               num_shared_experts=c.int("n_shared_experts", 0, lo=0),
               shared_ffn_size=c.int("moe_intermediate_size"),
               num_sparse_layers=sparse, num_layers=layers,
               dense_ffn_size=c.int("intermediate_size") if sparse < layers else 0,
               vocab_size=c.int("vocab_size"))
    if not out["num_shared_experts"]:
        out["shared_ffn_size"] = 0
    if not mla:
        return {**out, **_heads(c, hidden)}
    heads = c.int("num_attention_heads")
    rope, nope = c.int("qk_rope_head_dim"), c.int("qk_nope_head_dim")
    q_lora = c.get("q_lora_rank")
    return {**out, "num_heads": heads, "num_kv_heads": heads, "head_dim": nope + rope,
            "attention_kind": "MLA", "kv_lora_rank": c.int("kv_lora_rank"),
            "q_lora_rank": 0 if q_lora is None else c.int("q_lora_rank"),
            "qk_rope_head_dim": rope, "v_head_dim": c.int("v_head_dim")}


def _dbrx(c: _Cfg) -> dict:
    hidden, layers, heads = c.int("d_model"), c.int("n_layers"), c.int("n_heads")
    kv = c.int("kv_n_heads", sub="attn_config")
    return dict(hidden_size=hidden, expert_ffn_size=c.int("ffn_hidden_size", sub="ffn_config"),
                num_experts=c.int("moe_num_experts", sub="ffn_config"),
                top_k=c.int("moe_top_k", sub="ffn_config"), num_shared_experts=0,
                shared_ffn_size=0, num_sparse_layers=layers, num_layers=layers,
                dense_ffn_size=0, vocab_size=c.int("vocab_size"), num_heads=heads,
                num_kv_heads=kv, head_dim=hidden // heads,
                attention_kind="MHA" if kv == heads else "MQA" if kv == 1 else "GQA")


_READERS = {
    "mixtral": _mixtral,
    "phimoe": _mixtral,
    "qwen2_moe": lambda c: _qwen_moe(c, shared=True),
    "qwen3_moe": lambda c: _qwen_moe(c, shared=False),
    "deepseek": lambda c: _deepseek(c, mla=False),
    "deepseek_v2": lambda c: _deepseek(c, mla=True),
    "deepseek_v3": lambda c: _deepseek(c, mla=True),
    "olmoe": _olmoe,
    "dbrx": _dbrx,
    "gpt_oss": _gpt_oss,
}
