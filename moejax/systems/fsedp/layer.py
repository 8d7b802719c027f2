"""One FSE-DP MoE layer as an event-driven simulation: Algorithm 1 + Rules 1-5 (000 §IV, §V-A).

Model (the same rules as `reference.py`, which is a plain-Python event loop):

* Tokens stay on the chiplet that owns them (token n on die n mod D; no redistribution in
  A2-A5, §IV-C "FSE-DP no longer needs token redistribution"). `tok[d, e]` tokens of die d
  chose expert e. The trajectory T_e of expert e is the set of dies holding its tokens,
  visited in logical-ring order (snake order over the mesh, §VI-A).
* An expert is cut into M micro-slices (§IV, §IV-C). Under Rules 1-3 every micro-slice is
  computed at each die of T_e as soon as it arrives and forwarded at once (eager usage,
  Fig. 4b), then released after its last visit (Rule 3); Rule 4 loads micro-slices from
  each die's DDR channel whenever buffer space is free, so any die of T_e with space loads
  the expert's next micro-slice: its DDR load is pooled over T_e (a die shared by c streams
  serves each 1/c, re-split at every event). At expert granularity this is a pipeline
  whose rate is set by its bottleneck resource: per die, compute (tokens x FLOPs plus
  `ctrl_overhead_s` per micro-slice visit), DDR (its part of the pooled load), and D2D
  send (W (|T_e| - 1) / |T_e| bytes, x hops to the ring successor). Concurrent experts
  share dies (flow fusion, §IV-B): every running expert advances at
  1 / max over the resources it uses of the summed demand of all running experts on that
  resource, so experts sharing a bottleneck finish together ("max of sums", Fig. 6).
  A finished stream then drains for the pipeline tail P_e: the stages of one micro-slice
  (its load unless pre-loaded, |T_e| - 1 D2D hops, one compute) less the longest of
  them, which the stream already holds (`pipeline_tail`).
* Buffers (§IV-B): a running expert keeps 2 micro-slices per trajectory die (one computed
  and forwarded, one received: Fig. 4b); DDR bandwidth left over by running experts
  pre-loads the first pending expert into free space (Algorithm 1 line 12, Rule 4). An
  expert starts only if its slots fit. Rule 5 (A4): the remaining DDR load of a starting
  expert is spread over T_e in proportion to each die's free space instead of evenly.
* Algorithm 1: experts are ordered (paired-load, §IV-A: hottest, coldest, 2nd hottest,
  2nd coldest, ...; otherwise expert-id order); at every event, while some die is idle, the
  first pending expert whose trajectory meets the idle set starts (lines 5-10 stream one e
  of the pair, then `break`); its partner starts in a later round if its own trajectory
  still meets an idle die, else Rule 4 pre-loads it (line 12, §V-A "If the paired expert
  cannot cover any idle chiplet at the moment, it is pre-loaded"). A pair is an order, not
  a unit that must start together. Dies become idle again when no running expert uses
  them (line 15).

One scan step = one event (an expert's stream ends or its drain ends); at most 2E + 2.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax import ops, relax
from moejax.physics import collectives
from moejax.systems.fsedp.config import SLOTS_PER_RUNNING_EXPERT, FSEDPConfig

COMPUTE, DDR, D2D = 0, 1, 2
PENDING, STREAMING, DRAINING, DONE = 0, 1, 2, 3
REL_TOL = 1e-5  # events closer than this (relative) happen together


class Hardware(NamedTuple):
    """Per-die resources the layer reads (scalars; traced in a design-space sweep)."""

    ddr_Bps: jax.Array | float
    link_Bps: jax.Array | float
    weight_buffer_bytes: jax.Array | float
    # compute-pipeline seconds per micro-slice visit (FSEDPConfig.ctrl_overhead_s); a field
    # here so a test or a sweep can trace it (FSEDPParams has no such field)
    ctrl_overhead_s: jax.Array | float = 0.0


def hardware_of(cfg: FSEDPConfig, params=None) -> Hardware:
    """The config's DDR / D2D bandwidth and weight buffer, overridden by `params` fields
    (FSEDPParams.ddr_Bps, link_Bps, weight_buffer_bytes) that are not None."""
    vals = [cfg.ddr_Bps, cfg.link_Bps, cfg.weight_buffer_bytes, cfg.ctrl_overhead_s]
    if params is not None:
        for i, name in enumerate(Hardware._fields):
            v = getattr(params, name, None)
            if v is not None:
                vals[i] = v
    return Hardware(*vals)


def num_events(cfg: FSEDPConfig) -> int:
    """Static scan length of one layer: each step ends >= 1 stream or drain."""
    return 2 * (cfg.model.num_experts + cfg.shared_units) + 2


def token_owner(num_tokens: int, num_devices: int) -> np.ndarray:
    """int [N]: die that holds token slot n (tokens evenly sharded, §III)."""
    return np.arange(num_tokens) % num_devices


def tokens_per_die(cfg: FSEDPConfig, expert_ids, token_mask, counts):
    """tok [D, E]: tokens held by die d routed to expert e (counts / D for counts-only)."""
    d, e = cfg.num_devices, cfg.model.num_experts
    if expert_ids.shape[-2] == 0:
        return jnp.broadcast_to(counts / d, (d, e))
    # a histogram of the N x K (token, expert) pairs (`ops.bincount`: one flat scatter under
    # the vmap over traces); a one-hot [N, K, E] was ~30% of an engine step at 256 tokens
    owner = jnp.asarray(token_owner(expert_ids.shape[-2], d), jnp.int32)  # [N]
    valid = (expert_ids >= 0) & (expert_ids < e)  # out-of-range ids count nowhere
    key = jnp.where(valid, owner[:, None] * e + expert_ids, -1)  # -1: dropped
    wt = jnp.broadcast_to(jnp.asarray(token_mask, bool)[:, None], expert_ids.shape)
    return ops.bincount(key, wt, d * e).reshape(d, e).astype(jnp.float32)


def with_shared(cfg: FSEDPConfig, tok):
    """tok [..., D, E] with `cfg.shared_units` columns appended: every token of a die visits
    each shared unit (000 streams every expert the same way; a shared expert is one that all
    tokens choose). A die's tokens = its routed pairs / top_k (mass-weighted under Alg. 2)."""
    if cfg.shared_units == 0:
        return tok
    owned = tok.sum(-1, keepdims=True) / cfg.model.top_k
    return jnp.concatenate(
        [tok, jnp.broadcast_to(owned, (*tok.shape[:-1], cfg.shared_units))], axis=-1)


def unit_order(cfg: FSEDPConfig, counts):
    """Position of each expert in Algorithm 1's list E_sorted, int [E] (E when inactive).

    Paired-load (§IV-A, Fig. 5; Algorithm 1 line 1): sort active experts by token count
    (descending, ties by id) and pair rank p with n - 1 - p (hottest with coldest); pair u
    takes positions 2u (its hot expert) and 2u + 1 (its cold one; the middle expert of an
    odd count is alone at 2u). Otherwise the rank of the expert id among active experts.
    """
    e = counts.shape[-1]  # routed experts, then the streamed shared units
    active = counts > 0
    n_act = active.sum()
    if cfg.paired_load:
        key = jnp.where(active, counts, -1.0)
        order = jnp.argsort(-key, stable=True)
        rank = jnp.zeros(e, jnp.int32).at[order].set(jnp.arange(e, dtype=jnp.int32))
        mirror = n_act - 1 - rank
        unit = 2 * jnp.minimum(rank, mirror) + (rank > mirror)
    else:
        unit = jnp.cumsum(active.astype(jnp.int32)) - 1
    return jnp.where(active, unit, e).astype(jnp.int32)


def ring_successor(cfg: FSEDPConfig, member):
    """One-hot [E, D, D2]: each die's successor on expert e's ring trajectory."""
    d = cfg.num_devices
    pos = cfg.ring_order
    dist = (pos[None, :] - pos[:, None]) % d  # [D, D] ring distance d -> d2
    dist = np.where(dist == 0, d, dist).astype(np.float32)
    masked = jnp.where(member[:, None, :], dist[None], 2.0 * d + 1)  # [E, D, D2]
    return relax.argmin_onehot(masked, 0.0, axis=-1)


def ring_successor_hops(cfg: FSEDPConfig, member):
    """Hops from each die to its successor on expert e's ring trajectory, [E, D]."""
    nxt = ring_successor(cfg, member)
    return (nxt * jnp.asarray(cfg.topo.hops, jnp.float32)[None]).sum(-1) * member


def nearest_member(cfg: FSEDPConfig, member):
    """One-hot [E, D, D2]: the trajectory die nearest (hops, then id) to each die outside
    T_e, where an any-die DDR share is forwarded (zero rows for members / idle experts)."""
    hops = np.asarray(cfg.topo.hops, np.float32)
    masked = jnp.where(member[:, None, :], hops[None], 1e9)
    near = relax.argmin_onehot(masked, 0.0, axis=-1)
    outside = (~member) & member.any(-1, keepdims=True)
    return near * outside[..., None]


def d2d_flows(cfg: FSEDPConfig, member, w):
    """D2D bytes [E, D(src), D(dst)] of one layer's streams: each trajectory die sends
    W (|T_e| - 1) / |T_e| to its ring successor (Rule 1); under any-die loading a die outside
    T_e forwards its 1/D DDR share to the nearest member."""
    memf = member.astype(jnp.float32)
    n_t = memf.sum(-1)
    per = memf * (w * (n_t - 1.0) / jnp.maximum(n_t, 1.0))[:, None]
    flows = per[..., None] * ring_successor(cfg, member)
    if cfg.ddr_loading == "any":
        flows = flows + (w / cfg.num_devices) * nearest_member(cfg, member)
    return flows


def out_links(cfg: FSEDPConfig) -> np.ndarray:
    """[D, Lk] 0/1: directed link l leaves die d (link accounting's per-die D2D view)."""
    inc = cfg.topo.incidence()
    one = (np.asarray(cfg.topo.hops) == 1)[:, :, None] * inc  # single-hop routes
    return one.sum(1).clip(0, 1).astype(np.float32)


def with_transfer_overhead(cfg: FSEDPConfig, hw: Hardware, m) -> Hardware:
    """`hw` with DDR and D2D bandwidths lowered by the per-transfer overhead.

    000 §IV: finer micro-slices raise the "per-transfer header cost". Every micro-slice a
    die loads or forwards costs `cfg.xfer_overhead_s` on that DDR channel or link, on top
    of its bytes / bandwidth: W / M bytes take W / (M bw) + x, i.e. each byte takes
    1 / bw + x M / W. Zero overhead returns `hw` unchanged.
    """
    if cfg.xfer_overhead_s <= 0:
        return hw
    per_byte = cfg.xfer_overhead_s * m / cfg.model.expert_weight_bytes
    return hw._replace(ddr_Bps=1.0 / (1.0 / hw.ddr_Bps + per_byte),
                       link_Bps=1.0 / (1.0 / hw.link_Bps + per_byte))


def expert_demands(cfg: FSEDPConfig, m, tok, hw: Hardware | None = None):
    """Static per-expert quantities of one layer (see module docstring).

    Returns member [E, D] bool, comp_s [E, D], ddr_s [E, D] (even shares), send_s [E, R]
    (R = dies under "sender" D2D accounting, directed links under "link"),
    drain_s [E] (pipeline latency without the fill), fill_s scalar (one micro-slice's load),
    stage_s [E] (the longest compute / D2D stage of one micro-slice; see `pipeline_tail`).
    """
    hw = hardware_of(cfg) if hw is None else hw
    mod = cfg.model
    w = mod.expert_weight_bytes
    member = tok.T > 0
    memf = member.astype(jnp.float32)
    n_t = memf.sum(-1)
    safe_n = jnp.maximum(n_t, 1.0)
    hops = ring_successor_hops(cfg, member)
    comp = tok.T * mod.expert_flops_per_token / cfg.peak_flops + memf * m * hw.ctrl_overhead_s
    ddr = memf * (w / safe_n)[:, None] / hw.ddr_Bps
    flows = d2d_flows(cfg, member, w)  # [E, D, D]
    if cfg.d2d == "link":  # every link on the XY route carries the flow once
        send = cfg.topo.link_loads(flows) / hw.link_Bps
    elif cfg.d2d == "die":  # per-die UCIe budget: a die's out-links share link_Bps
        send = cfg.topo.link_loads(flows) @ jnp.asarray(out_links(cfg).T) / hw.link_Bps
    else:  # the sender's one D2D resource pays bytes x hops
        send = (flows * jnp.asarray(cfg.topo.hops, jnp.float32)).sum(-1) / hw.link_Bps
    w_ms = w / m
    # Rule 1: the last micro-slice passes |T_e| - 1 successors, one compute each.
    per_ms = tok.T * mod.expert_flops_per_token / cfg.peak_flops / m + memf * hw.ctrl_overhead_s
    drain = (jnp.maximum(n_t - 1.0, 0.0) * w_ms / hw.link_Bps
             + (hops.sum(-1) - hops.max(-1)) * cfg.hop_latency_s + per_ms.max(-1))
    stage = jnp.maximum(per_ms.max(-1), jnp.where(n_t > 1, w_ms / hw.link_Bps, 0.0))
    return member, comp, ddr, send, drain, w_ms / hw.ddr_Bps, stage


def pipeline_tail(drain, fill, stage):
    """Time after a stream ends until its last micro-slice is done.

    A pipeline of M micro-slices takes the sum of one micro-slice's stages plus (M - 1) x
    its longest stage. The fluid stream already lasts M x its bottleneck, so the tail is
    the stages of one micro-slice (fill + D2D chain + compute = `fill + drain`) less the
    longest of them. In the earlier reading the fill was added in full after a DDR-bound stream,
    which counted the first micro-slice's load twice; more control overhead then made a
    layer faster (the stream turned compute-bound, freed DDR bandwidth pre-loaded the next
    expert's first micro-slice, and the double-counted fill vanished).
    """
    return drain + fill - jnp.maximum(fill, stage)


@struct.dataclass
class LayerState:
    """Event-loop state of one layer. Axes: [E] experts, [D] dies, [3] compute/DDR/D2D.

    Per-die-and-expert arrays are [D, E] (experts last): under the vmap over traces the
    batch axis comes first, and [T, D, E] keeps the long expert axis contiguous, so the
    reductions over dies are elementwise over rows of E (~3x faster on CPU than [T, E, D]).
    """

    t_s: jax.Array
    status: jax.Array  # int [E]: PENDING / STREAMING / DRAINING / DONE
    prog: jax.Array  # [E] fraction of the stream done
    drain_end_s: jax.Array  # [E]
    ddr_s: jax.Array  # [D, E] DDR seconds of the stream per die (compute, D2D: static)
    ddr_total_s: jax.Array  # [E] DDR seconds of the stream (not pre-loaded), all dies together
    pipe_s: jax.Array  # [E] drain time charged after the stream
    pre_bytes: jax.Array  # [D, E] pre-loaded weight bytes of pending experts (Rule 4)
    busy_s: jax.Array  # [D, 3] busy seconds per die and resource
    peak_weight_bytes: jax.Array  # [D]
    events: jax.Array  # int scalar: steps that did something


def _over_dies(op, x):
    """Reduce [D, E] over the dies as D - 1 elementwise ops on rows of E, left to right.

    Used in Algorithm 1's rounds: there a reduce over the middle axis of [T, D, E] (vmapped)
    fused into a slow loop on CPU (~3x the round's time); row ops stay vectorized over E.
    Elsewhere XLA's fusion did better with plain reductions (measured, not derived)."""
    out = x[0]
    for i in range(1, x.shape[0]):
        out = op(out, x[i])
    return out


def simulate_layer(cfg: FSEDPConfig, m, tok, counts, timeline: bool = False,
                   hw: Hardware | None = None):
    """Latency and per-die accounting of one FSE-DP layer (A2-A4); A1 goes to `naive_layer`.

    m: micro-slices per expert (already rounded); tok [D, E]; counts [E]; hw: per-die
    bandwidths and buffer (default: the config's, `hardware_of`).
    Returns a dict: latency_s, busy_s [D, 3], peak_weight_bytes [D], events; with
    `timeline` also per-step t_s [S], dt_s [S], usage [S, D, 3] (rates in [0, 1]).

    Every reduction over experts is an elementwise sum (no [E, U] matmuls, no batched dots
    under vmap): the event loop is vmapped over thousands of traces on CPU.
    """
    hw = hardware_of(cfg) if hw is None else hw
    d_n = cfg.num_devices
    w = cfg.model.expert_weight_bytes
    m = jnp.asarray(m, jnp.float32)
    hw = with_transfer_overhead(cfg, hw, m)
    ddr_Bps = hw.ddr_Bps
    counts = counts * (tok > 0).any(0)
    pos = unit_order(cfg, counts)  # Algorithm 1 order (paired-load: hot, cold, hot, ...)
    e_n = tok.shape[-1]
    by_pos = jnp.argsort(pos)  # expert at each position of E_sorted (active ones first)
    member, comp, _, send, drain, fill, stage = expert_demands(cfg, m, tok, hw)
    # [D, E] inside the event loop (see LayerState)
    member, comp, send = member.T, comp.T, send.T  # send [R, E]
    memf = member.astype(jnp.float32)
    active = member.any(0)
    # dies that load a streaming expert's micro-slices from their DDR channel (Rule 4)
    loader = (jnp.broadcast_to(active[None, :], member.shape) if cfg.ddr_loading == "any"
              else member)
    loadf = loader.astype(jnp.float32)
    link_mode = cfg.d2d == "link"
    per_die_send = jnp.asarray(out_links(cfg)) if link_mode else None  # [D, Lk]
    w_ms = w / m
    slot_bytes = SLOTS_PER_RUNNING_EXPERT * w_ms
    slot_de = slot_bytes * memf  # [D, E] slots of a running expert
    has_comp, has_send = comp > 0, send > 0
    cap = hw.weight_buffer_bytes
    # room kept free so the next expert can always start its slots: no deadlock
    reserve = slot_bytes

    def occupancy(st):
        # pre_bytes is zero except for pending experts (`start` clears it)
        running = (st.status == STREAMING) | (st.status == DRAINING)
        return jnp.where(running[None, :], slot_de, st.pre_bytes).sum(1)

    def start(st, start_e, occ_at):
        """Start experts `start_e` [E] bool: fix their DDR demand (Rules 4, 5) and drains.

        occ_at [D, E]: weight bytes on each die just before each expert started.
        """
        pre_tot = st.pre_bytes.sum(0)
        if cfg.rule5:
            # Rule 5: remaining DDR load goes to T_e dies in proportion to free space.
            free = jnp.maximum(cap - occ_at, 0.0) * loadf + 1e-30 * loadf
            frac = free / jnp.maximum(free.sum(0, keepdims=True), 1e-30)
            ddr = frac * jnp.maximum(w - pre_tot, 0.0)[None, :] / ddr_Bps
            st = st.replace(ddr_s=jnp.where(start_e[None, :], ddr, st.ddr_s))
        # without Rule 5 the DDR load is pooled over T_e, split at every event (`step`)
        pipe = pipeline_tail(drain, jnp.where(pre_tot >= w_ms, 0.0, fill), stage)
        return st.replace(
            status=jnp.where(start_e, STREAMING, st.status),
            ddr_total_s=jnp.where(start_e, jnp.maximum(w - pre_tot, 0.0) / ddr_Bps,
                                  st.ddr_total_s),
            pipe_s=jnp.where(start_e, pipe, st.pipe_s),
            pre_bytes=jnp.where(start_e[None, :], 0.0, st.pre_bytes),
        )

    def schedule(st):
        """Algorithm 1 lines 3-10: up to D rounds, each starting the first pending expert
        (in E_sorted order) whose trajectory meets the idle set (ICV) and whose slots fit.

        A pending expert's trajectory and slot demand do not change while others start, so
        they are computed once; each round updates only the idle set and the occupancy.
        """
        running = st.status == STREAMING  # line 15: a die is idle once no stream uses it
        pend = st.status == PENDING
        idle = ~jnp.any(running[None, :] & member, axis=1)  # ICV [D]
        traj = pend[None, :] & member  # trajectory T_e [D, E]
        add = jnp.where(pend[None, :], slot_de - st.pre_bytes, 0.0)
        limit = cap * (1 + REL_TOL)

        occ_at = jnp.zeros((d_n, e_n)) if cfg.rule5 else None
        occ = occupancy(st)
        starts = []  # position in E_sorted of the expert each round starts (-1: none)
        # unrolled, D <= 16 rounds (a rolled loop under vmap cost ~40% of the layer on CPU)
        for _ in range(d_n):
            fits = _over_dies(jnp.logical_and, occ[:, None] + add <= limit)
            ok = pend & _over_dies(jnp.logical_or, traj & idle[:, None]) & fits
            first = jnp.min(jnp.where(ok, pos, e_n))  # the first in Algorithm 1 order
            found = first < e_n
            new = pos == jnp.where(found, first, -1)  # one expert (pos is unique)
            e_new = by_pos[jnp.minimum(first, e_n - 1)]  # its index: read its column only
            idle = idle & ~(traj[:, e_new] & found)
            if cfg.rule5:
                occ_at = jnp.where(new[None, :], occ[:, None], occ_at)
            occ = occ + jnp.where(found, add[:, e_new], 0.0)
            pend = pend & ~new
            starts.append(jnp.where(found, first, -1))
        started = _over_dies(jnp.logical_or, jnp.stack([pos == f for f in starts]))
        return start(st, started, occ_at)

    def step(st, _):
        # Once every expert is DONE a step changes nothing (dt = 0, no stream, nothing
        # pending) except the event count, so no select over the whole state is needed.
        done = jnp.all(st.status == DONE)
        t0 = st.t_s
        st = schedule(st)
        occ = occupancy(st)
        peak = jnp.maximum(st.peak_weight_bytes, occ)
        stream = st.status == STREAMING
        if not cfg.rule5:
            # Rule 4: every loading die (T_e, or any die) with space loads the stream's next
            # micro-slice, so its DDR load is pooled over them; a die shared by c streams
            # gives each 1/c.
            use = loadf * stream[None, :]
            inv = use / jnp.maximum(use.sum(1), 1.0)[:, None]
            frac = inv / jnp.maximum(inv.sum(0, keepdims=True), 1e-30)
            st = st.replace(ddr_s=frac * st.ddr_total_s[None, :])
            has_ddr = loader & (st.ddr_total_s > 0)[None, :]  # == ddr_s > 0 where streaming
        else:
            has_ddr = st.ddr_s > 0
        ddr_s = st.ddr_s
        # per resource: summed demand of the running streams on each die, [D]
        loads = [jnp.where(stream[None, :], x, 0.0).sum(1) for x in (comp, ddr_s, send)]
        if link_mode:  # D2D resources are links [Lk], not dies
            bott = jnp.maximum(jnp.max(jnp.maximum(
                jnp.where(has_comp, loads[0][:, None], 0.0),
                jnp.where(has_ddr, loads[1][:, None], 0.0)), axis=0),
                jnp.max(jnp.where(has_send, loads[2][:, None], 0.0), axis=0))
        else:
            bott = jnp.max(jnp.maximum(  # [E]: the busiest resource each stream uses
                jnp.maximum(jnp.where(has_comp, loads[0][:, None], 0.0),
                            jnp.where(has_ddr, loads[1][:, None], 0.0)),
                jnp.where(has_send, loads[2][:, None], 0.0)), axis=0)
        rate = jnp.where(stream & (bott > 0), 1.0 / jnp.where(bott > 0, bott, 1.0), 0.0)
        t_stream = jnp.where(stream, (1.0 - st.prog) * bott, jnp.inf)
        t_drain = jnp.where(st.status == DRAINING, st.drain_end_s - st.t_s, jnp.inf)
        dt = jnp.minimum(t_stream.min(), t_drain.min())
        dt = jnp.where(jnp.isfinite(dt), jnp.maximum(dt, 0.0), 0.0)
        u_send = (rate[None, :] * send).sum(1)  # [R]
        if link_mode:  # a die's D2D usage: its busiest outgoing link
            u_send = jnp.max(per_die_send * u_send[None, :], axis=1)
        usage = jnp.stack([(rate[None, :] * comp).sum(1), (rate[None, :] * ddr_s).sum(1),
                           u_send], axis=-1)  # [D, 3], each <= 1
        # Rule 4 / Algorithm 1 line 12: each die's left-over DDR bandwidth pre-loads the
        # next pending expert (in Algorithm 1 order) that still has a share to load on that die,
        # into free space beyond the slots reserved for one more starting expert.
        pend = (st.status == PENDING)[None, :]
        left_e = jnp.maximum(w - st.pre_bytes.sum(0), 0.0)  # [E] bytes not yet on chip
        cand = pend & loader & (left_e[None, :] > 0)  # [D, E]
        first = jnp.min(jnp.where(cand, pos[None, :], e_n), axis=1)  # [D]
        has_tgt = first < e_n
        tgt = by_pos[jnp.minimum(first, e_n - 1)]  # [D] the expert each die pre-loads
        # dies pre-loading the same expert share its remaining bytes
        n_tgt = ((tgt[:, None] == tgt[None, :]) & has_tgt[None, :]).sum(1)
        want = jnp.where(has_tgt, left_e[tgt] / jnp.maximum(n_tgt, 1).astype(jnp.float32),
                         0.0)  # [D]
        room = jnp.maximum(cap - reserve - occ, 0.0)
        left = jnp.maximum(1.0 - usage[:, DDR], 0.0) * ddr_Bps * dt
        add = jnp.maximum(jnp.minimum(jnp.minimum(left, want), room), 0.0)
        to_tgt = (jnp.arange(e_n)[None, :] == tgt[:, None]) & has_tgt[:, None]  # [D, E]
        pre = st.pre_bytes + jnp.where(to_tgt, add[:, None], 0.0)
        busy = st.busy_s + usage * dt
        busy = busy.at[:, DDR].add(add / ddr_Bps)
        t_new = st.t_s + dt
        tol = REL_TOL * t_new + 1e-15
        fin = stream & (t_stream <= dt + tol)
        prog = jnp.where(fin, 1.0, jnp.minimum(st.prog + rate * dt, 1.0))
        status = jnp.where(fin, DRAINING, st.status)
        drain_end = jnp.where(fin, t_new + st.pipe_s, st.drain_end_s)
        status = jnp.where((status == DRAINING) & (drain_end <= t_new + tol), DONE, status)
        st = st.replace(t_s=t_new, status=status, prog=prog, drain_end_s=drain_end,
                        pre_bytes=pre, busy_s=busy, events=st.events + (~done))
        st = st.replace(peak_weight_bytes=jnp.maximum(peak, occupancy(st)))
        return st, (t0, dt, usage)

    z = jnp.zeros(e_n)
    st = LayerState(
        t_s=jnp.zeros(()),  # default float dtype (float64 under jax_enable_x64)
        status=jnp.where(active, PENDING, DONE).astype(jnp.int32),
        prog=z, drain_end_s=z, ddr_s=jnp.zeros((d_n, e_n)), ddr_total_s=z, pipe_s=z,
        pre_bytes=jnp.zeros((d_n, e_n)), busy_s=jnp.zeros((d_n, 3)),
        peak_weight_bytes=jnp.zeros(d_n), events=jnp.int32(0),
    )
    st, (ts, dts, use) = jax.lax.scan(step, st, None, length=num_events(cfg))
    res = {
        "latency_s": st.t_s,
        "busy_s": st.busy_s,
        "peak_weight_bytes": st.peak_weight_bytes,
        "events": st.events,
        "finished": jnp.all(st.status == DONE),
    }
    if timeline:
        res.update(t_s=ts, dt_s=dts, usage=use)
    return res


def naive_layer(cfg: FSEDPConfig, tok, counts, hw: Hardware | None = None):
    """A1, naive FSE-DP of §III (Fig. 3), experts one at a time in id order.

    Per expert: tokens are redistributed all-to-all so each die holds counts_e / D of them
    (and the outputs are sent back); each die loads one slice W / D from its DDR channel
    (double-buffered: the next expert's slices load while this one circulates, §IV
    "nearly doubling the on-chip memory"); then D phases, each the longer of computing the
    local tokens with the held slice and passing the slice to the ring successor.
    Returns the same keys as `simulate_layer`. The token all-to-all uses the platform's
    links (`cfg.topo`); `hw` overrides the DDR bandwidth, the slice circulation's link
    bandwidth and the buffer.
    """
    hw = hardware_of(cfg) if hw is None else hw
    mod, d = cfg.model, cfg.num_devices
    w = mod.expert_weight_bytes
    active = (counts > 0).astype(jnp.float32)
    even = counts / d  # [E] tokens per die after redistribution
    surplus = jnp.maximum(tok - even[None, :], 0.0)  # [D, E]
    deficit = jnp.maximum(even[None, :] - tok, 0.0)
    frac = deficit / jnp.maximum(deficit.sum(0, keepdims=True), 1e-30)
    traffic = jnp.einsum("se,de->esd", surplus, frac) * mod.token_bytes  # [E, D, D]
    a2a = (collectives.all_to_all_time_s(traffic, cfg.topo)
           + collectives.all_to_all_time_s(jnp.swapaxes(traffic, -1, -2), cfg.topo))
    a2a = a2a * (surplus.sum(0) > 0)
    pos = cfg.ring_order
    succ = np.argsort(pos)[(pos + 1) % d]
    ring_hops = float(np.max(cfg.topo.hops[np.arange(d), succ])) if d > 1 else 0.0
    slice_b = w / d
    xfer = slice_b / hw.link_Bps + ring_hops * cfg.hop_latency_s + cfg.xfer_overhead_s
    comp_phase = (even * mod.expert_flops_per_token / d / cfg.peak_flops
                  + hw.ctrl_overhead_s)
    circ = d * jnp.maximum(comp_phase, xfer if d > 1 else 0.0)
    load = slice_b / hw.ddr_Bps + cfg.xfer_overhead_s
    # double buffering needs two slices on chip; without room, load and circulation serialize
    double = 2.0 * slice_b <= hw.weight_buffer_bytes
    per_expert = active * (a2a + jnp.where(double, jnp.maximum(circ, load), circ + load))
    latency = load * (active.sum() > 0) + per_expert.sum()
    comp_total = active * even * mod.expert_flops_per_token / cfg.peak_flops
    busy = jnp.stack([
        jnp.broadcast_to(comp_total.sum() + active.sum() * d * hw.ctrl_overhead_s, (d,)),
        jnp.broadcast_to(active.sum() * load, (d,)),
        jnp.broadcast_to(active.sum() * (d - 1) * slice_b / hw.link_Bps, (d,)),
    ], axis=-1)
    return {
        "latency_s": latency,
        "busy_s": busy,
        "peak_weight_bytes": jnp.full((d,), jnp.where(double, 2.0, 1.0) * slice_b
                                      * (active.sum() > 0)),
        "events": active.sum().astype(jnp.int32),
        "finished": jnp.bool_(True),
    }


def moe_layer(cfg: FSEDPConfig, m, tok, counts, hw: Hardware | None = None):
    """One layer under the configured mechanism (A1 naive or the micro-slice flow)."""
    if cfg.naive:
        return naive_layer(cfg, tok, counts, hw)
    return simulate_layer(cfg, m, tok, counts, hw=hw)
