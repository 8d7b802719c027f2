"""Timing of one wafer layer (001 §II-B Fig. 5, §IV, §V-A).

Attention (DP over TP groups, TP inside each group) by roofline, then the TP all-reduce
(`allreduce`); dispatch all-to-all (`traffic`), experts by roofline on each device, combine
all-to-all; under ESP (001 §VI-B5) the EP group's ring collectives around the expert slices
(`esp`). Attention with its all-reduce, and dispatch / experts / combine, are pipelined over
micro-batches (PipeMoE-like, §V-A Fig. 11(e), §VI-B), at the best count of `micro_batches`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from moejax import relax
from moejax.physics import eq1
from moejax.physics.roofline import device_compute_s, device_memory_s
from moejax.systems.wafer.allreduce import allreduce_unit_phases
from moejax.systems.wafer.config import WaferConfig, WaferParams, time_scale_s
from moejax.systems.wafer.esp import esp_ring
from moejax.systems.wafer.traffic import all_to_all_parts


def stage_s(busy, lat, ports, mb, tau=0.0):
    """[M] seconds per micro-batch of one communication stage for each count in mb [M, 1]:
    cut-through busy / m + latency, or Eq. 1 (ports = (bw [Pt], latency [Pt])) the busiest
    port with 1/m of every transfer."""
    if ports is None:
        return (busy / mb + lat)[:, 0]
    return eq1.time_s(ports[0][None, :], ports[1][None, :], mb, tau)


def pipeline_stages_s(stages, tau=0.0):
    """(sum over the stages [M], slowest stage [M]) of per-micro-batch stage times [S, M].

    A pipeline of S stages over m micro-batches takes one pass of every stage plus (m - 1)
    passes of its slowest one (PipeMoE-like, 001 §V-A).
    """
    st = jnp.stack(stages)
    return st.sum(0), relax.max(st, tau, axis=0)


# --- compute -------------------------------------------------------------------------------


def expert_device_s(cfg: WaferConfig, tokens_ed, tau_s, tau_tok):
    """Per-device routed-expert time [D]: roofline per hosted expert, and its compute part.

    tokens_ed [E, D]: tokens expert e processes on device d (in full-expert units; under ESP
    1/S of the expert's tokens, i.e. all of them on a 1/S slice). An expert that received a
    token reads its weights (its slice under ESP) once (INT8 linear layers, 001 §VI-A).
    """
    m, dev = cfg.model, cfg.platform.device
    share = 1.0 / cfg.expert_shards if cfg.expert_shards else 1.0
    comp = device_compute_s(tokens_ed * m.expert_flops_per_token, dev, cfg.expert_dtype,
                            "grouped")
    mem = device_memory_s(relax.positive(tokens_ed, tau_tok) * m.expert_weight_bytes * share,
                          dev)
    return relax.maximum(comp, mem, tau_s).sum(0), comp.sum(0)


def is_binary(x):
    """Scalar bool: every entry of x is 0 or 1 (a hard host / placement matrix)."""
    return jnp.all((x == 0.0) | (x == 1.0))


def expert_times(cfg: WaferConfig, host, counts, tau_s, tau_tok, binary):
    """(t_dev [D], compute part [D], tokens [D]) of `expert_device_s` for served_share(host).

    Hosts split an expert's tokens evenly, tokens_ed = c_e / n_e * host_ed, so the linear
    parts are matrix-vector products with host. With a 0/1 host in hard mode (`binary`,
    a scalar; exact) every hosted copy costs g_e = max(k1 c_e / n_e, k2) when c_e > 0, and
    t_dev = g @ host: no [E, D] elementwise pass. Otherwise the dense roofline runs.
    """
    m, dev = cfg.model, cfg.platform.device
    ce = counts / jnp.maximum(host.sum(-1), 1e-30)  # tokens per copy of each expert
    tokens = ce @ host
    comp = device_compute_s(tokens * m.expert_flops_per_token, dev, cfg.expert_dtype, "grouped")

    def fast():
        g = jnp.where(ce > 0, jnp.maximum(
            device_compute_s(ce * m.expert_flops_per_token, dev, cfg.expert_dtype, "grouped"),
            device_memory_s(m.expert_weight_bytes, dev)), 0.0)
        return g @ host

    def dense():
        return expert_device_s(cfg, ce[:, None] * host, tau_s, tau_tok)[0]

    t_dev = jax.lax.cond(binary & (jnp.asarray(tau_tok) <= 0), fast, dense)
    return t_dev, comp, tokens


def attention_s(cfg: WaferConfig, n_tokens, tau_s):
    """One attention block per TP group member (roofline): DP over groups, TP inside."""
    m, dev = cfg.model, cfg.platform.device
    n_groups, g = cfg.mapping.groups.shape
    tok = n_tokens / n_groups
    ctx = m.context_tokens(cfg.context_len if cfg.context_len > 0 else tok / 2)
    flops = tok * (m.attention_flops_per_token + ctx * m.attention_context_flops) / g
    kv = tok * ctx * m.kv_bytes_per_token * (cfg.context_len > 0)
    bytes_ = (m.attention_weight_bytes + kv) / g
    comp = device_compute_s(flops, dev, cfg.attention_dtype)
    return relax.maximum(comp, device_memory_s(bytes_, dev), tau_s)


# --- one layer -----------------------------------------------------------------------------


def layer(cfg: WaferConfig, params: WaferParams, host, expert_ids, token_mask, counts,
          binary=None):
    """Timing of one layer (attention + all-reduce, dispatch + experts + combine).

    host [E, D] 0/1 hosts (native + shadow; soft rows split an expert). binary: scalar bool
    "host is 0/1" when the caller knows it without looking at a batched host (None: checked
    here). Returns a dict of scalars and arrays.

    One `relax.branch` around the whole layer: in hard mode (tau = 0) every relax op takes
    its hard form statically and XLA fuses the layer into plain arithmetic (a traced tau in
    each op would put a `lax.cond` around each one, cutting the fusion).
    """
    return relax.branch(params.tau, lambda tau: _layer(cfg, params, tau, host, expert_ids,
                                                       token_mask, counts, binary))


def _layer(cfg: WaferConfig, params: WaferParams, tau, host, expert_ids, token_mask, counts,
           binary):
    """`layer` at temperature tau (a Python 0.0 in hard mode, else a traced scalar)."""
    tau_s = tau * time_scale_s(cfg)
    topo = cfg.topo
    n_tokens = counts.sum() / cfg.model.top_k
    served, a2a = all_to_all_parts(cfg, host, expert_ids, token_mask, counts, tau_s)
    d_busy, d_lat, d_loads = a2a["d_busy"], a2a["d_lat"], a2a["d_loads"]
    c_busy, c_lat, c_loads = a2a["c_busy"], a2a["c_lat"], a2a["c_loads"]
    esp_ports = None
    if cfg.expert_shards:  # 001 §VI-B5
        esp_loads, esp_busy, esp_lat, esp_ports = esp_ring(cfg, a2a["vol"], tau_s)
        tokens_ed = counts[:, None] * served
        t_dev, c_dev = expert_device_s(cfg, tokens_ed, tau_s, tau)
        dev_tokens = tokens_ed.sum(0)
    else:
        binary = is_binary(host) if binary is None else binary
        t_dev, c_dev, dev_tokens = expert_times(cfg, host, counts, tau_s, tau, binary)
    t_exp = relax.max(t_dev, tau_s)
    ar_busy = jnp.float32(0.0)
    ar_lat = jnp.float32(0.0)
    ar_loads = jnp.zeros(topo.num_links)
    bw = jnp.asarray(topo.sustained_Bps, jnp.float32)
    mb = jnp.asarray(cfg.micro_batches, jnp.float32)[:, None]
    on = (n_tokens > 0).astype(jnp.float32)
    ar_stage = jnp.zeros(mb.shape[0])
    hard = isinstance(tau, float) and tau == 0.0
    for steps, unit_loads, lat, ports in allreduce_unit_phases(cfg):  # linear in n_tokens
        if hard and ports is not None:  # one ring step scales as a whole: its busiest-port
            ports = eq1.envelope(*ports)  # candidates (exact in hard mode)
        loads = n_tokens * jnp.asarray(unit_loads, jnp.float32)
        b = relax.max(loads / bw, tau_s, axis=-1) * on
        ar_busy, ar_lat = ar_busy + steps * b, ar_lat + steps * lat * on
        ar_loads = ar_loads + steps * loads
        if ports is not None:  # 001 Eq. 1: each ring step is one phase of transfers
            pp = (n_tokens * jnp.asarray(ports[0], jnp.float32),
                  on * jnp.asarray(ports[1], jnp.float32))
            ar_stage = ar_stage + steps * stage_s(0.0, 0.0, pp, mb, tau_s)
    if not cfg.eq1:
        ar_stage = stage_s(ar_busy, ar_lat, None, mb)
    att = attention_s(cfg, n_tokens, tau_s)
    att_sum, att_max = pipeline_stages_s([att / mb[:, 0], ar_stage], tau_s)
    att_phase = att_sum + (mb[:, 0] - 1) * att_max
    d_stage = stage_s(d_busy, d_lat, a2a["d_ports"], mb, tau_s)
    c_stage = stage_s(c_busy, c_lat, a2a["c_ports"], mb, tau_s)
    if cfg.expert_shards:  # dispatch, all-gather, expert slices, reduce-scatter, combine
        e_stage = esp_busy / mb[:, 0] + esp_lat if esp_ports is None else (
            (cfg.expert_shards - 1) * stage_s(0.0, 0.0, esp_ports, mb, tau_s))
        stages = [d_stage, e_stage, t_exp / mb[:, 0], e_stage, c_stage]
        esp_s = 2.0 * (esp_busy + esp_lat) if esp_ports is None else 2.0 * (
            cfg.expert_shards - 1) * eq1.time_s(*esp_ports, 1.0, tau_s)
        esp_bytes = 2.0 * esp_loads
    else:
        stages = [d_stage, t_exp / mb[:, 0], c_stage]
        esp_s = jnp.float32(0.0)
        esp_bytes = jnp.zeros(topo.num_links)
    moe_sum, moe_max = pipeline_stages_s(stages, tau_s)
    moe_phase = moe_sum + (mb[:, 0] - 1) * moe_max
    if cfg.eq1 and 1 in cfg.micro_batches:  # one pass (m = 1): the stages' m = 1 entry
        i1 = cfg.micro_batches.index(1)
        d_all, c_all, ar_all = d_stage[i1], c_stage[i1], ar_stage[i1]
    if cfg.eq1:  # one pass (m = 1) of each collective, reported like the link-load mode
        if 1 not in cfg.micro_batches:
            d_all = eq1.time_s(*a2a["d_ports"], 1.0, tau_s)
            c_all = eq1.time_s(*a2a["c_ports"], 1.0, tau_s)
            ar_all = jnp.float32(0.0)
            for steps, _, _, ports in allreduce_unit_phases(cfg):
                ar_all = ar_all + steps * eq1.time_s(
                    n_tokens * jnp.asarray(ports[0], jnp.float32),
                    on * jnp.asarray(ports[1], jnp.float32), 1.0, tau_s)
        a2a_s, disp_s, ar_s, a2a_busy, ar_busy_s = d_all + c_all, d_all, ar_all, \
            d_all + c_all, ar_all
    else:
        a2a_s, disp_s, ar_s = d_busy + d_lat + c_busy + c_lat, d_busy + d_lat, ar_busy + ar_lat
        a2a_busy, ar_busy_s = d_busy + c_busy, ar_busy
    total = att_phase + moe_phase
    best = relax.argmin_onehot(total, tau_s)
    return {
        "layer_s": (best * total).sum(),
        "attention_phase_s": (best * att_phase).sum(),
        "moe_phase_s": (best * moe_phase).sum(),
        "micro_batches": (best * mb[:, 0]).sum(),
        "all_to_all_s": a2a_s,
        "dispatch_s": disp_s,
        "all_reduce_s": ar_s,
        "esp_reduce_s": esp_s,
        "esp_link_bytes": esp_bytes,
        "attention_s": att,
        "moe_compute_s": t_exp,
        "avg_hops": a2a["avg_hops"],
        "remote_bytes": a2a["remote_bytes"],
        "a2a_link_bytes": d_loads + c_loads,
        "ar_link_bytes": ar_loads,
        "a2a_busy_s": a2a_busy,
        "ar_busy_s": ar_busy_s,
        "device_tokens": dev_tokens,
        "device_busy_s": t_dev,
        "device_compute_s": c_dev,
    }
