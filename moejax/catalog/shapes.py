"""The weight matrices of one transformer block, by name and shape, as the Hugging Face
modules hold them (`[out_features, in_features]`).

An independent account of `ModelSpec`'s closed-form counts: the plain references and the
tests sum these shapes, so a wrong formula in `ModelSpec` shows up as a mismatch.
"""

from __future__ import annotations

import math

from moejax.catalog.modelspec import ModelSpec


def attention_shapes(m: ModelSpec) -> dict[str, tuple[int, int]]:
    """Projection matrices of one attention block (module name -> (out, in))."""
    h, heads = m.hidden_size, m.num_heads
    qk = m.head_dim
    v = m.v_head_dim or m.head_dim
    if m.attention_kind == "MLA":  # DeepSeek-V2 §2.1: modeling_deepseek.DeepseekV2Attention
        nope = qk - m.qk_rope_head_dim
        q = ({"q_a_proj": (m.q_lora_rank, h), "q_b_proj": (heads * qk, m.q_lora_rank)}
             if m.q_lora_rank else {"q_proj": (heads * qk, h)})
        return {**q,
                "kv_a_proj_with_mqa": (m.kv_lora_rank + m.qk_rope_head_dim, h),
                "kv_b_proj": (heads * (nope + v), m.kv_lora_rank),
                "o_proj": (h, heads * v)}
    return {"q_proj": (heads * qk, h), "k_proj": (m.num_kv_heads * qk, h),
            "v_proj": (m.num_kv_heads * v, h), "o_proj": (h, heads * v)}


def expert_shapes(m: ModelSpec, ffn: int | None = None) -> dict[str, tuple[int, int]]:
    """One (gated) FFN: gate, up and down projections (plain FFNs have no gate)."""
    f = m.expert_ffn_size if ffn is None else ffn
    mats = {"up_proj": (f, m.hidden_size), "down_proj": (m.hidden_size, f)}
    return {"gate_proj": (f, m.hidden_size), **mats} if m.ffn_matrices == 3 else mats


def count(shapes: dict[str, tuple[int, int]]) -> int:
    """Elements of a set of matrices."""
    return sum(math.prod(s) for s in shapes.values())


def context_macs(m: ModelSpec) -> int:
    """Multiply-accumulates one query token spends per context token in one block: q.k over
    every head's q width (the q projection's output) and p.v over every head's value width
    (the o projection's input)."""
    s = attention_shapes(m)
    q = s["q_b_proj"] if "q_b_proj" in s else s["q_proj"]
    return q[0] + s["o_proj"][1]


def kv_cache_width(m: ModelSpec) -> int:
    """Elements one token adds to one block's KV cache: MLA caches the output of its KV
    down-projection (latent + shared rope key), other kinds their k and v projections."""
    s = attention_shapes(m)
    if "kv_a_proj_with_mqa" in s:
        return s["kv_a_proj_with_mqa"][0]
    return s["k_proj"][0] + s["v_proj"][0]
