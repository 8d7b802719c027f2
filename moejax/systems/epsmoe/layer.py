"""One transformer block of a prefill forward under TP+TP, DP+EP or TP+EP, with the expert
pipeline of EPS-MoE (003 §4.2-4.4, §5.2), from one layer's routing (hard mode).

Tokens: slot n is owned (after attention, or after TP+EP's reduce-scatter) by device n mod D;
each simulated token stands for `scale` real tokens. Experts sit in contiguous blocks of
E_loc per device; pipeline chunk c is the c-th group of E_loc / N local experts on every
device (§4.3 "expert groups", E11).

Per chunk c (E11): all2all dispatch of the tokens chunk c needs, each token once per
(destination device, chunk) (A7, check 8), GEMM of the chunk's experts, all2all combine.
x_c = comm (dispatch + combine, 2 alpha, SM-limited), y_c = slowest device's GEMM. With
overlap the chunks form a two-resource flow shop (comm stream, compute stream):

    F = max_j ( sum_{c<=j} x_c + sum_{c>=j} y_c )     (= max + min / N for equal chunks, E12)

then R(N) = overhead (N - 1), LocalReduce (memory-bound, E11) and shared experts (serial,
A14). TP+EP wraps the MoE in a ring reduce-scatter and all-gather (E6); TP+TP runs every
expert column-split on all devices and all-reduces after attention and after the MoE (E4).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from moejax import ops
from moejax.physics import collectives, gemm
from moejax.systems.epsmoe.config import EPSConfig


def gemm_kw(cfg: EPSConfig, sms) -> dict:
    dev, m = cfg.platform.device, cfg.model
    return dict(sms=sms, sm_total=cfg.sm_total, peak_flops=dev.flops("bf16"),
                memory_Bps=dev.memory_Bps, weight_bytes=m.weight_bytes, act_bytes=m.act_bytes,
                profile=cfg.profile)


def expert_gemm_s(cfg: EPSConfig, rows, switch_rows, ffn: int, sms):
    """GEMM time of groups of experts (rows [..., G]) under the configured kernel policy;
    returns (seconds [...], 1.0 where the dense kernel ran)."""
    h = cfg.model.hidden_size
    kw = gemm_kw(cfg, sms)
    t_group = gemm.ffn_time_s(rows, h, ffn, "group", **kw)
    t_dense = gemm.ffn_time_s(rows, h, ffn, "dense", **kw)
    if cfg.gemm == "group":
        use_dense = jnp.zeros_like(t_group)
    elif cfg.gemm == "dense":
        use_dense = jnp.ones_like(t_group)
    elif cfg.gemm == "threshold":  # 003 §3.2: DenseGemm when the rows per active expert are large
        active = (rows > 0).sum(-1)
        mean_rows = rows.sum(-1) / jnp.maximum(active, 1)
        use_dense = (mean_rows >= switch_rows).astype(jnp.float32)
    else:  # "adaptive": the faster kernel per load
        use_dense = (t_dense < t_group).astype(jnp.float32)
    return use_dense * t_dense + (1.0 - use_dense) * t_group, use_dense


def chunk_demand(cfg: EPSConfig, expert_ids, token_mask, scale):
    """(tokens sent [N, D(src), D(dst)] per chunk, deduplicated per (token, device, chunk);
    rows [D, E_loc] per (device, local expert)), both in real tokens (x scale)."""
    d, e_loc, pn = cfg.num_devices, cfg.local_experts, cfg.pn
    n_tok, k = expert_ids.shape
    valid = (expert_ids >= 0) & token_mask[:, None]
    ids = jnp.maximum(expert_ids, 0)
    dev = ids // e_loc
    local = ids % e_loc
    chunk = local // (e_loc // pn)
    owner = jnp.asarray(np.arange(n_tok) % d, jnp.int32)[:, None]
    key = dev * pn + chunk  # [N, K] (device, chunk) each choice needs
    earlier = np.tril(np.ones((k, k), bool), -1)  # [i, j]: j < i
    dup = ((key[:, :, None] == key[:, None, :]) & valid[:, None, :] & earlier).any(-1)
    first = valid & ~dup
    flat = jnp.where(valid, (chunk * d + owner) * d + dev, -1)
    sent = ops.bincount(flat, first, pn * d * d).reshape(pn, d, d).astype(jnp.float32)
    rows = ops.bincount(jnp.where(valid, dev * e_loc + local, -1), valid, d * e_loc)
    return sent * scale, rows.reshape(d, e_loc).astype(jnp.float32) * scale


def flow_shop_s(x, y):
    """Makespan of a two-resource flow shop (stage 1 times x [N], stage 2 times y [N], jobs
    in order, unlimited buffer): max_j sum_{c<=j} x_c + sum_{c>=j} y_c."""
    head = jnp.cumsum(x)
    tail = jnp.cumsum(y[::-1])[::-1]
    return jnp.max(head + tail)


def comm_slowdown(cfg: EPSConfig) -> float:
    """Factor on all2all time from its SMs (E14, 003 Fig. 7b): below `c_sat` SMs the comm
    kernel slows in proportion."""
    return max(1.0, cfg.c_sat / cfg.sm_comm)


def overlap_share(cfg: EPSConfig) -> float:
    """Share phi of the comm that can overlap a GEMM (E14, spec §5): 1 when the GEMM leaves
    the comm kernel its SMs (sm_gemm + sm_comm <= SMs); else (SMs - sm_gemm) / sm_comm,
    at least phi_min (003 §5.2 (3): with every SM on the GEMM the comm "cannot be scheduled")."""
    free = cfg.sm_total - cfg.gemm_sms
    if free >= cfg.sm_comm:
        return 1.0
    return max(cfg.phi_min, free / cfg.sm_comm)


def attention_s(cfg: EPSConfig, n_real, tp: bool, seq_len):
    """Attention block by roofline (E3, A4): compute split D ways; weights split D ways (TP)
    or replicated (DP). Causal prefill context seq_len / 2; GEMM efficiency eff_dense (FA3
    reaches ~0.75 of H100 peak, Shah et al. 2024)."""
    m, dev = cfg.model, cfg.platform.device
    d = cfg.num_devices
    ctx = seq_len / 2.0
    flops = n_real * (m.attention_flops_per_token + 4.0 * ctx * m.num_heads * m.head_dim) / d
    comp = flops / (dev.flops("bf16") * cfg.profile.eff_dense)
    w = m.attention_weight_bytes / (d if tp else 1)
    act = n_real / d * (2 * m.token_bytes + m.kv_bytes_per_token)
    return jnp.maximum(comp, (w + act) / dev.memory_Bps)


def shared_s(cfg: EPSConfig, n_real):
    """Shared experts (and Arctic's residual MLP) on each device's share of the tokens (serial
    after the routed experts, A14), dense kernel."""
    m = cfg.model
    if m.num_shared_experts == 0:
        return jnp.float32(0.0)
    rows = jnp.reshape(n_real / cfg.num_devices, (1,))
    t, _ = expert_gemm_s(dataclasses.replace(cfg, gemm="dense"), rows, 0.0,
                         m.shared_ffn_size * m.num_shared_experts, cfg.sm_total)
    return t


def local_reduce_s(cfg: EPSConfig, n_real):
    """LocalReduce (E11): read k expert outputs + write one per owned token, memory-bound."""
    m = cfg.model
    return n_real / cfg.num_devices * (m.top_k + 1) * m.token_bytes / cfg.platform.device.memory_Bps


def ring_s(cfg: EPSConfig, volume_bytes, steps: int):
    """`steps` ring steps of volume / D over all devices (reduce-scatter: D-1, all-reduce:
    2 (D-1)), one collective call (alpha) per D-1 steps; and bytes one device sends."""
    d = cfg.num_devices
    groups = np.arange(d)[None, :]
    step = collectives.ring_step_traffic(groups, volume_bytes / d, d)
    t = steps * collectives.phase_time_s(step, cfg.topo) + cfg.alpha_s * steps / (d - 1)
    return t, steps * volume_bytes / d


def block(cfg: EPSConfig, expert_ids, token_mask, scale, switch_rows, seq_len=None):
    """Metrics of one block (attention + MoE) for one layer's routing (hard mode); seq_len
    (traced) defaults to the config's."""
    seq_len = cfg.seq_len if seq_len is None else seq_len
    m = cfg.model
    d = cfg.num_devices
    n_real = token_mask.sum() * scale
    full_bytes = n_real * m.token_bytes  # every token's hidden state (P of §4.2)
    if cfg.mode == "tp-tp":
        return _tp_tp(cfg, expert_ids, token_mask, scale, switch_rows, n_real, full_bytes,
                      seq_len)
    sent, rows = chunk_demand(cfg, expert_ids, token_mask, scale)  # [N, D, D], [D, E_loc]
    traffic = sent * cfg.comm_token_bytes
    x_raw = (jax.vmap(lambda t: collectives.all_to_all_time_s(t, cfg.topo))(traffic)
             + jax.vmap(lambda t: collectives.all_to_all_time_s(t.T, cfg.topo))(traffic))
    pipelined = cfg.pn > 1 and cfg.overlap
    x = x_raw * comm_slowdown(cfg) + 2.0 * cfg.alpha_s
    g = cfg.local_experts // cfg.pn
    rows_c = rows.reshape(d, cfg.pn, g)
    sms = cfg.gemm_sms if pipelined else cfg.sm_total
    t_dc, dense = expert_gemm_s(cfg, rows_c, switch_rows, m.expert_ffn_size, sms)  # [D, N]
    y = t_dc.max(0)
    if pipelined:  # the share of comm that cannot overlap runs exposed (serial)
        phi = overlap_share(cfg)
        core = flow_shop_s(phi * x, y) + (1.0 - phi) * x.sum()
    else:
        core = x.sum() + y.sum()
    core = core + cfg.chunk_overhead_s * (cfg.pn - 1)
    a2a_bytes = 2.0 * traffic.sum(0) * (1.0 - jnp.eye(d))  # dispatch + combine
    bytes_dev = a2a_bytes.sum(-1).mean()
    comm = x.sum()
    tp = cfg.mode == "tp-ep"
    if tp:  # E6: reduce-scatter before dispatch, all-gather after combine
        rs, rs_b = ring_s(cfg, full_bytes, d - 1)
        core = core + 2.0 * rs
        comm = comm + 2.0 * rs
        bytes_dev = bytes_dev + 2.0 * rs_b
    tail = local_reduce_s(cfg, n_real) + shared_s(cfg, n_real)
    att = attention_s(cfg, n_real, tp, seq_len)
    moe = core + tail
    compute = y.sum() + tail
    return {
        "block_s": att + moe,
        "attention_s": att,
        "moe_s": moe,
        "comm_s": comm,
        "compute_s": compute,
        "exposed_comm_s": moe - compute,
        "bytes_per_device": bytes_dev,
        "dense_fraction": dense.mean(),
        "chunk_comm_s": x,
        "chunk_gemm_s": y,
    }


def _tp_tp(cfg: EPSConfig, expert_ids, token_mask, scale, switch_rows, n_real, full_bytes,
           seq_len):
    """E4: attention TP, MoE TP (every device runs all tokens of every expert on ffn / D
    columns), a ring all-reduce after attention and after the MoE (vLLM's baseline)."""
    m = cfg.model
    d = cfg.num_devices
    valid = (expert_ids >= 0) & token_mask[:, None]
    rows = ops.bincount(jnp.where(valid, expert_ids, -1), valid, m.num_experts)
    rows = rows.astype(jnp.float32) * scale
    gemm_t, dense = expert_gemm_s(cfg, rows, switch_rows, m.expert_ffn_size // d, cfg.sm_total)
    ar, ar_b = ring_s(cfg, full_bytes, 2 * (d - 1))
    shared = jnp.float32(0.0)
    if m.num_shared_experts:
        t, _ = expert_gemm_s(dataclasses.replace(cfg, gemm="dense"),
                             jnp.reshape(n_real, (1,)), 0.0,
                             m.shared_ffn_size * m.num_shared_experts // d, cfg.sm_total)
        shared = t
    tail = local_reduce_s(cfg, n_real * d) + shared  # every device reduces all tokens
    att = attention_s(cfg, n_real, True, seq_len)
    moe = gemm_t + tail + ar
    return {
        "block_s": att + moe + ar,
        "attention_s": att,
        "moe_s": moe,
        "comm_s": 2.0 * ar,
        "compute_s": gemm_t + tail,
        "exposed_comm_s": 2.0 * ar,
        "bytes_per_device": 2.0 * ar_b,
        "dense_fraction": dense.mean(),
        "chunk_comm_s": jnp.zeros((1,)) + 2.0 * ar,
        "chunk_gemm_s": jnp.reshape(gemm_t, (1,)),
    }


def pipeline_gain_s(c_s, n, overhead_s):
    """E12 (003 §5.2 (5)): overlap gain L - R with L = C (N-1) / N (C = min(T_comm, T_comp))
    and R = overhead (N - 1) (A5: zero at N = 1)."""
    n = jnp.asarray(n, jnp.float32)
    return c_s * (n - 1.0) / n - overhead_s * (n - 1.0)


def heuristic_pn(c_s: float, overhead_s: float, local_experts: int) -> tuple[float, int]:
    """The paper's optimum N* = sqrt(C / k) (E12), clipped to [1, E_loc], and the divisor of
    E_loc with the largest gain (A3)."""
    import math

    cont = min(max(math.sqrt(c_s / overhead_s), 1.0), float(local_experts))
    divs = [i for i in range(1, local_experts + 1) if local_experts % i == 0]
    best = max(divs, key=lambda n: c_s * (n - 1) / n - overhead_s * (n - 1))
    return cont, best
