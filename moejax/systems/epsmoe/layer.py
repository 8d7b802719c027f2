"""One transformer block of a prefill forward under TP+TP, DP+EP or TP+EP, with the expert
pipeline of EPS-MoE (003 §4.2-4.4, §5.2), from one layer's routing (hard mode).

Tokens: slot n is owned (after attention, or after TP+EP's reduce-scatter) by device n mod D;
each simulated token stands for `scale` real tokens. Experts sit in contiguous blocks of
E_loc per device; pipeline chunk c is the c-th group of E_loc / N local experts on every
device (§4.3 "expert groups", E11), unless the config gives a chunk assignment or the
tuning system relaxes it (beyond 003: `assignment.py`, a separate code path).

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

import functools

import jax
import jax.numpy as jnp
import numpy as np

from moejax import ops
from moejax.physics import collectives, comm, gemm
from moejax.systems.epsmoe import assignment
from moejax.systems.epsmoe.config import EPSConfig, EPSParams


def chunk_matrix(cfg: EPSConfig, pn):
    """[E_loc (local expert), E_loc (chunk)] one-hot: local expert j is in chunk
    j // (E_loc / N) (chunks c >= N stay empty); pn traced."""
    e_loc = cfg.local_experts
    g = e_loc // jnp.maximum(pn.astype(jnp.int32), 1)
    chunk = jnp.arange(e_loc) // g
    return (chunk[:, None] == jnp.arange(e_loc)[None, :]).astype(jnp.float32), chunk


def ffn_chunk_s(cfg: EPSConfig, p: EPSParams, rows, onehot, ffn: int, sms):
    """GEMM seconds of each chunk ([..., C]) of the experts in `rows` [..., E] grouped by
    `onehot` [E, C] (or per device, [D, E, C]: a chunk assignment, `assignment.py`), under
    the kernel policy `p.kernel`; and 1.0 where dense ran."""
    dev, m, prof = cfg.platform.device, cfg.model, cfg.profile
    h, peak = m.hidden_size, dev.flops("bf16")
    used = (rows > 0).astype(jnp.float32)
    if onehot.ndim == 2:  # one grouping for every device (the paper's; the shipped path)
        grp = lambda x: x @ onehot  # noqa: E731
    else:
        grp = lambda x: assignment.group(x, onehot)  # noqa: E731
    soft = "assignment" in cfg.relaxed  # tuning: smooth wave staircase at p.tau
    t_g = t_d = 0.0
    for k_dim, n_out, times in ((h, ffn, 2.0), (ffn, h, 1.0)):  # gate + up, down
        tiles_e = gemm.tiles(rows, n_out, prof)
        bytes_e = gemm.gemm_bytes(rows, k_dim, n_out, m.weight_bytes, m.act_bytes)
        tt_g = gemm.tile_time_s(k_dim, peak, cfg.sm_total, prof.mma_group, prof, sms)
        any_c = (grp(rows) > 0).astype(jnp.float32)
        if soft:  # gemm.kernel_time_s with soft_ceil for its ceil (exact at tau = 0)
            comp = assignment.soft_ceil(grp(tiles_e) / sms, p.tau) * tt_g
            t_k = any_c * prof.launch_s + jnp.maximum(
                comp, grp(bytes_e) / dev.memory_Bps) * (any_c > 0)
        else:
            t_k = gemm.kernel_time_s(grp(tiles_e), grp(bytes_e), any_c, tt_g, sms,
                                     dev.memory_Bps, prof.launch_s)
        t_g = t_g + times * t_k
        t_d = t_d + times * grp(gemm.dense_expert_time_s(rows, k_dim, n_out,
                                                         **gemm_kw(cfg, sms)))
    mean_rows = grp(rows) / jnp.maximum(grp(used), 1.0)
    k = p.kernel
    by_rows = (mean_rows >= p.switch_rows).astype(jnp.float32)
    by_time = (t_d < t_g).astype(jnp.float32)
    if "switch_rows" in cfg.relaxed:  # tuning: sigmoid gates in log space (width e^tau)
        tau = jnp.maximum(p.tau, 1e-6)
        log = lambda x: jnp.log(jnp.maximum(x, 1e-12))  # noqa: E731
        by_rows = jnp.where(p.tau > 0, jax.nn.sigmoid(
            (log(mean_rows) - log(p.switch_rows)) / tau), by_rows)
        by_time = jnp.where(p.tau > 0, jax.nn.sigmoid((log(t_g) - log(t_d)) / tau), by_time)
    use_dense = jnp.where(k == 1, 1.0, jnp.where(k == 2, by_rows,
                                                 jnp.where(k == 3, by_time, 0.0)))
    return use_dense * t_d + (1.0 - use_dense) * t_g, use_dense


def gemm_kw(cfg: EPSConfig, sms) -> dict:
    """Keywords of the dense kernel (`gemm.dense_expert_time_s`): its own tile schedule."""
    dev, m = cfg.platform.device, cfg.model
    return dict(sms=sms, sm_total=cfg.sm_total, peak_flops=dev.flops("bf16"),
                memory_Bps=dev.memory_Bps, weight_bytes=m.weight_bytes, act_bytes=m.act_bytes,
                profile=cfg.dense_profile)


def dense_ffn_s(cfg: EPSConfig, rows, ffn: int):
    """Dense kernel on one row block (shared experts), every SM."""
    h = cfg.model.hidden_size
    kw = gemm_kw(cfg, cfg.sm_total)
    return (2.0 * gemm.dense_expert_time_s(rows, h, ffn, **kw)
            + gemm.dense_expert_time_s(rows, ffn, h, **kw))


def chunk_demand(cfg: EPSConfig, expert_ids, token_mask, scale, pn):
    """(tokens sent [C, D(src), D(dst)] per chunk (C = E_loc; chunks >= N empty),
    deduplicated per (token, device, chunk) (E11 read literally, `cfg.resend`), or per
    (token, device) with the earliest chunk that needs it (`resend = False`: the other
    reading, dispatch volume independent of N); rows [D, E_loc] per (device, local
    expert)), both in real tokens (x scale)."""
    d, e_loc = cfg.num_devices, cfg.local_experts
    n_tok, k = expert_ids.shape
    g = e_loc // jnp.maximum(jnp.asarray(pn).astype(jnp.int32), 1)  # experts per chunk
    e = jnp.arange(d * e_loc, dtype=jnp.int32)
    # [E] table: expert -> chunk * D * D + device (its bin in [C, D(src), D(dst)] less the
    # owner's D). One gather instead of integer div / mod per choice: XLA's CPU loop
    # fusions recompute those per compare below, which made this histogram ~1.7x slower
    bin_of = (e % e_loc) // g * (d * d) + e // e_loc
    valid = (expert_ids >= 0) & token_mask[:, None]
    ids = jnp.maximum(expert_ids, 0)
    owner = jnp.asarray(np.arange(n_tok) % d * d, jnp.int32)[:, None]
    # key per choice; within a token (one owner) equal keys <=> equal (device, chunk);
    # materialized once (the barrier keeps the compares from recomputing it)
    key = jax.lax.optimization_barrier(jnp.where(valid, bin_of[ids] + owner, -1))
    cols = [key[:, a] for a in range(k)]  # [N] each, unrolled over the static top-k slots
    if cfg.resend:  # choice a is the first of its (device, chunk): no earlier b shares it
        dups = [jnp.zeros_like(cols[0], bool)] + [
            functools.reduce(jnp.logical_or, [cols[a] == cols[b] for b in range(a)])
            for a in range(1, k)]
    else:  # send once per (token, device), with the earliest chunk needing it: a is a
        # duplicate if a valid b on the same device has a lower chunk (a lower key, the
        # owner being shared), or the same chunk and b < a
        dups = [functools.reduce(jnp.logical_or, [
            (cols[b] >= 0) & ((cols[a] - cols[b]) % d == 0)
            & ((cols[b] < cols[a]) | ((cols[b] == cols[a]) if b < a else False))
            for b in range(k) if b != a]) for a in range(k)]
    # duplicates get key -1 (dropped); the scatter's weights are the kept keys
    sent_keys = jnp.stack([jnp.where(dup, -1, c) for dup, c in zip(dups, cols, strict=True)],
                          -1)
    sent = ops.bincount(sent_keys, sent_keys >= 0, e_loc * d * d)
    sent = sent.reshape(e_loc, d, d).astype(jnp.float32)
    rows = ops.bincount(jnp.where(valid, ids, -1), valid, d * e_loc)  # expert = dev * E_loc + j
    return sent * scale, rows.reshape(d, e_loc).astype(jnp.float32) * scale


def flow_shop_s(x, y):
    """Makespan of a two-resource flow shop (stage 1 times x [N], stage 2 times y [N], jobs
    in order, unlimited buffer): max_j sum_{c<=j} x_c + sum_{c>=j} y_c. Trailing empty jobs
    (x = y = 0) do not change it."""
    head = jnp.cumsum(x)
    tail = jnp.cumsum(y[::-1])[::-1]
    return jnp.max(head + tail)


def comm_slowdown(cfg: EPSConfig, sm_comm):
    """Factor on all2all time from its SMs (E14, 003 Fig. 7b): below `c_sat` SMs the comm
    kernel slows in proportion."""
    return jnp.maximum(1.0, cfg.c_sat / sm_comm)


def gemm_sms(cfg: EPSConfig, sm_gemm):
    return jnp.where(sm_gemm > 0, sm_gemm, jnp.float32(cfg.sm_total))


def overlap_share(cfg: EPSConfig, sm_gemm, sm_comm):
    """Share phi of the comm that can overlap a GEMM (E14, spec §5): 1 when the GEMM leaves
    the comm kernel its SMs (sm_gemm + sm_comm <= SMs); else (SMs - sm_gemm) / sm_comm,
    at least phi_min (003 §5.2 (3): with every SM on the GEMM the comm "cannot be scheduled")."""
    free = cfg.sm_total - gemm_sms(cfg, sm_gemm)
    return jnp.where(free >= sm_comm, 1.0, jnp.maximum(cfg.phi_min, free / sm_comm))


def attention_s(cfg: EPSConfig, n_real, tp: bool, seq_len):
    """Attention block by roofline (E3, A4): compute split D ways; weights split D ways (TP)
    or replicated (DP). Causal prefill context seq_len / 2; GEMM efficiency eff_dense (FA3
    reaches ~0.75 of H100 peak, Shah et al. 2024)."""
    m, dev = cfg.model, cfg.platform.device
    d = cfg.num_devices
    ctx = m.context_tokens(seq_len / 2.0)
    flops = n_real * (m.attention_flops_per_token + ctx * m.attention_context_flops) / d
    comp = flops / (dev.flops("bf16") * cfg.profile.eff_dense)
    w = m.attention_weight_bytes / (d if tp else 1)
    act = n_real / d * (2 * m.token_bytes + m.kv_bytes_per_token)
    return jnp.maximum(comp, (w + act) / dev.memory_Bps)


def shared_s(cfg: EPSConfig, rows, split: int = 1):
    """Shared experts (and Arctic's residual MLP) on `rows` tokens with ffn / split columns
    (serial after the routed experts, A14), dense kernel."""
    m = cfg.model
    if m.num_shared_experts == 0:
        return jnp.float32(0.0)
    return dense_ffn_s(cfg, rows, m.shared_ffn_size * m.num_shared_experts // split)


def local_reduce_s(cfg: EPSConfig, tokens):
    """LocalReduce (E11): read k expert outputs + write one per token, memory-bound."""
    m = cfg.model
    return tokens * (m.top_k + 1) * m.token_bytes / cfg.platform.device.memory_Bps


def ring_s(cfg: EPSConfig, volume_bytes, steps: int):
    """`steps` ring steps of volume / D over all devices (reduce-scatter: D-1, all-reduce:
    2 (D-1)), one collective call (alpha) per D-1 steps; and bytes one device sends."""
    d = cfg.num_devices
    groups = np.arange(d)[None, :]
    step = collectives.ring_step_traffic(groups, volume_bytes / d, d)
    t = steps * collectives.phase_time_s(step, cfg.topo) + cfg.alpha_s * steps / (d - 1)
    return t, steps * volume_bytes / d


def a2a_s(cfg: EPSConfig, traffic):
    """Seconds of one all-to-all of `traffic` [D, D] bytes (`physics.comm`, the primitive
    every system prices its dispatch and combine with)."""
    return comm.alltoall_time_s(traffic, cfg.topo)


def block(cfg: EPSConfig, p: EPSParams, expert_ids, token_mask, scale):
    """Metrics of one block (attention + MoE) for one layer's routing (hard mode)."""
    m = cfg.model
    d, e_loc = cfg.num_devices, cfg.local_experts
    n_real = token_mask.sum() * scale
    full_bytes = n_real * m.token_bytes  # every token's hidden state (P of §4.2)
    if cfg.mode == "tp-tp":
        return _tp_tp(cfg, p, expert_ids, token_mask, scale, n_real, full_bytes)
    pn = p.pn
    onehot, _ = chunk_matrix(cfg, pn)
    if "assignment" in cfg.relaxed or cfg.chunk_assignment:  # beyond 003 (`assignment.py`)
        probs = (assignment.chunk_probs(p.assign, onehot) if "assignment" in cfg.relaxed
                 else assignment.hard_probs(cfg))  # [D, E_loc, C]
        sent, rows = assignment.expected_demand(cfg, expert_ids, token_mask, scale, probs)
        onehot = probs
    else:  # the paper's equal contiguous groups
        sent, rows = chunk_demand(cfg, expert_ids, token_mask, scale, pn)  # [C, D, D], [D, E]
    tok_bytes = m.hidden_size * jnp.where(p.fp8_comm > 0, 1.0, m.act_bytes)
    traffic = sent * tok_bytes
    x_raw = jax.vmap(lambda t: a2a_s(cfg, t) + a2a_s(cfg, t.T))(traffic)
    active = (jnp.arange(e_loc) < pn).astype(jnp.float32)
    x = active * (x_raw * comm_slowdown(cfg, p.sm_comm) + 2.0 * cfg.alpha_s)
    pipelined = (pn > 1) & (p.overlap > 0)
    sms = jnp.where(pipelined, gemm_sms(cfg, p.sm_gemm), jnp.float32(cfg.sm_total))
    t_dc, dense = ffn_chunk_s(cfg, p, rows, onehot, m.expert_ffn_size, sms)  # [D, C]
    y = t_dc.max(0)
    phi = overlap_share(cfg, p.sm_gemm, p.sm_comm)
    core = jnp.where(pipelined, flow_shop_s(phi * x, y) + (1.0 - phi) * x.sum(),
                     x.sum() + y.sum())
    core = core + cfg.chunk_overhead_s * (pn - 1.0)
    a2a_bytes = 2.0 * traffic.sum(0) * (1.0 - jnp.eye(d))  # dispatch + combine
    bytes_dev = a2a_bytes.sum(-1).mean()
    comm = x.sum()
    tp = cfg.mode == "tp-ep"
    if tp:  # E6: reduce-scatter before dispatch, all-gather after combine
        rs, rs_b = ring_s(cfg, full_bytes, d - 1)
        core = core + 2.0 * rs
        comm = comm + 2.0 * rs
        bytes_dev = bytes_dev + 2.0 * rs_b
    tail = local_reduce_s(cfg, n_real / d) + shared_s(cfg, jnp.reshape(n_real / d, (1,)))
    tail = jnp.sum(tail)
    att = attention_s(cfg, n_real, tp, p.seq_len)
    moe = core + tail
    compute = y.sum() + tail
    n_chunks = jnp.maximum(pn, 1.0)
    return {
        "block_s": att + moe,
        "attention_s": att,
        "moe_s": moe,
        "comm_s": comm,
        "compute_s": compute,
        "exposed_comm_s": moe - compute,
        "bytes_per_device": bytes_dev,
        "dense_fraction": (dense * active).sum() / (d * n_chunks),
        "a2a_s": x.sum(),  # the pipelined all2alls (dispatch + combine)
        "gemm_s": y.sum(),
        "chunk_comm_s": x,
        "chunk_gemm_s": y,
    }


def _tp_tp(cfg: EPSConfig, p: EPSParams, expert_ids, token_mask, scale, n_real, full_bytes):
    """E4: attention TP, MoE TP (every device runs all tokens of every expert on ffn / D
    columns), a ring all-reduce after attention and after the MoE (vLLM's baseline)."""
    m = cfg.model
    d = cfg.num_devices
    valid = (expert_ids >= 0) & token_mask[:, None]
    rows = ops.bincount(jnp.where(valid, expert_ids, -1), valid, m.num_experts)
    rows = rows.astype(jnp.float32) * scale
    one = jnp.ones((m.num_experts, 1), jnp.float32)  # all experts in one group
    gemm_t, dense = ffn_chunk_s(cfg, p, rows, one, m.expert_ffn_size // d,
                                jnp.float32(cfg.sm_total))
    gemm_t = gemm_t[0]
    ar, ar_b = ring_s(cfg, full_bytes, 2 * (d - 1))
    shared = jnp.sum(shared_s(cfg, jnp.reshape(n_real, (1,)), d))
    tail = local_reduce_s(cfg, n_real) + shared  # every device reduces all tokens
    att = attention_s(cfg, n_real, True, p.seq_len)
    moe = gemm_t + tail + ar
    return {
        "block_s": att + moe + ar,
        "attention_s": att,
        "moe_s": moe,
        "comm_s": 2.0 * ar,
        "compute_s": gemm_t + tail,
        "exposed_comm_s": 2.0 * ar,
        "bytes_per_device": 2.0 * ar_b,
        "dense_fraction": dense[0],
        "a2a_s": jnp.float32(0.0),
        "gemm_s": gemm_t,
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
