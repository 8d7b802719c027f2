"""One MoE layer on an NVLink switch fabric under each (primitive, schedule) system of 004.

`moe_layer` is a pure function of one layer's routing (expert ids [N, K], mask [N], counts
[E]) and the placement; `build` scans it over a trace's iterations (layers vmapped), as
`systems.ep.build` does; the runner (`engine.simulate`) jits and vmaps over traces.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from moejax import relax
from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.physics import comm
from moejax.physics.roofline import sustained_flops
from moejax.system import System
from moejax.systems import ep, metrics
from moejax.systems.dysharp import packet, schedule, traffic
from moejax.systems.dysharp.config import (
    COMBINES,
    COMM_SMS,
    COUNT_BYTES,
    LINK_MODELS,
    NOTIFY_BARRIERS,
    PHASES,
    PRIMITIVES,
    SCHEDULES,
    WGMMA_M,
    DyConfig,
    DyParams,
    comm_rate_of,
    contiguous_placement,
    gemm_share_of,
    make_config,
)
from moejax.trace import Trace

# backward pass of a layer (spec §7.3): the same dispatch / combine bytes (the gradient of a
# combine is a multicast, of a dispatch a reduction), GEMMs twice the forward FLOPs (dgrad
# + wgrad), weights read again.
BACKWARD_GEMM_FACTOR = 2.0


@functools.cache
def _attention_cfg(platform: Platform, model: ModelSpec):
    return ep.make_config(platform, model, attention="dp")


def efficiency(cfg: DyConfig) -> float:
    """Share of link_Bps that carries the config's primitive's payload.

    "packet" link model: the payload efficiency of the primitive's packets alone (004 §III-A,
    Fig. 7). "measured": unicast at the platform's measured bulk rate
    (`TopologySpec.protocol_efficiency`, the rate `physics.comm` gives every system's unicast
    all-to-all), other primitives at that rate times their packet efficiency relative to
    unicast's (the losses beyond the headers, flow control and DMA gaps, are the same links').
    """
    eta = packet.payload_efficiency(cfg.platform, cfg.primitive, cfg.model.top_k)
    if cfg.link_model == "packet":
        return eta
    unicast = packet.payload_efficiency(cfg.platform, "unicast_rank", cfg.model.top_k)
    return cfg.platform.topology.protocol_efficiency * eta / unicast


def token_scale(cfg: DyConfig, n_real):
    """Factor from the trace's sampled tokens to `tokens_per_gpu * G` tokens (1 if unset)."""
    if cfg.tokens_per_gpu <= 0:
        return jnp.float32(1.0)
    return cfg.tokens_per_gpu * cfg.num_devices / jnp.maximum(n_real, 1.0)


def gemm_times_s(cfg: DyConfig, tokens_de, tau, tau_s=0.0, tile=None, share=1.0):
    """GEMM-1 (gate + up) and GEMM-2 (down) seconds per GPU [G] (roofline per local expert).

    tokens_de [G, E]: tokens of expert e on GPU d; tau in tokens, tau_s in seconds; tile:
    rows per GEMM tile (default `cfg.tile_tokens`, traced when tuned). Hard mode pads each
    expert's rows to whole tiles, and a tile of fewer than WGMMA_M rows computes WGMMA_M (a
    tiled grouped GEMM computes whole tiles); relaxed mode scales the rows by the same
    per-tile factor without the ceiling. An expert with any tokens reads its weights once
    (`ep.expert_time_s`). share: fraction of the SMs the GEMMs run on; it divides the
    compute term only: an expert whose weight read bounds it streams at the HBM rate, which
    the SMs left beside comm kernels still reach (112 of 132 SMs issue far more loads than
    HBM serves), so a memory-bound GEMM is not slowed by the comm SMs.
    """
    m, dev = cfg.model, cfg.platform.device
    tile = cfg.tile_tokens if tile is None else tile
    computed = jnp.maximum(tile, WGMMA_M)
    rows = jnp.where(tau > 0, tokens_de * computed / tile,
                     jnp.ceil(tokens_de / tile - 1e-6) * computed)
    used = relax.positive(tokens_de, tau)
    peak = sustained_flops(dev, cfg.gemm_dtype, "grouped")
    hf = m.hidden_size * m.expert_ffn_size

    def gemm(mats):
        comp = rows * 2.0 * mats * hf / (peak * share)
        mem = used * mats * hf * m.weight_bytes / dev.memory_Bps
        return relax.maximum(comp, mem, tau_s).sum(-1)

    return gemm(m.ffn_matrices - 1), gemm(1)


def tile_terms(cfg: DyConfig, eta: float, tile=None, share=None, rate=1.0,
               occupancy=None) -> schedule.TileTerms:
    """One tile in each phase (004 §IV-B token-paced pipeline), comm at `rate` of the link,
    GEMMs on `share` of the SMs (defaults: the config's). The tile holds `occupancy` tokens
    (None: a full tile of `tile`): dispatch and combine move those tokens; the GEMMs compute
    the whole tile (as `gemm_times_s` pads every expert to whole tiles, at least WGMMA_M rows)."""
    m, dev = cfg.model, cfg.platform.device
    tok = cfg.tile_tokens if tile is None else tile
    share = cfg.gemm_share if share is None else share
    occ = tok if occupancy is None else occupancy
    comm = occ * cfg.token_bytes / (eta * cfg.platform.topology.link_Bps * rate)
    peak = sustained_flops(dev, cfg.gemm_dtype, "grouped") * share
    hf = m.hidden_size * m.expert_ffn_size
    rows = jnp.maximum(tok, WGMMA_M)
    return schedule.TileTerms(
        dispatch_s=jnp.asarray(comm, jnp.float32),
        gemm1_s=jnp.float32(rows * 2.0 * (m.ffn_matrices - 1) * hf / peak),
        gemm2_s=jnp.float32(rows * 2.0 * hf / peak),
        combine_s=jnp.asarray(comm, jnp.float32),
        rtt_s=jnp.float32(2 * cfg.latency_s),
    )


def notify_time_s(cfg: DyConfig) -> float:
    """DeepEP's notify_dispatch before a forward dispatch (config.NOTIFY_BARRIERS): two
    barrier round trips plus each rank's counts to every peer (one per-rank count and the
    peer's E / G per-expert counts, int32) at the port rate; 0 without `notify`."""
    if not cfg.notify:
        return 0.0
    g, e = cfg.num_devices, cfg.model.num_experts
    counts = (g - 1) * (1 + e / g) * COUNT_BYTES
    rate = cfg.platform.topology.link_Bps * (1.0 if cfg.link_model == "packet" else
                                             cfg.platform.topology.protocol_efficiency)
    return NOTIFY_BARRIERS * 2 * cfg.latency_s + counts / rate


def moe_layer(cfg: DyConfig, params: DyParams, expert_ids, token_mask, counts):
    """Metrics of one MoE layer: expert_ids [N, K], token_mask [N], counts [E] (tokens per
    expert). Times in seconds, bytes per GPU port at `tokens_per_gpu` scale."""
    place = params.placement.astype(jnp.float32)
    n_real = (token_mask & (expert_ids >= 0).any(-1)).sum().astype(jnp.float32)
    exact = jnp.asarray(params.tau) <= 0
    loads = traffic.port_loads(expert_ids, token_mask, place, cfg.nvls_self_copy, exact=exact)
    matrix = None if cfg.comm_kernel == "nccl" else traffic.dispatch_matrix(
        expert_ids, token_mask, place, cfg.primitive, exact)
    return layer_from_loads(cfg, params, loads, counts, n_real, token_scale(cfg, n_real),
                            matrix)


def layer_from_loads(cfg: DyConfig, params: DyParams, port_loads, counts, n_real, scale,
                     matrix=None):
    """`moe_layer` from `traffic.port_loads` [5, 4, G] (token vectors of the sampled tokens)
    and the factor `scale` to the simulated token count (several systems share one load pass);
    `matrix`: the primitive's `traffic.dispatch_matrix` [G, G], needed by a comm_kernel other
    than nccl.

    One `relax.branch` around the whole layer: hard mode (tau = 0) is plain arithmetic.
    """
    if cfg.comm_kernel != "nccl" and matrix is None:
        raise ConfigError(f"comm_kernel = {cfg.comm_kernel!r} needs the [G, G] traffic matrix "
                          "(traffic.dispatch_matrix)")
    return relax.branch(params.tau, lambda tau: _layer(cfg, params, port_loads,
                                                       counts, n_real, scale, tau, matrix))


def kernel_phases_s(cfg: DyConfig, matrix, scale):
    """(Cd, Cc) seconds of the config's `comm_kernel` (`physics.comm.KERNELS`) moving the
    dispatch traffic `matrix` [G, G] (token vectors, sampled) and its transpose (the combine)
    at `scale` x token_bytes bytes per vector; None for "nccl" (the port link model)."""
    if cfg.comm_kernel == "nccl":
        return None
    fn = comm.kernel(cfg.comm_kernel)
    bytes_ = matrix * scale * cfg.token_bytes
    return fn(bytes_, None, cfg.platform), fn(bytes_.T, None, cfg.platform)


def _layer(cfg: DyConfig, params: DyParams, port_loads, counts, n_real, scale, tau,
           matrix=None):
    g = cfg.num_devices
    place = params.placement.astype(jnp.float32)
    eta = efficiency(cfg)
    tile_rows = cfg.tile_tokens if params.tile_tokens is None else params.tile_tokens
    chunks = cfg.chunks if params.chunks is None else params.chunks
    link = cfg.platform.topology.link_Bps
    all_loads = port_loads * scale * cfg.token_bytes  # [5, 4, G] payload bytes
    loads = all_loads[traffic.load_index(cfg.primitive, cfg.combine)]
    wire = loads / eta
    tau_s = tau * cfg.latency_s  # dimensionless tau -> seconds
    tokens_de = (counts[:, None] * place).T * scale  # [G, E]
    x1, x2 = gemm_times_s(cfg, tokens_de, tau, tau_s, tile_rows)
    # a DeepEP kernel runs on the SMs it assigns itself: its phases do not scale with comm_sms
    phases = kernel_phases_s(cfg, matrix, scale)
    n_tok = n_real * scale
    # tokens in an expert's first / last tile: a full tile, or all of an expert's tokens when
    # it has fewer (decode: 16 tokens per GPU give 16 per expert at L-8)
    occupancy = relax.minimum(tile_rows, n_tok * cfg.model.top_k / cfg.model.num_experts,
                              tau)

    def pass_at(gemm_factor, sms):
        """One pass (forward or backward) with `sms` comm SMs (None: the config's)."""
        if sms is None:
            share, rate = cfg.gemm_share, (1.0 if cfg.comm_sms >= COMM_SMS
                                           else comm_rate_of(cfg, cfg.comm_sms))
        else:
            share, rate = gemm_share_of(cfg, sms), comm_rate_of(cfg, sms)
        tile = tile_terms(cfg, eta, tile_rows, share, rate, occupancy)
        x1s, x2s = gemm_times_s(cfg, tokens_de, tau, tau_s, tile_rows, share)
        return schedule.layer_time_s(cfg.schedule, wire, gemm_factor * x1, gemm_factor * x2,
                                     link * rate, cfg.latency_s, chunks, tile, tau_s,
                                     phases, gemm_factor * x1s, gemm_factor * x2s)

    def one_pass(gemm_factor):
        if params.comm_sms is not None:
            return pass_at(gemm_factor, params.comm_sms)
        if not cfg.adaptive_comm_sms:
            return pass_at(gemm_factor, None)
        # COMET's adaptive split: the best of its candidate SM counts for this pass's shape
        runs = [pass_at(gemm_factor, jnp.float32(n)) for n in cfg.adaptive_comm_sms]
        lat = jnp.stack([r["latency_s"] for r in runs])
        best = relax.min(lat, tau_s, axis=0)
        pick = jax.nn.one_hot(jnp.argmin(lat), len(runs))  # which split, for comm / gemm
        return {"latency_s": best,
                **{k: (jnp.stack([r[k] for r in runs]) * pick).sum() for k in
                   ("comm_s", "gemm_s")}}

    fwd = one_pass(1.0)
    t_notify = notify_time_s(cfg)
    if t_notify:
        fwd = {**fwd, "latency_s": fwd["latency_s"] + t_notify,
               "comm_s": fwd["comm_s"] + t_notify}
    att, att_comp = ep.attention_time_s(_attention_cfg(cfg.platform, cfg.model), n_tok, tau_s)
    # DualPipe (DeepSeek-V3 §3.2.1): the comm of one micro-batch hides under the compute
    # (attention + experts) of another; an end-to-end block costs the larger of the two. Its
    # comm kernels run beside that compute on `comm_sms` SMs (§3.2.2: 20 of 132), so the
    # compute parts run on the rest (memory-bound parts at the HBM rate, `gemm_times_s`).
    share_dp = cfg.share_beside_comm
    x1d, x2d = gemm_times_s(cfg, tokens_de, tau, tau_s, tile_rows, share_dp)
    x_dp = relax.max(x1d + x2d, tau_s)
    att_dp = relax.maximum(att_comp / share_dp, att, tau_s)
    if cfg.phase == "training":
        bwd = one_pass(BACKWARD_GEMM_FACTOR)
        out = {k: fwd[k] + bwd[k] for k in fwd}
        att = att * (1.0 + BACKWARD_GEMM_FACTOR)
        att_dp = att_dp * (1.0 + BACKWARD_GEMM_FACTOR)
        x_dp = x_dp * (1.0 + BACKWARD_GEMM_FACTOR)
        passes = 2.0
    else:
        out, passes = fwd, 1.0
    block_dualpipe = relax.maximum(out["comm_s"], x_dp + att_dp, tau_s)
    pay = all_loads.sum((1, 2))  # [5] payload bytes per primitive
    rank, dyn, nvls = (all_loads[traffic.LOAD_KINDS.index(k)] for k in
                       ("unicast_rank", "dymultimem", "nvls"))
    total = loads.sum() * passes
    return {
        "latency_s": out["latency_s"],
        "comm_s": out["comm_s"],
        "gemm_s": out["gemm_s"],
        "exposed_comm_s": jnp.maximum(out["latency_s"] - out["gemm_s"], 0.0),
        "attention_s": att,
        "block_s": out["latency_s"] + att,
        "block_dualpipe_s": block_dualpipe,
        "port_up_bytes": (loads[0] + loads[2]) * passes,
        "port_down_bytes": (loads[1] + loads[3]) * passes,
        "traffic_bytes": total,
        "traffic_by_primitive_bytes": pay * passes,
        "redundancy": 1.0 - dyn.sum() / jnp.maximum(rank.sum(), 1e-30),
        "nvls_useless": nvls[1].sum() / jnp.maximum(rank[1].sum(), 1e-30) - 1.0,
        "bw_util": total / eta / jnp.maximum(out["latency_s"] * 2 * g * link, 1e-30),
        "gemm_util": out["gemm_s"] / jnp.maximum(out["latency_s"], 1e-30),
        "tokens": n_tok,
        "expert_tokens": tokens_de.sum(-1),
    }


def layers_of(cfg: DyConfig, params: DyParams, expert_ids, token_mask, counts):
    """`moe_layer` of every layer (ids [L, N, K], counts [L, E]); [L, E, G] placements too."""
    if params.placement.ndim == 3:
        return jax.vmap(lambda i, c, p: moe_layer(cfg, params.replace(placement=p), i,
                                                  token_mask, c))(expert_ids, counts,
                                                                  params.placement)
    return jax.vmap(lambda i, c: moe_layer(cfg, params, i, token_mask, c))(expert_ids, counts)


SCALARS = ("latency_s", "comm_s", "gemm_s", "exposed_comm_s", "attention_s", "block_s",
           "block_dualpipe_s", "traffic_bytes", "redundancy", "nvls_useless", "bw_util",
           "gemm_util", "tokens")
VECTORS = ("port_up_bytes", "port_down_bytes", "traffic_by_primitive_bytes", "expert_tokens")


def build(cfg: DyConfig, num_iterations: int) -> System:
    """The layer model as an init / step / finish system over `num_iterations` iterations."""
    g = cfg.num_devices
    # sums over iterations with tokens of each layer-mean metric
    sums = {**dict.fromkeys(SCALARS, ()), "port_up_bytes": (g,), "port_down_bytes": (g,),
            "expert_tokens": (g,), "traffic_by_primitive_bytes": (len(traffic.LOAD_KINDS),)}

    def init(params: DyParams, trace: Trace, key):
        del key
        ep.check_layers(params.placement, trace.counts.shape[-2])
        return metrics.Running.zeros(sums)

    def step(params: DyParams, run: metrics.Running, it: metrics.Iteration):
        layers = layers_of(cfg, params, it.expert_ids, it.token_mask, it.counts)
        run = run.add(metrics.real_iteration(it.counts[0].sum()),
                      {k: layers[k].mean(0) for k in sums})
        return run, layers["latency_s"].mean()

    def finish(params: DyParams, run: metrics.Running, outs):
        out = run.means()
        m = cfg.model
        per_block = out["block_dualpipe_s"] if cfg.name == "dualpipe" else out["block_s"]
        forward = m.num_sparse_layers * per_block + m.num_dense_layers * out["attention_s"]
        out.update(
            forward_s=forward,
            compute_s=out["gemm_s"],
            memory_s=jnp.float32(0.0),
            utilization_mean=out["gemm_util"],
            tokens_per_s=out["tokens"] / jnp.maximum(out["latency_s"], 1e-30),
            layer_latency_per_iter_s=outs,
        )
        return out

    return System(name=f"dysharp:{cfg.name}", init=init, step=step, finish=finish,
                  num_steps=num_iterations, inputs=metrics.inputs(num_iterations))


# --- policy options ------------------------------------------------------------------------

def _chunks(t) -> tuple[int, ...]:
    value = t._get("chunks", [1], False)
    value = value if isinstance(value, list) else [value]
    if not value or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1
                            for c in value):
        raise ConfigError(f"{t.where}: key 'chunks' = {value!r}; allowed: a non-empty list of "
                          "ints >= 1")
    return tuple(value)


def _int_list(t, key: str) -> tuple[int, ...]:
    value = t._get(key, [], False)
    value = value if isinstance(value, list) else [value]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in value):
        raise ConfigError(f"{t.where}: key {key!r} = {value!r}; allowed: a list of ints >= 1")
    return tuple(value)


def _read_options(t, platform: Platform | None = None, model: ModelSpec | None = None):
    opts = dict(
        primitive=t.str("primitive", "dymultimem", choices=PRIMITIVES),
        schedule=t.str("schedule", "fused", choices=SCHEDULES),
        combine=t.str("combine", "per_gpu", choices=COMBINES),
        phase=t.str("phase", "forward", choices=PHASES),
        chunks=_chunks(t),
        comm_sms=t.int("comm_sms", 20, lo=0),
        tile_tokens=t.int("tile_tokens", 128, lo=1),
        tokens_per_gpu=t.int("tokens_per_gpu", 0, lo=0),
        notify=t.bool("notify", False),
        adaptive_comm_sms=_int_list(t, "adaptive_comm_sms"),
        name=t.str("label", "dysharp"),
        link_model=t.str("link_model", "measured", choices=LINK_MODELS),
        comm_kernel=t.str("comm_kernel", "nccl", choices=tuple(comm.KERNELS)),
    )
    placement = t._get("placement", "contiguous", False)
    shares = t._get("replica_shares", None, False)
    t.close()
    return opts, placement, shares


def check_options(t) -> None:
    """Validate a policy's [options] for the DySHARP family (names, types, ranges)."""
    _read_options(t)


def placement_of(placement, shares, model: ModelSpec, platform: Platform, where: str):
    """[E, G] (or [L, E, G]) share matrix from a policy's `placement` option."""
    if isinstance(placement, str):
        if placement != "contiguous":
            raise ConfigError(f"{where}: key 'placement' = {placement!r}; allowed: contiguous, "
                              "or a list of device ids per expert (replica lists allowed)")
        return contiguous_placement(model.num_experts, platform.num_devices)
    return ep.placement_from_option(placement, shares, model.num_experts,
                                    platform.num_devices, where)


def from_policy(platform: Platform, model: ModelSpec, t, num_iterations: int):
    """(System, params) of one DySHARP-family policy."""
    opts, placement, shares = _read_options(t, platform, model)
    cfg = make_config(platform, model, **opts)
    p = placement_of(placement, shares, model, platform, t.where)
    return build(cfg, num_iterations), DyParams(placement=jnp.asarray(p, jnp.float32))


def replace(cfg: DyConfig, **kw) -> DyConfig:
    """A validated copy of `cfg` with some fields changed."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
              if f.name not in ("platform", "model")}
    return make_config(cfg.platform, cfg.model, **{**fields, **kw})
