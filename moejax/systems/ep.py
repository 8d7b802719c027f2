"""Synchronous expert parallelism: the barrier-style baseline every paper compares against.

One MoE layer (000 §VI-A "EP", 001 §II-B, 002 §2 Fig. 4, 003 §3, 004 §II): tokens are
dispatched all-to-all to the devices holding their experts, each device runs its experts,
and the outputs are combined all-to-all back; every phase ends at a barrier, so the slowest
device (and the busiest link) sets the pace. A forward pass adds attention (data parallel,
or tensor parallel with a ring all-reduce) and the dense blocks, all by roofline.

The system scans over the iterations of a trace (one step = one forward pass over every
layer, the layers vmapped); per trace it reports latency with a compute / memory /
communication breakdown, per-device utilization and bytes per link.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax import ops, relax
from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.physics import collectives, comm, topology
from moejax.physics.roofline import device_compute_s, device_memory_s
from moejax.system import System
from moejax.systems import metrics
from moejax.trace import Trace

ATTENTION_MODES = ("dp", "tp")
# Traces per compiled call on an accelerator (`engine.System.accelerator_chunk`): an EP layer
# is little work per trace, so calls of the engine's default 8,192 traces are mostly launch
# latency: 64k resident traces on an H100 ran 10.2 M traces/s in calls of 8,192 and 22.7 M/s
# in one call of 65,536 (docs/performance.md "Running on an accelerator").
ACCELERATOR_CHUNK = 65536


@dataclasses.dataclass(frozen=True, eq=False)
class EPConfig:
    """Static configuration of synchronous EP (hashable by identity)."""

    platform: Platform
    model: ModelSpec
    topo: topology.Topology
    attention: str = "dp"  # "dp": each device attends its own tokens; "tp": TP groups
    tp_size: int = 1  # devices per attention TP group (attention == "tp")
    context_len: int = 0  # KV-cache tokens each token attends to (0: prefill-only, causal)
    dtype: str = "bf16"
    comm_kernel: str = "nccl"  # all-to-all kernel of `physics.comm.KERNELS`
    comm_sms: int = 0  # SMs the all-to-all kernel runs on (0: not SM-limited)

    @property
    def num_devices(self) -> int:
        return self.topo.num_devices

    @property
    def tp_groups(self) -> np.ndarray:
        """int [G, g]: device ids of each attention TP group (contiguous blocks)."""
        g = self.tp_size if self.attention == "tp" else 1
        return np.arange(self.num_devices).reshape(-1, g)


def make_config(platform: Platform, model: ModelSpec, *, attention: str = "dp",
                tp_size: int = 1, context_len: int = 0, dtype: str = "bf16",
                comm_kernel: str = "nccl", comm_sms: int = 0) -> EPConfig:
    """Validated EPConfig; the topology is built once here."""
    fn = comm.kernel(comm_kernel)
    if comm_sms < 0:
        raise ConfigError(f"comm_sms = {comm_sms} must be >= 0 (0: not SM-limited)")
    if comm_sms and getattr(fn, "needs_platform", False):
        raise ConfigError(f"comm_sms = {comm_sms}: comm_kernel = {comm_kernel!r} runs on the SMs "
                          "DeepEP assigns it (its time model has no SM term); allowed: 0")
    if comm_sms and not platform.device.sm_comm_Bps:
        raise ConfigError(f"comm_sms = {comm_sms}: hardware {platform.name} states no "
                          "[device] sm_comm_Bps, so an SM limit would have no effect; "
                          "allowed: 0")
    if attention not in ATTENTION_MODES:
        raise ConfigError(f"attention = {attention!r}; allowed: {', '.join(ATTENTION_MODES)}")
    if attention == "tp" and (tp_size < 1 or platform.num_devices % tp_size):
        raise ConfigError(
            f"tp_size = {tp_size} must divide the {platform.num_devices} devices of "
            f"{platform.name}"
        )
    if context_len < 0:
        raise ConfigError(f"context_len = {context_len} must be >= 0")
    return EPConfig(platform, model, topology.build(platform), attention,
                    tp_size if attention == "tp" else 1, context_len, dtype, comm_kernel,
                    comm_sms)


@struct.dataclass
class EPParams:
    """Tunable parameters of EP.

    placement [E, D]: share of expert e's tokens served by device d (rows sum to 1; one-hot
      for plain EP, fractional for replicas: `moejax.placement.slots` states the split rule);
      or [L, E, D], one placement per layer of the trace (EPLB plans each layer separately).
    tau: relaxation temperature, dimensionless (0 = exact); see `moe_layer`.
    """

    placement: jax.Array
    tau: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))


def round_robin_placement(num_experts: int, num_devices: int) -> jax.Array:
    """Expert e on device e mod D (each device hosts a distinct subset; 000 §VI-A EP)."""
    return jax.nn.one_hot(np.arange(num_experts) % num_devices, num_devices)


def contiguous_placement(num_experts: int, num_devices: int) -> jax.Array:
    """Experts in contiguous blocks: e on device e * D // E (DeepSpeed / SGLang default)."""
    return jax.nn.one_hot(np.arange(num_experts) * num_devices // num_experts, num_devices)


def default_params(cfg: EPConfig, placement: str = "contiguous") -> EPParams:
    """EPParams with a named placement (`contiguous` or `round-robin`)."""
    makers = {"contiguous": contiguous_placement, "round-robin": round_robin_placement}
    if placement not in makers:
        raise ConfigError(f"placement = {placement!r}; allowed: {', '.join(makers)}")
    return EPParams(placement=makers[placement](cfg.model.num_experts, cfg.num_devices))


def check_placement(placement, num_experts: int, num_devices: int) -> None:
    """Raise ConfigError unless placement is [E, D] or [L, E, D], nonnegative, rows summing
    to 1."""
    p = np.asarray(placement)
    if p.ndim not in (2, 3) or p.shape[-2:] != (num_experts, num_devices):
        raise ConfigError(f"placement: expected shape [E, D] = {(num_experts, num_devices)} "
                          f"or [L, E, D], got {p.shape}")
    if (p < 0).any() or not np.allclose(p.sum(1), 1.0, atol=1e-5):
        raise ConfigError("placement: entries must be >= 0 and each expert's row sum to 1")


def token_owner(cfg: EPConfig, num_tokens: int) -> np.ndarray:
    """int [N]: device that dispatches token slot n.

    Tokens are spread round-robin over the DP groups; inside a TP group (which holds every
    token of the group after its all-reduce) member (n // G) mod g dispatches token n.
    """
    groups = cfg.tp_groups
    n_groups, g = groups.shape
    n = np.arange(num_tokens)
    return groups[n % n_groups, (n // n_groups) % g]


# --- one MoE layer -------------------------------------------------------------------------


def layer_demand(cfg: EPConfig, params: EPParams, expert_ids, token_mask, counts):
    """Dispatch traffic [D, D] (bytes) and tokens per (device, expert) [D, E] of one layer.

    expert_ids [N, K], token_mask [N], counts [E]. For counts-only traces (N = 0) every
    device is assumed to send an equal share of each expert's tokens.
    """
    m, d = cfg.model, cfg.num_devices
    place = params.placement.astype(jnp.float32)
    tokens_de = (counts[:, None] * place).T  # [D, E]
    if expert_ids.shape[0] > 0:
        # [D, E] tokens each device sends to each expert: one histogram of the (token,
        # choice) pairs (padding has id -1 and mask False: it adds 0)
        owner = jnp.asarray(token_owner(cfg, expert_ids.shape[0]), jnp.int32)
        flat = jnp.where(expert_ids >= 0, owner[:, None] * m.num_experts + expert_ids, -1)
        # the mask (bool) as weights: an integer scatter that reads `expert_ids` once
        src_e = ops.bincount(flat, token_mask[:, None], d * m.num_experts)
        src_e = src_e.reshape(d, m.num_experts).astype(jnp.float32)
    else:
        src_e = jnp.broadcast_to(counts / d, (d, m.num_experts))
    traffic = (src_e @ place) * m.token_bytes  # [D(src), D(dst)]
    return traffic, tokens_de


def expert_time_s(cfg: EPConfig, tokens_de, tau, tau_tokens=0.0):
    """Per-device expert time [D] and its compute part [D]: roofline of each local expert.

    An expert that received at least one token loads its weights from local memory once.
    tau: temperature in seconds; tau_tokens: in tokens (for the "used" indicator).
    """
    m, dev = cfg.model, cfg.platform.device
    comp = device_compute_s(tokens_de * m.expert_flops_per_token, dev, cfg.dtype,
                            "grouped")  # [D, E]
    mem = device_memory_s(relax.positive(tokens_de, tau_tokens) * m.expert_weight_bytes, dev)
    t = relax.maximum(comp, mem, tau).sum(-1)
    # the compute part from each device's token total (whole tokens: a sum exact in any
    # order), not a sum of per-expert times, whose rounding varied with the batch's size
    # (XLA's CPU backend fused the products into the sum, or not; see `metrics.rounded`)
    return t, device_compute_s(tokens_de.sum(-1) * m.expert_flops_per_token, dev, cfg.dtype,
                               "grouped")


def shared_time_s(cfg: EPConfig, tokens_d, tau):
    """Shared experts [D]: each device runs them on the tokens it owns."""
    m, dev = cfg.model, cfg.platform.device
    if m.num_shared_experts == 0:
        return jnp.zeros_like(tokens_d), jnp.zeros_like(tokens_d)
    comp = device_compute_s(tokens_d * m.shared_flops_per_token, dev, cfg.dtype)
    mem = device_memory_s(m.shared_weight_bytes, dev)
    return relax.maximum(comp, mem, tau), comp


def owned_tokens(cfg: EPConfig, token_mask, n_tokens):
    """Tokens owned (dispatched) per device [D]."""
    d = cfg.num_devices
    if token_mask.shape[-1] > 0:
        owner = jax.nn.one_hot(token_owner(cfg, token_mask.shape[-1]), d)
        return token_mask.astype(jnp.float32) @ owner
    return jnp.full((d,), n_tokens / d)


def comm_time_s(cfg: EPConfig, traffic, tau=0.0):
    """Seconds of one all-to-all of `traffic` [..., D, D] bytes with the config's kernel
    (`physics.comm`, the primitive every system prices its dispatch and combine with)."""
    return comm.alltoall_time_s(traffic, cfg.topo, sms=cfg.comm_sms or None,
                                kernel_name=cfg.comm_kernel, tau=tau, platform=cfg.platform)


def time_scale_s(cfg: EPConfig) -> float:
    """Characteristic time (one expert's weight load) that makes `tau` dimensionless."""
    return cfg.model.expert_weight_bytes / cfg.platform.device.memory_Bps


def moe_layer(cfg: EPConfig, params: EPParams, expert_ids, token_mask, counts):
    """Timing of one synchronous MoE layer: dict of scalars and per-device / per-link arrays.

    `params.tau` is dimensionless: max / min over times use tau * `time_scale_s(cfg)`,
    "expert used" indicators use tau tokens.
    """
    tau = params.tau * time_scale_s(cfg)
    traffic, _ = layer_demand(cfg, params, expert_ids, token_mask, counts)
    place = params.placement.astype(jnp.float32)
    dispatch = comm_time_s(cfg, traffic, tau)
    combine = comm_time_s(cfg, traffic.T, tau)
    n_tokens = counts.sum() / cfg.model.top_k
    # [D, E] tokens built inside the branch: hard mode is one fused pass over them
    t_exp, c_exp = relax.branch(params.tau, lambda t: expert_time_s(
        cfg, (counts[:, None] * place).T, t * time_scale_s(cfg), t))
    t_sh, c_sh = shared_time_s(cfg, owned_tokens(cfg, token_mask, n_tokens), tau)
    busy = t_exp + t_sh
    compute_busy = c_exp + c_sh
    slowest = relax.max(busy, tau)
    link_bytes = cfg.topo.link_loads(traffic) + cfg.topo.link_loads(traffic.T)
    return {
        "latency_s": dispatch + slowest + combine,
        "comm_s": dispatch + combine,
        "expert_s": slowest,
        "compute_s": relax.max(compute_busy, tau),
        "device_busy_s": busy,
        "device_compute_s": compute_busy,
        "link_bytes": link_bytes,
        "tokens_per_device": counts @ place,
    }


# --- attention and dense blocks ------------------------------------------------------------


def attention_time_s(cfg: EPConfig, n_tokens, tau):
    """One attention block (roofline, plus the TP all-reduce), and its compute part.

    DP: every device holds all attention weights and attends its N/D tokens. TP: a group of
    g devices shares each token; weights and heads are split g ways, then a ring all-reduce
    of the group's hidden states (001 §II-B Fig. 5).
    """
    m, dev = cfg.model, cfg.platform.device
    groups = cfg.tp_groups
    n_groups, g = groups.shape
    tok = n_tokens / n_groups  # tokens per DP group
    ctx = m.context_tokens(cfg.context_len if cfg.context_len > 0 else tok / 2)  # causal prefill
    flops = tok * (m.attention_flops_per_token + ctx * m.attention_context_flops) / g
    bytes_ = (m.attention_weight_bytes + tok * ctx * m.kv_bytes_per_token * (cfg.context_len > 0)
              ) / g
    comp = device_compute_s(flops, dev, cfg.dtype)
    t = relax.maximum(comp, device_memory_s(bytes_, dev), tau)
    if g > 1:
        t = t + collectives.all_reduce_time_s(tok * m.token_bytes, groups, cfg.topo, tau)
    return t, comp


def dense_ffn_time_s(cfg: EPConfig, n_tokens, tau):
    """One dense FFN block, data parallel over devices (0 if the model has none)."""
    m, dev = cfg.model, cfg.platform.device
    if m.num_dense_layers == 0 or m.dense_ffn_size == 0:
        return jnp.float32(0.0)
    tok = n_tokens / cfg.num_devices
    flops = tok * 2.0 * m.ffn_matrices * m.hidden_size * m.dense_ffn_size
    bytes_ = m.ffn_matrices * m.hidden_size * m.dense_ffn_size * m.weight_bytes
    return relax.maximum(device_compute_s(flops, dev, cfg.dtype), device_memory_s(bytes_, dev),
                         tau)


# --- the system ----------------------------------------------------------------------------


def check_layers(placement, num_layers: int) -> None:
    """ConfigError unless a per-layer placement [L, E, D] has the trace's L layers (shapes
    are static, so this runs while tracing)."""
    if placement.ndim == 3 and placement.shape[0] != num_layers:
        raise ConfigError(f"placement: {placement.shape[0]} per-layer placements for a trace "
                          f"of {num_layers} layers; allowed: {num_layers}, or one [E, D] "
                          "placement for every layer")


def layers_of(cfg: EPConfig, params: EPParams, expert_ids, token_mask, counts):
    """`moe_layer` of every layer of one iteration (ids [L, N, K], counts [L, E]), vmapped;
    a per-layer placement [L, E, D] is vmapped with them."""
    if params.placement.ndim == 3:
        return jax.vmap(lambda i, c, p: moe_layer(cfg, params.replace(placement=p), i,
                                                  token_mask, c))(expert_ids, counts,
                                                                  params.placement)
    return jax.vmap(lambda i, c: moe_layer(cfg, params, i, token_mask, c))(expert_ids, counts)


def iteration_times(cfg: EPConfig, params: EPParams, expert_ids, token_mask, counts):
    """One forward pass (ids [L, N, K], mask [N], counts [L, E]): (per-layer `moe_layer`
    metrics, forward seconds, attention + dense seconds of the forward)."""
    layers = layers_of(cfg, params, expert_ids, token_mask, counts)
    n_tokens = counts[0].sum() / cfg.model.top_k
    tau_s = params.tau * time_scale_s(cfg)
    att, _ = attention_time_s(cfg, n_tokens, tau_s)
    dense = dense_ffn_time_s(cfg, n_tokens, tau_s)
    m = cfg.model
    # the trace's L layers sample the model's sparse layers: scale their mean
    moe, att_all, dense_all = metrics.rounded(layers["latency_s"].mean() * m.num_sparse_layers,
                                              m.num_layers * att, m.num_dense_layers * dense)
    other = att_all + dense_all
    return layers, moe + other, other


@struct.dataclass
class EPState:
    """Metrics summed over iterations (`metrics.Running`), and the trace's real tokens."""

    run: metrics.Running
    tokens: jax.Array  # real tokens over every iteration of the trace


SUMS = {
    "layer_latency_s": (),  # the mean MoE-layer latency of each iteration
    "forward_s": (),  # forward-pass latency
    "comm_s": (),  # per-layer all-to-all time (dispatch + combine)
    "compute_s": (),  # per-layer critical compute time
    "expert_s": (),  # per-layer critical expert time (compute or memory)
    "attention_s": (),  # attention (+ dense) time per forward
}


def build(cfg: EPConfig, num_iterations: int) -> System:
    """Synchronous EP as an init / step / finish system over `num_iterations` iterations."""
    d, lk = cfg.num_devices, cfg.topo.num_links
    shapes = {**SUMS, "device_compute_s": (d,), "link_bytes": (lk,)}

    def init(params: EPParams, trace: Trace, key):
        del key
        check_layers(params.placement, trace.counts.shape[-2])
        return EPState(metrics.Running.zeros(shapes), trace.tokens_per_iteration().sum())

    def step(params: EPParams, state: EPState, it: metrics.Iteration):
        layers, forward, other = iteration_times(cfg, params, it.expert_ids, it.token_mask,
                                                 it.counts)
        n_layers = layers["latency_s"].shape[0]
        run = state.run.add(metrics.real_iteration(it.counts[0].sum()), {
            "layer_latency_s": layers["latency_s"].mean(),
            "forward_s": forward,
            "comm_s": layers["comm_s"].mean(),
            "compute_s": layers["compute_s"].mean(),
            "expert_s": layers["expert_s"].mean(),
            "attention_s": other,
            "device_compute_s": layers["device_compute_s"].sum(0) / n_layers,
            "link_bytes": layers["link_bytes"].sum(0),
        })
        return state.replace(run=run), layers["latency_s"].mean()

    def finish(params: EPParams, state: EPState, outs):
        s, mean = state.run.sums, state.run.means()
        util = metrics.share_of(s["device_compute_s"], jnp.maximum(s["layer_latency_s"], 1e-30))
        return {
            "latency_s": mean["layer_latency_s"],
            "forward_s": mean["forward_s"],
            "comm_s": mean["comm_s"],
            "compute_s": mean["compute_s"],
            "memory_s": (s["expert_s"] - s["compute_s"]) / state.run.count(),
            "attention_s": mean["attention_s"],
            "utilization": util,
            "utilization_mean": util.mean(),
            "link_bytes": mean["link_bytes"],
            "tokens_per_s": state.tokens / jnp.maximum(s["forward_s"], 1e-30),
            "layer_latency_per_iter_s": outs,
        }

    return System(name="ep", init=init, step=step, finish=finish, num_steps=num_iterations,
                  accelerator_chunk=ACCELERATOR_CHUNK, inputs=metrics.inputs(num_iterations))


# --- policy options ------------------------------------------------------------------------


def _nesting(x) -> int:
    """Depth of nested lists (0 for a scalar)."""
    return 1 + _nesting(x[0]) if isinstance(x, list) and x else int(isinstance(x, list))


def placement_from_option(value, shares, num_experts: int, num_devices: int,
                          where: str) -> np.ndarray:
    """[E, D] or [L, E, D] share matrix from a policy's `placement` list: one device id per
    expert; or the devices of each expert's replicas (a list per expert, the even split of
    `moejax.placement.slots`, or `replica_shares` in the same nesting); or one such list per
    trace layer."""
    depth = _nesting(value)
    if depth == 3:
        return np.stack([placement_from_option(v, None if shares is None else s, num_experts,
                                               num_devices, f"{where} layer {i}")
                         for i, (v, s) in enumerate(zip(value, shares or [None] * len(value),
                                                        strict=True))])
    if len(value) != num_experts:
        raise ConfigError(f"{where}: key 'placement' needs {num_experts} entries (one per "
                          f"expert), got {len(value)}")
    rows = [v if isinstance(v, list) else [v] for v in value]
    out = np.zeros((num_experts, num_devices))
    for e, devs in enumerate(rows):
        if not devs or not all(isinstance(x, int) and 0 <= x < num_devices for x in devs):
            raise ConfigError(f"{where}: key 'placement' expert {e}: device ids {devs} must be "
                              f"a non-empty list of ints in [0, {num_devices})")
        w = np.full(len(devs), 1.0 / len(devs)) if shares is None else np.asarray(shares[e], float)
        if w.shape != (len(devs),) or (w < 0).any() or not np.isclose(w.sum(), 1.0, atol=1e-6):
            raise ConfigError(f"{where}: key 'replica_shares' expert {e}: {len(devs)} shares "
                              "that are >= 0 and sum to 1 expected")
        np.add.at(out[e], devs, w)
    return out


def _read_options(t, platform: Platform | None = None, model: ModelSpec | None = None):
    opts = dict(
        attention=t.str("attention", "dp", choices=ATTENTION_MODES),
        tp_size=t.int("tp_size", 1),
        context_len=t.int("context_len", 0, lo=0),
        comm_kernel=t.str("comm_kernel", "nccl", choices=tuple(comm.KERNELS)),
        comm_sms=t.int("comm_sms", 0, lo=0),
    )
    placement = t._get("placement", "contiguous", False)
    shares = t._get("replica_shares", None, False)
    t.close()
    if isinstance(placement, str):
        if placement not in ("contiguous", "round-robin"):
            raise ConfigError(f"{t.where}: key 'placement' = {placement!r}; allowed: "
                              "contiguous, round-robin, or a list of device ids per expert")
        if shares is not None:
            raise ConfigError(f"{t.where}: key 'replica_shares' needs a placement list")
        return opts, placement
    if not isinstance(placement, list) or _nesting(placement) not in (1, 2, 3):
        raise ConfigError(f"{t.where}: key 'placement' must be a name, a list of device ids, "
                          "a list of replica device lists, or one such list per layer")
    if shares is not None and _nesting(shares) != max(_nesting(placement), 2):
        raise ConfigError(f"{t.where}: key 'replica_shares' must nest like 'placement'")
    if model is not None and platform is not None:
        return opts, placement_from_option(placement, shares, model.num_experts,
                                           platform.num_devices, t.where)
    return opts, placement


def check_options(t) -> None:
    """Validate a policy's [options] for EP (names, types, ranges)."""
    _read_options(t)


def from_policy(platform: Platform, model: ModelSpec, t, num_iterations: int):
    """(System, params) for EP from a policy's options Table."""
    opts, placement = _read_options(t, platform, model)
    cfg = make_config(platform, model, **opts)
    if isinstance(placement, str):
        params = default_params(cfg, placement)
    else:
        params = EPParams(placement=jnp.asarray(placement, jnp.float32))
    return build(cfg, num_iterations), params
