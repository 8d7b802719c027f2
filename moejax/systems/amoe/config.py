"""Static configuration of AMoE (002) and its synchronous-EP serving baseline.

Everything here is host-side and built once: the layer placement (§3.3), the execution-time
model of each layer from the platform roofline plus the fixed per-step overheads of §5.4,
point-to-point transfer costs from the topology, KV-cache capacity per attention rank
(§3.1) and the routing popularity (§5). Times in the event simulation are int32 ticks of
`TICK_S` so that the vectorized simulation and the plain-Python reference agree exactly.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.physics import topology
from moejax.trace import gen

TICK_S = 1e-6  # event-clock resolution: int32 microseconds (a 35-minute horizon)
BIG_TICK = 2**31 - 1  # "never"
SCHEDULERS = ("defrag", "mtfs", "flfs")
NUM_ITL_BINS = 64  # log-spaced inter-token-latency histogram (for p99)
ITL_MIN_S, ITL_MAX_S = 1e-4, 10.0


@dataclasses.dataclass(frozen=True)
class Overheads:
    """Fixed per-step costs of layer-wise execution, seconds (002 §5.4, Fig. 13), and the
    kernel efficiencies and per-message cost the layer and transfer times use.

    schedule_s: scheduler inspects the queues and merges the batch (every step).
    attention_fixed_s: pre-processing (CPU -> GPU metadata) and post-processing (expert
      indices and weights GPU -> CPU for the dispatcher) of one attention step.
    page_table_s_per_token: each token traverses the paged-attention block table.
    expert_fixed_s: pre/post-processing of one expert step (small: no metadata, §5.4).
    expert_efficiency: the expert GEMM's compute time is FLOPs / (peak x efficiency).
      002 Fig. 3 (one Mixtral expert layer on an A100-40GB): throughput rises "almost
      linearly until the batch size of 128", i.e. the memory-bound -> compute-bound knee is
      at 128 tokens; with weights streamed at the datasheet HBM bandwidth the knee sits at
      efficiency x peak / bandwidth tokens, so efficiency = 128 x 1.555e12 / 312e12 = 0.638
      (`FIG3_EXPERT_EFFICIENCY`).
    attention_kv_reads: KV bytes read per context token = reads x kv_bytes_per_token. vLLM's
      PagedAttention decode kernel (which AMoE's executor uses, 002 §3.2 / §4 "[28]")
      launches one thread block per (query head, sequence) (`dim3 grid(num_heads,
      num_seqs, 1)` in vllm csrc/attention/paged_attention_v1.cu), so with MQA's one KV head
      each of the 32 query heads streams the whole KV cache: reads = heads / kv_heads. The
      roofline reads it once (1.0). This is what makes attention grow with context (002 §5:
      "With long-context workloads, we observe that attention computation dominates").
    message_s: per-message software cost (ZeroMQ metadata + NCCL send/recv, §3.5), added
      to every off-diagonal pair latency.
    """

    schedule_s: float = 10e-6
    attention_fixed_s: float = 100e-6
    page_table_s_per_token: float = 2e-6
    expert_fixed_s: float = 30e-6
    # kernel efficiencies and message costs (calibrated in docs/reproduction/amoe.md; defaults:
    # the plain roofline)
    expert_efficiency: float = 1.0  # share of peak FLOPs the expert GEMM reaches (Fig. 3)
    attention_kv_reads: float = 1.0  # times the paged decode kernel streams the KV cache
    message_s: float = 0.0  # software cost of one point-to-point message (§3.5), on top
    # of the link latency; it delays the tokens, it does not occupy a GPU


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """Per-layer execution-time coefficients (float32), see `expert_ticks`/`attention_ticks`.

    Expert layer, n tokens: max(n * exp_comp, exp_weight + n * exp_act) + exp_fixed.
    Attention layer, n tokens with C context tokens in total:
      max(n * att_comp + C * att_ctx_comp, att_weight + C * att_kv + n * att_act)
      + att_fixed + n * att_per_token.
    """

    exp_comp: np.float32
    exp_weight: np.float32
    exp_act: np.float32
    exp_fixed: np.float32
    att_comp: np.float32
    att_ctx_comp: np.float32
    att_weight: np.float32
    att_kv: np.float32
    att_act: np.float32
    att_fixed: np.float32
    att_per_token: np.float32


FIG3_EXPERT_EFFICIENCY = 128 * 1.555e12 / 312e12  # 002 Fig. 3 knee at 128 tokens, A100-40GB


def layer_cost(platform: Platform, model: ModelSpec, ov: Overheads, dtype="bf16") -> LayerCost:
    """Roofline coefficients of one expert layer and one attention layer (seconds), with the
    expert GEMM efficiency and the KV read multiplicity of `ov`."""
    dev = platform.device
    peak, bw = dev.flops(dtype), dev.memory_Bps
    f32 = np.float32
    gate_flops = 2.0 * model.hidden_size * model.num_experts  # router is part of attention
    return LayerCost(
        exp_comp=f32(model.expert_flops_per_token / (peak * ov.expert_efficiency)),
        exp_weight=f32(model.expert_weight_bytes / bw),
        exp_act=f32(2 * model.token_bytes / bw),
        exp_fixed=f32(ov.schedule_s + ov.expert_fixed_s),
        att_comp=f32((model.attention_flops_per_token + gate_flops) / peak),
        att_ctx_comp=f32(model.attention_context_flops / peak),
        att_weight=f32(model.attention_weight_bytes / bw),
        att_kv=f32(model.kv_bytes_per_token * ov.attention_kv_reads / bw),
        att_act=f32(2 * model.token_bytes / bw),
        att_fixed=f32(ov.schedule_s + ov.attention_fixed_s),
        att_per_token=f32(ov.page_table_s_per_token),
    )


def to_ticks(xp, seconds):
    """int32 ticks, rounded up (float32 arithmetic, identical in numpy and jax)."""
    return xp.ceil(seconds * xp.float32(1.0 / TICK_S)).astype(xp.int32)


def expert_seconds(xp, c: LayerCost, n):
    """float32 seconds of one expert layer on n tokens (memory-bound at small n, Fig. 3)."""
    nf = xp.asarray(n).astype(xp.float32)
    return xp.maximum(nf * c.exp_comp, c.exp_weight + nf * c.exp_act) + c.exp_fixed


def attention_seconds(xp, c: LayerCost, n, ctx):
    """float32 seconds of one attention layer on n tokens attending `ctx` KV tokens in all."""
    nf = xp.asarray(n).astype(xp.float32)
    cf = xp.asarray(ctx).astype(xp.float32)
    comp = nf * c.att_comp + cf * c.att_ctx_comp
    mem = c.att_weight + cf * c.att_kv + nf * c.att_act
    return xp.maximum(comp, mem) + c.att_fixed + nf * c.att_per_token


def pair_tables(platform: Platform, token_bytes: float, message_s: float = 0.0):
    """float32 [D, D] point-to-point latency (s) and seconds per token (0 on the diagonal).

    `message_s` (a per-message software cost, `Overheads.message_s`) is added to every
    off-diagonal latency.

    A message follows the topology's route; its bandwidth is the slowest link on it
    (NVSwitch port, or the NIC between nodes of a hierarchical platform) at its sustained
    bulk rate (`Topology.sustained_Bps`, the rate every system's all-to-all uses).
    """
    topo = topology.build(platform)
    inc = topo.incidence()  # [D, D, Lk]
    bw = np.where(inc > 0, np.asarray(topo.sustained_Bps)[None, None, :], np.inf).min(-1)
    d = platform.num_devices
    per_token = np.where(np.eye(d, dtype=bool), 0.0, token_bytes / bw)
    lat = np.where(np.eye(d, dtype=bool), 0.0, topo.path_latency_s + message_s)
    return lat.astype(np.float32), per_token.astype(np.float32)


def transfer_ticks(xp, lat_s, per_token_s, tokens):
    """int32 ticks for a message of `tokens` tokens on a pair (latency + size / bandwidth)."""
    tf = xp.asarray(tokens).astype(xp.float32)
    return to_ticks(xp, lat_s + tf * per_token_s)


def kv_tokens_per_layerset(model: ModelSpec) -> float:
    """KV-cache bytes one context token holds across all blocks."""
    return model.kv_bytes_per_token * model.num_layers


def exponential_popularity(num_blocks: int, num_experts: int, scale: float, seed: int):
    """float64 [NB, E] expert popularity per block: 002 §5 exponential fit (trace.gen)."""
    p = gen.popularity(f"exponential:scale={scale}", jax.random.key(seed), iterations=1,
                       layers=num_blocks, num_experts=num_experts)
    return np.asarray(p[0], np.float64)


def mqa(model: ModelSpec) -> ModelSpec:
    """002 §5: Mixtral's GQA replaced by MQA (one KV head) to relieve KV-cache capacity."""
    return dataclasses.replace(model, num_kv_heads=1, attention_kind="MQA")


def itl_bin_edges_s() -> np.ndarray:
    """float32 [NUM_ITL_BINS - 1] inner edges of the log-spaced ITL histogram."""
    return np.geomspace(ITL_MIN_S, ITL_MAX_S, NUM_ITL_BINS - 1).astype(np.float32)


def p99_from_hist(hist) -> float:
    """99th percentile ITL (s) from a histogram on `itl_bin_edges_s` (the upper edge of the
    bin holding it; NaN for an empty histogram)."""
    h = np.asarray(hist, np.float64)
    if h.sum() == 0:
        return float("nan")
    c = np.cumsum(h) / h.sum()
    edges = np.concatenate([itl_bin_edges_s().astype(np.float64), [np.inf]])
    return float(edges[int(np.searchsorted(c, 0.99))])


def check_positive(name: str, value, integer: bool = False) -> None:
    ok = value > 0 and (not integer or int(value) == value)
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        kind = "an integer >= 1" if integer else "> 0"
        raise ConfigError(f"{name} = {value!r}; allowed: {kind}")
