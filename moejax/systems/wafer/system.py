"""Wafer-scale expert parallelism (001 MoEntwine) as an init / step / finish system.

One step is one inference iteration over the trace's sampled MoE layers (vmapped); per
layer (001 §II-B Fig. 5, §IV, §V-A):

1. attention (DP over TP groups, TP inside each group) by roofline, then the TP ring
   all-reduce = reduce-scatter + all-gather (the all-gather can be dropped, §IV-A, VI-B6;
   HER-Mapping: intra-wafer reduce-scatter + inter-wafer all-gather, §IV-B4);
2. MoE dispatch all-to-all: every (token, expert) pair goes to the devices serving the
   expert from the member of the token's TP group inside the destination's Full Token
   Domain (§IV-A: after the all-gather "any device [of an FTD] can access all required
   tokens, confining communication to this domain"; under HER from the token's holder on
   the destination's wafer; without the all-gather from the token's single holder), split
   evenly over the expert's replicas (shadow slots, §III-C); contention from the per-link
   loads of XY routing (`moejax.physics.collectives`), Eq. 1 latency;
3. experts by roofline on each device; 4. combine all-to-all (the dispatch reversed).

Attention with its all-reduce, and dispatch / experts / combine, are pipelined over
micro-batches (PipeMoE-like, §V-A Fig. 11(e), §VI-B: the best count of `micro_batches`).
A balancer (`balancer.py`) re-plans the shadow slots when Eq. 2 triggers; the copies move
on a migration stream: invasive = a migration phase on the critical path (the new replicas
serve from the next iteration); non-invasive = Local steps on links that are cold during the
all-reduce and Global steps on links cold during the all-to-all (§V-A), nothing on the
critical path: the replicas go live once the cold capacity has carried them (a delay in
iterations, `ni_delay_iterations`), and no new plan starts while one is in flight.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax import relax
from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.physics import collectives, eq1, topology
from moejax.physics.roofline import compute_time_s, memory_time_s
from moejax.system import System
from moejax.systems.wafer import balancer as bal
from moejax.systems.wafer import mapping as mp
from moejax.trace import Trace


@dataclasses.dataclass(frozen=True, eq=False)
class WaferConfig:
    """Static configuration (hashable by identity); arrays are built once by `make_config`."""

    platform: Platform
    model: ModelSpec
    topo: topology.Topology
    mapping: mp.Mapping
    source_split: np.ndarray  # [H, D, D] share of holder set h's tokens dst fetches from src
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    balancer: str = "none"
    invasive: bool = True
    shadow_slots: int = 0
    history_decay: float = 0.8  # EMA factor of the historical expert load (Alg. 1 Load_e)
    cold_fraction: float = 0.5  # a link is cold in a phase below this share of its peak load
    expert_dtype: str = "int8"  # 001 §VI-A: INT8 linear layers
    attention_dtype: str = "fp16"  # 001 §VI-A: FP16 attention and communication
    context_len: int = 0
    migration_free: bool = False  # copies from local disks over dedicated channels (001 §VI-D)
    # ESP (001 §VI-B5): experts sliced over EP groups of `expert_shards` devices (0 = off)
    expert_shards: int = 0
    esp_groups: np.ndarray | None = None  # [X, S] EP groups, ring order
    esp_landing: np.ndarray | None = None  # [H, X, D] where holder set h's tokens enter group x
    # network model of the all-to-all and ring collectives (mesh platforms): "link_load" =
    # cut-through max link load (`physics.collectives`), "eq1" = 001 Eq. 1 store-and-forward
    # per transfer, serialized per port (`physics.eq1`, ports "link" or "device")
    # defaults (issue 14): the paper's own model, 001 Eq. 1 with bidirectional rings; the
    # cut-through, one-way reading stays as network="link_load", bidirectional_rings=False
    network: str = "eq1"
    eq1_ports: str = "link"
    bidirectional_rings: bool = True  # 001 §IV-B2 "Packages are sent bi-directionally"

    @property
    def num_devices(self) -> int:
        return self.topo.num_devices

    @property
    def num_holder_sets(self) -> int:
        return int(self.mapping.holders.shape[0])

    @property
    def eq1(self) -> bool:
        """Eq. 1 mode in effect (mesh platforms only; switch fabrics keep the link loads)."""
        return self.network == "eq1" and self.topo.kind in ("mesh2d", "multi_wafer_mesh")


NETWORKS = ("link_load", "eq1")
# Traces per compiled call on an accelerator (`engine.System.accelerator_chunk`): XLA's GPU
# compile of this layer's largest reduce fusion grows steeply with the batch (Eq. 1 network,
# wsc-8x8, TP 4: 7-9 s at 4,096 traces, 20-25 s at 8,192 on an H200 and over 2.5 minutes on
# an H100, over 4 minutes at 16,384; docs/performance.md "Running on an accelerator").
ACCELERATOR_CHUNK = 4096


def make_config(platform: Platform, model: ModelSpec, *, mapping: str = "baseline",
                tp_size: int = 4, retain_allgather: bool = True,
                micro_batches: tuple[int, ...] = (1, 2, 4, 8), balancer: str = "none",
                invasive: bool = True, shadow_slots: int = 0, history_decay: float = 0.8,
                cold_fraction: float = 0.5, context_len: int = 0,
                migration_free: bool = False, expert_shards: int = 0,
                network: str = "eq1", eq1_ports: str = "link",
                bidirectional_rings: bool = True) -> WaferConfig:
    """Validated WaferConfig; topology, mapping and source split are built once here.

    expert_shards > 0 turns on ESP (001 §VI-B5): every expert is sliced over the devices of
    one EP group of that many devices (compact mesh tiles / contiguous GPU blocks).
    network: "link_load" (cut-through) or "eq1" (001 Eq. 1, mesh platforms; on switch
    fabrics the link loads are already per-port serialization and are kept).
    """
    if network not in NETWORKS:
        raise ConfigError(f"network = {network!r}; allowed: {', '.join(NETWORKS)}")
    if eq1_ports not in eq1.PORTS:
        raise ConfigError(f"eq1_ports = {eq1_ports!r}; allowed: {', '.join(eq1.PORTS)}")
    topo = topology.build(platform)
    spec = platform.topology
    if balancer not in bal.BALANCERS:
        raise ConfigError(f"balancer = {balancer!r}; allowed: {', '.join(bal.BALANCERS)}")
    if shadow_slots < 0:
        raise ConfigError(f"shadow_slots = {shadow_slots} must be >= 0")
    if not micro_batches or any(m < 1 for m in micro_batches):
        raise ConfigError(f"micro_batches = {micro_batches} must be a non-empty list of ints >= 1")
    if not 0.0 <= history_decay < 1.0:
        raise ConfigError(f"history_decay = {history_decay} must be in [0, 1)")
    if not 0.0 < cold_fraction <= 1.0:
        raise ConfigError(f"cold_fraction = {cold_fraction} must be in (0, 1]")
    if expert_shards:
        if mapping == "her":
            raise ConfigError("expert_shards > 0 (ESP) is modelled for mapping = 'baseline' or "
                              "'er' only (001 §VI-B5), not 'her'")
        if balancer != "none" or shadow_slots:
            raise ConfigError("expert_shards > 0 (ESP) needs balancer = 'none' and "
                              "shadow_slots = 0: replicas of sharded experts are not modelled")
    if spec.kind in ("mesh2d", "multi_wafer_mesh"):
        if mapping == "her" and not retain_allgather:
            raise ConfigError("retain_allgather = false is not defined for mapping = 'her' "
                              "(its inter-wafer all-gather is the mapping, 001 §IV-B4)")
        m = mp.build_mapping(mapping, topo.rows, topo.cols, tp_size,
                             retain_allgather=retain_allgather,
                             wafer_rows=spec.wafer_rows, wafer_cols=spec.wafer_cols)
        cost = topo.hops.astype(np.float64)
    else:
        if mapping != "baseline":
            raise ConfigError(f"mapping = {mapping!r} needs a mesh platform; {platform.name} is "
                              f"a {spec.kind} platform (allowed there: baseline)")
        m = mp.contiguous_mapping(topo.num_devices, tp_size, retain_allgather=retain_allgather)
        cost = topo.path_latency_s.astype(np.float64)
    if m.name == "her":
        split = mp.her_source_split(m)  # 001 §IV-B4: all-to-all inside each wafer
    elif retain_allgather:
        split = mp.ftd_source_split(m)  # 001 §IV-A: fetch inside the FTD
    else:
        split = mp.source_split(m.holders, cost)  # the token's single holder
    esp = {}
    if expert_shards:
        rows, cols = (topo.rows, topo.cols) if spec.kind in ("mesh2d", "multi_wafer_mesh") \
            else (1, topo.num_devices)
        groups = mp.esp_groups(rows, cols, expert_shards)
        # the landing device fetches a token from its nearest holder (itself if it is one)
        split = mp.source_split(m.holders, cost)
        esp = dict(esp_groups=groups, esp_landing=mp.esp_landing(m.holders, groups))
    return WaferConfig(platform, model, topo, m, split, tuple(int(x) for x in micro_batches),
                       balancer, invasive, shadow_slots, history_decay, cold_fraction,
                       "int8", "fp16", context_len, migration_free, int(expert_shards), **esp,
                       network=network, eq1_ports=eq1_ports,
                       bidirectional_rings=bool(bidirectional_rings))


@struct.dataclass
class WaferParams:
    """Tunable parameters (explicit expert x device arrays, so they can be relaxed later).

    placement [E, D]: native expert placement, one-hot rows (where each expert lives).
    shadow [E, D]: initial shadow-slot assignment, 0/1 (replicas before any balancing).
    alpha: Eq. 2 imbalance threshold (summed over the trace's layers), dimensionless.
    beta: Eq. 2 minimum iterations between migrations (0 for non-invasive).
    tau: relaxation temperature (0 = exact), in units of one expert's weight-load time.
    tau_trigger: temperature of the Eq. 2 gate (0 = the boolean trigger), in units of the
      summed layer imbalance; separate from `tau` so alpha can be tuned through a gate of
      useful width while the layer timings stay (nearly) hard (moejax.tune: the family
      temperature, `tau` the system's).
    """

    placement: jax.Array
    shadow: jax.Array
    alpha: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))
    beta: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))
    tau: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))
    tau_trigger: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))


def default_params(cfg: WaferConfig, *, alpha: float = 0.0, beta: float = 0.0) -> WaferParams:
    """Expert e natively on device e * D // E (one expert per device when E == D), no shadows.

    Under ESP expert e lives in EP group e * X // E (placement names the group's first device).
    """
    e, d = cfg.model.num_experts, cfg.num_devices
    if cfg.expert_shards:
        g = cfg.esp_groups
        place = jax.nn.one_hot(g[np.arange(e) * g.shape[0] // e, 0], d)
    else:
        place = jax.nn.one_hot(np.arange(e) * d // e, d)
    return WaferParams(place, jnp.zeros((e, d)), jnp.float32(alpha), jnp.float32(beta))


def served_share(host):
    """[E, D] share of expert e's tokens served by device d: hosts split evenly."""
    return host / jnp.maximum(host.sum(-1, keepdims=True), 1e-30)


def time_scale_s(cfg: WaferConfig) -> float:
    return cfg.model.expert_weight_bytes / cfg.platform.device.memory_Bps


# --- communication -------------------------------------------------------------------------


def holder_tokens(cfg: WaferConfig, expert_ids, token_mask, counts):
    """[H, E] (token, expert) pairs of each holder set (001 §IV-A: who holds which tokens)."""
    e = cfg.model.num_experts
    if expert_ids.shape[0] > 0:
        hs = mp.token_holder_sets(cfg.mapping, expert_ids.shape[0])
        owner = jax.nn.one_hot(hs, cfg.num_holder_sets)  # [N, H]
        routed = jax.nn.one_hot(expert_ids, e).sum(-2) * token_mask[:, None]
        return owner.T @ routed
    return jnp.asarray(mp.holder_shares(cfg.mapping))[:, None] * counts[None, :]


def dispatch_traffic(cfg: WaferConfig, served, pairs_he):
    """Dispatch traffic [D(src), D(dst)] in bytes (diagonal = local) from pairs [H, E].

    Each (token, expert) pair is fetched by the expert's serving devices from the holder
    `cfg.source_split` names (FTD member, or the nearest holder), one hidden state per pair.
    """
    b = pairs_he @ served  # [H, D(dst)]
    t = jnp.einsum("hd,hds->sd", b, jnp.asarray(cfg.source_split))
    return t * cfg.model.token_bytes


def allreduce_phases(cfg: WaferConfig, n_tokens):
    """Ring phases of one attention layer's all-reduce.

    Ring reduce-scatter (+ all-gather when retained) of each TP group's hidden states,
    `tokens per group * token_bytes` per member (001 §III-B, §IV-B2 entwined rings).
    HER (§IV-B4): the intra-wafer reduce-scatter, then the inter-wafer all-gather ring over
    the devices at the same wafer position. Returns [(steps, one step's traffic [D, D])].
    Like the paper, no mapping pays for merging combined partial outputs back into the next
    layer's input (the combine is the dispatch reversed, §IV-A).
    """
    m = cfg.mapping
    d = cfg.num_devices
    vol = n_tokens / m.num_groups * cfg.model.token_bytes
    phases = []  # (steps, traffic of one step [D, D])
    g = m.groups.shape[1]
    if g > 1:
        step = collectives.ring_step_traffic(m.groups, vol / g, d, cfg.bidirectional_rings)
        phases.append((g - 1, step))
        if m.name != "her" and m.retain_allgather:
            phases.append((g - 1, step))
    if m.name == "her":
        w = m.wafer_peers.shape[1]
        step = collectives.ring_step_traffic(m.wafer_peers, vol / g, d,
                                             cfg.bidirectional_rings)
        phases.append((w - 1, step))
    return phases


@functools.lru_cache(maxsize=64)
def allreduce_unit_phases(cfg: WaferConfig):
    """Static [(steps, link bytes per token [Lk] of one step, latency_s of one step,
    Eq. 1 port parts per token (bw [Pt], latency [Pt]) of one step or None)]."""
    out = []
    with jax.ensure_compile_time_eval():  # static geometry, also when first called under jit
        phases = [(steps, np.asarray(step, np.float32))
                  for steps, step in allreduce_phases(cfg, 1.0)]
        loads_of = [np.asarray(cfg.topo.link_loads(jnp.asarray(st)), np.float64)
                    for _, st in phases]
        ports_of = [eq1.port_parts_np(st, eq1.tables(cfg.topo, cfg.eq1_ports)) if cfg.eq1
                    else None for _, st in phases]
    for (steps, step), loads, ports in zip(phases, loads_of, ports_of, strict=True):
        # a phase equal to an earlier one (the retained all-gather repeats the reduce-scatter's
        # ring steps) folds into it: k * x + k * x == (2 k) * x exactly in floating point
        same = [i for i, (k, st) in enumerate(phases[:len(out)])
                if out[i] is not None and k == steps and np.array_equal(st, step)]
        if same:
            s0, l0, lat0, p0 = out[same[0]]
            out[same[0]] = (s0 + steps, l0, lat0, p0)
            out.append(None)
            continue
        lat = (cfg.topo.path_latency_s * (step * (1 - np.eye(len(step))) > 0)).max()
        out.append((steps, loads, lat if isinstance(lat, jax.core.Tracer) else float(lat),
                    ports))
    return tuple(o for o in out if o is not None)


# --- ESP (001 §VI-B5) -----------------------------------------------------------------------


def esp_member(cfg: WaferConfig) -> np.ndarray:
    """float [D, X]: device d belongs to EP group x."""
    g = cfg.esp_groups
    out = np.zeros((cfg.num_devices, g.shape[0]), np.float32)
    out[g, np.arange(g.shape[0])[:, None]] = 1.0
    return out


@functools.lru_cache(maxsize=64)
def esp_unit_steps(cfg: WaferConfig):
    """Static (link bytes [X, Lk], latency_s [X]) of one ring step of each EP group.

    Member i of group x sends one byte to member i + 1 (`collectives.ring_step_traffic`);
    groups are disjoint tiles, so a step of all groups loads the links with the sum.
    """
    g = cfg.esp_groups
    d = cfg.num_devices
    with jax.ensure_compile_time_eval():
        steps = np.stack([np.asarray(collectives.ring_step_traffic(g[x:x + 1], 1.0, d))
                          for x in range(g.shape[0])])  # [X, D, D]
        loads = np.asarray(cfg.topo.link_loads(jnp.asarray(steps)), np.float64)
        ports = eq1.port_parts_np(steps, eq1.tables(cfg.topo, cfg.eq1_ports)) if cfg.eq1 \
            else None
    lat = (cfg.topo.path_latency_s[None] * (steps > 0)).max(axis=(1, 2))
    return loads, lat, ports


def esp_served(cfg: WaferConfig, host):
    """(expert -> EP group shares [E, X], served [E, D]) under ESP (001 §VI-B5).

    host [E, D]: expert e's EP group is that of its native device (soft rows: shares);
    each of the group's S slices serves all of the expert's tokens with 1/S of the work.
    """
    member = jnp.asarray(esp_member(cfg))  # [D, X]
    eg = host @ member
    eg = eg / jnp.maximum(eg.sum(-1, keepdims=True), 1e-30)
    return eg, eg @ member.T / cfg.expert_shards


def esp_dispatch_traffic(cfg: WaferConfig, pairs_hx):
    """ESP all-to-all [D(src), D(dst)] bytes from (token, expert) pairs per holder set and
    EP group [H, X]: each pair enters its group once, where `mapping.esp_landing` puts it
    (free when a holder of the token is in the group, as for every token under ER with
    S = D / TP), fetched from the nearest holder."""
    b = jnp.einsum("hx,hxd->hd", pairs_hx, jnp.asarray(cfg.esp_landing))
    return jnp.einsum("hd,hds->sd", b, jnp.asarray(cfg.source_split)) * cfg.model.token_bytes


def esp_ring(cfg: WaferConfig, vol, tau_s):
    """Ring collectives inside the EP groups (001 §VI-B5), vol [X] bytes gathered per group.

    A ring all-gather of the group's tokens (every slice needs every token) before the
    expert slices and a ring reduce-scatter of the partial sums back to the landing devices
    after them: together the volume of one all-reduce inside the EP group ("all-reduce
    operations to aggregate partial sums within EP groups"), (S - 1) steps each of V_x / S
    per member. Returns (link bytes [Lk], busy_s, latency_s, Eq. 1 port parts of one step
    (bw [Pt], latency [Pt]) or None) of one of the two collectives.
    """
    s = cfg.expert_shards
    unit, lat, ports = esp_unit_steps(cfg)
    loads = (vol / s) @ jnp.asarray(unit, jnp.float32)  # one ring step [Lk]
    bw = jnp.asarray(cfg.topo.link_Bps, jnp.float32)
    busy = (s - 1) * relax.max(loads / bw, tau_s, axis=-1)
    ring_lat = (s - 1) * jnp.max((vol > 0) * jnp.asarray(lat, jnp.float32))
    pp = None
    if ports is not None:  # groups are disjoint tiles: their ports never coincide
        pp = ((vol / s) @ jnp.asarray(ports[0], jnp.float32),
              (vol > 0).astype(jnp.float32) @ jnp.asarray(ports[1], jnp.float32))
    return loads * (s - 1), busy, ring_lat, pp


# --- all-to-all through static unit tables -------------------------------------------------

UNIT_TABLE_MAX = 1 << 24  # entries of a unit table; beyond it the traffic matrix is built


@dataclasses.dataclass(frozen=True)
class UnitTables:
    """The all-to-all of one layer as a static linear map of a per-trace driver v [U].

    The dispatch traffic is sum_u v_u * T_u for static matrices T_u [D, D] (bytes per pair
    over token_bytes); everything the layer needs from it is linear in v (link loads) or a
    max over the units in use (latency: T_u >= 0 and v >= 0, so a route carries traffic iff
    some unit with v_u > 0 uses it). The [D, D] matrix never has to be built per trace.
    """

    d_loads: np.ndarray  # [U, Lk] dispatch link bytes per unit of v
    c_loads: np.ndarray  # [U, Lk] combine (the dispatch reversed)
    d_lat: np.ndarray  # [U] longest route latency of T_u (0 if all local)
    c_lat: np.ndarray  # [U] same for T_u transposed
    hops: np.ndarray  # [U] sum of T_u * hops
    remote: np.ndarray  # [U] off-diagonal sum of T_u
    total: np.ndarray  # [U] sum of T_u
    # Eq. 1 (`physics.eq1.port_parts`) per unit, dispatch d_ / combine c_, [U, Pt]; exact as
    # bw = v @ pbw, latency = [v > 0] @ plat because the units' supports are disjoint
    # (checked when built; None when not in Eq. 1 mode)
    d_pbw: np.ndarray | None = None
    d_plat: np.ndarray | None = None
    c_pbw: np.ndarray | None = None
    c_plat: np.ndarray | None = None
    # hard mode (`eq1_hard_ports`): the dispatch / combine ports split into a block that is
    # diagonal in the units (counts-only: unit u = device u, whose own in-ports (dispatch) or
    # out-ports (combine) only it loads) and the other ports some unit uses (nonzero
    # bandwidth part; unused ones stay 0, every part is >= 0, so the max does not need them)
    d_cols: np.ndarray | None = None  # matrix-product ports of the dispatch
    c_cols: np.ndarray | None = None
    d_diag: tuple | None = None  # (bw [U, P], latency [U, P]) diagonal block, or None
    c_diag: tuple | None = None


def _unit_weights(cfg: WaferConfig, counts_only: bool) -> np.ndarray:
    """W [U, H, D]: T_u[s, d] = sum_h W[u, h, d] * source_split[h, d, s].

    Drivers: counts-only: v = counts @ served [D] (holder sets share tokens evenly), ESP
    v = counts @ eg [X]; token-level: v = (pairs @ served) [H * D], ESP (pairs @ eg) [H * X].
    """
    h, d = cfg.num_holder_sets, cfg.num_devices
    share = mp.holder_shares(cfg.mapping)
    if cfg.expert_shards:
        land = cfg.esp_landing.astype(np.float64)  # [H, X, D]
        if counts_only:
            return np.einsum("h,hxd->xhd", share, land)
        x = land.shape[1]
        w = np.zeros((h, x, h, d))
        w[np.arange(h), :, np.arange(h), :] = land
        return w.reshape(h * x, h, d)
    if counts_only:
        w = np.zeros((d, h, d))
        w[np.arange(d), :, np.arange(d)] = share[None, :]
        return w
    return np.eye(h * d).reshape(h * d, h, d)


@functools.lru_cache(maxsize=64)
def unit_tables(cfg: WaferConfig, counts_only: bool) -> UnitTables | None:
    """Static UnitTables of `cfg` (None when larger than UNIT_TABLE_MAX entries)."""
    h, d, lk = cfg.num_holder_sets, cfg.num_devices, cfg.topo.num_links
    n = {True: (cfg.esp_groups.shape[0] if cfg.expert_shards else d),
         False: h * (cfg.esp_groups.shape[0] if cfg.expert_shards else d)}[counts_only]
    pt = eq1.tables(cfg.topo, cfg.eq1_ports).num_ports if cfg.eq1 else 0
    if n * max(lk, h * d, 2 * pt) > UNIT_TABLE_MAX:
        return None
    w = _unit_weights(cfg, counts_only)
    split = cfg.source_split.astype(np.float64)
    off = 1.0 - np.eye(d)
    plat = cfg.topo.path_latency_s
    keys = ("d_loads", "c_loads", "d_lat", "c_lat", "hops", "remote", "total")
    if cfg.eq1:
        keys += ("d_pbw", "d_plat", "c_pbw", "c_plat")
        support = np.zeros((d, d))
    parts = {k: [] for k in keys}
    step = max(1, (1 << 22) // (d * d * max(1, pt // d)))
    for a in range(0, n, step):
        t = np.einsum("uhd,hds->usd", w[a:a + step], split)  # [u, D(src), D(dst)]
        with jax.ensure_compile_time_eval():  # static geometry, also when called under jit
            parts["d_loads"].append(np.asarray(cfg.topo.link_loads(jnp.asarray(t))))
            parts["c_loads"].append(np.asarray(cfg.topo.link_loads(
                jnp.asarray(t.transpose(0, 2, 1)))))
        if cfg.eq1:  # host NumPy: static geometry
            tab = eq1.tables(cfg.topo, cfg.eq1_ports)
            for k, tt in (("d", t), ("c", t.transpose(0, 2, 1))):
                pb, pl = eq1.port_parts_np(tt, tab)
                parts[f"{k}_pbw"].append(pb)
                parts[f"{k}_plat"].append(pl)
            support += (t * off > 0).sum(0)
        used = t * off > 0
        parts["d_lat"].append((used * plat).max(axis=(1, 2)))
        parts["c_lat"].append((used.transpose(0, 2, 1) * plat).max(axis=(1, 2)))
        parts["hops"].append((t * cfg.topo.hops).sum(axis=(1, 2)))
        parts["remote"].append((t * off).sum(axis=(1, 2)))
        parts["total"].append(t.sum(axis=(1, 2)))
    if cfg.eq1 and support.max() > 1:  # overlapping units: the latency indicator is not linear
        return None
    xp = jnp if isinstance(plat, jax.core.Tracer) else np  # a swept hop latency (runner.sweep)
    cols = {}
    if cfg.eq1 and xp is np:  # a port is used iff its bandwidth part is > 0 (inv_bw > 0)
        for k in ("d", "c"):
            cols.update(_hard_port_split(k, np.concatenate(parts[f"{k}_pbw"]),
                                         np.concatenate(parts[f"{k}_plat"]), d))
    return UnitTables(**{k: xp.concatenate(v).astype(xp.float32) for k, v in parts.items()},
                      **cols)


def _hard_port_split(k: str, pbw: np.ndarray, plat: np.ndarray, d: int) -> dict:
    """UnitTables' `{k}_cols` / `{k}_diag` from a phase's port tables [U, 2 D P] (out, in)."""
    u, pt = pbw.shape
    p = pt // (2 * d)
    used = pbw.max(0) > 0
    diag = None
    if u == d:
        for blk in (1, 0):  # in-ports (dispatch), out-ports (combine)
            sl = slice(blk * d * p, (blk + 1) * d * p)
            w = pbw[:, sl].reshape(u, d, p)
            if not (w * (1.0 - np.eye(d))[:, :, None]).any():
                idx = np.arange(d)
                diag = (w[idx, idx].astype(np.float32),
                        plat[:, sl].reshape(u, d, p)[idx, idx].astype(np.float32))
                used[sl] = False
                break
    cols = np.flatnonzero(used)
    return {f"{k}_cols": cols if cols.size or diag else np.zeros(1, np.int64),
            f"{k}_diag": diag}


def eq1_hard_ports(tabs: UnitTables, v, tb):
    """(dispatch link bytes [Lk], combine link bytes [Lk], Eq. 1 port parts ((bw, latency)
    of the dispatch, of the combine)) in hard mode: only the ports a unit uses, the link
    loads and both phases' bandwidth parts in one matrix product, the latency parts in one
    more, the diagonal blocks elementwise. Same max as the full port vectors (parts >= 0)."""
    on = (v > 0).astype(jnp.float32)
    nd, lk = len(tabs.d_cols), tabs.d_loads.shape[1]
    prod = v @ jnp.asarray(np.concatenate([tabs.d_loads, tabs.c_loads,
                                           tabs.d_pbw[:, tabs.d_cols],
                                           tabs.c_pbw[:, tabs.c_cols]], axis=1)) * tb
    d_loads, c_loads, pbw = prod[:lk], prod[lk:2 * lk], prod[2 * lk:]
    plat = on @ jnp.asarray(np.concatenate([tabs.d_plat[:, tabs.d_cols],
                                            tabs.c_plat[:, tabs.c_cols]], axis=1))
    out = []
    for diag, b, lat in ((tabs.d_diag, pbw[:nd], plat[:nd]), (tabs.c_diag, pbw[nd:],
                                                               plat[nd:])):
        if diag is not None:
            b = jnp.concatenate([b, (v[:, None] * diag[0]).reshape(-1) * tb])
            lat = jnp.concatenate([lat, (on[:, None] * diag[1]).reshape(-1)])
        out.append((b, lat))
    return d_loads, c_loads, out[0], out[1]


def all_to_all_parts(cfg: WaferConfig, host, expert_ids, token_mask, counts, tau_s):
    """Dispatch and combine of one layer (001 §III-B, §IV-A; ESP §VI-B5).

    Returns (served [E, D] under ESP else None, dict of dispatch / combine busy_s,
    latency_s, link bytes [Lk], avg_hops, remote_bytes, and under ESP the bytes gathered into
    each EP group vol [X]).
    """
    topo = cfg.topo
    tb = cfg.model.token_bytes
    counts_only = expert_ids.shape[0] == 0
    if cfg.expert_shards:
        mix, served = esp_served(cfg, host)  # [E, X]
        scale = jnp.ones(host.shape[0])
    else:  # counts @ served == (counts * scale) @ host: served [E, D] is never built
        mix, served = host, None
        scale = 1.0 / jnp.maximum(host.sum(-1), 1e-30)  # served = host * scale[:, None]
    pairs = None if counts_only else holder_tokens(cfg, expert_ids, token_mask, counts)
    vol = (counts @ mix if counts_only else pairs.sum(0) @ mix) * tb  # [X] (ESP)
    tabs = unit_tables(cfg, counts_only)
    if tabs is None:  # too large for static tables: build the traffic matrix
        if pairs is None:
            pairs = holder_tokens(cfg, expert_ids, token_mask, counts)
        disp = (esp_dispatch_traffic(cfg, pairs @ mix) if cfg.expert_shards
                else dispatch_traffic(cfg, served_share(host), pairs))
        d_busy, d_lat, d_loads = phase_parts(disp, topo, tau_s)
        c_busy, c_lat, c_loads = phase_parts(disp.T, topo, tau_s)
        hops = (disp * jnp.asarray(topo.hops, jnp.float32)).sum() / jnp.maximum(disp.sum(),
                                                                                1e-30)
        remote = (disp * (1.0 - jnp.eye(cfg.num_devices))).sum() * 2.0
        if cfg.eq1:
            tab = eq1.tables(topo, cfg.eq1_ports)
            d_ports, c_ports = eq1.port_parts(disp, tab), eq1.port_parts(disp.T, tab)
    else:
        v = (counts * scale) @ mix if counts_only else ((pairs * scale) @ mix).reshape(-1)
        bw = jnp.asarray(topo.link_Bps, jnp.float32)
        eq1_hard = (cfg.eq1 and isinstance(tau_s, float) and tau_s == 0.0
                    and tabs.d_cols is not None)  # `layer`'s hard branch
        if eq1_hard:
            d_loads, c_loads, d_ports, c_ports = eq1_hard_ports(tabs, v, tb)
        else:
            d_loads = (v @ jnp.asarray(tabs.d_loads)) * tb
            c_loads = (v @ jnp.asarray(tabs.c_loads)) * tb
        d_busy = relax.max(d_loads / bw, tau_s, axis=-1)
        c_busy = relax.max(c_loads / bw, tau_s, axis=-1)
        d_lat = jnp.max((v > 0) * jnp.asarray(tabs.d_lat))
        c_lat = jnp.max((v > 0) * jnp.asarray(tabs.c_lat))
        hops = (v @ jnp.asarray(tabs.hops)) / jnp.maximum(v @ jnp.asarray(tabs.total), 1e-30)
        remote = (v @ jnp.asarray(tabs.remote)) * tb * 2.0
        if cfg.eq1 and not eq1_hard:
            on = (v > 0).astype(jnp.float32)
            d_ports = ((v @ jnp.asarray(tabs.d_pbw)) * tb, on @ jnp.asarray(tabs.d_plat))
            c_ports = ((v @ jnp.asarray(tabs.c_pbw)) * tb, on @ jnp.asarray(tabs.c_plat))
    if not cfg.eq1:
        d_ports = c_ports = None
    return served, dict(d_busy=d_busy, d_lat=d_lat, d_loads=d_loads, c_busy=c_busy,
                        c_lat=c_lat, c_loads=c_loads, avg_hops=hops, remote_bytes=remote,
                        vol=vol, d_ports=d_ports, c_ports=c_ports)


def phase_parts(traffic, topo, tau=0.0):
    """(busy_s, latency_s, link bytes [Lk]) of one phase (collectives.phase_time_s split)."""
    loads = topo.link_loads(traffic)
    busy = relax.max(loads / jnp.asarray(topo.link_Bps, jnp.float32), tau, axis=-1)
    dd = traffic.shape[-1]
    active = (traffic * (1.0 - jnp.eye(dd)) > 0).astype(jnp.float32)
    lat = jnp.max(active * jnp.asarray(topo.path_latency_s, jnp.float32), axis=(-2, -1))
    return busy, lat, loads


def pipeline_s(stages_busy, stages_lat, m, tau=0.0):
    """Micro-batch pipeline of S stages over m micro-batches (PipeMoE-like, 001 §V-A).

    Each stage takes busy / m + latency per micro-batch; the pipeline takes the sum of one
    pass plus (m - 1) passes of its slowest stage.
    """
    st = jnp.stack([b / m + lat for b, lat in zip(stages_busy, stages_lat, strict=True)])
    return st.sum(0) + (m - 1) * relax.max(st, tau, axis=0)


def stage_s(busy, lat, ports, mb, tau=0.0):
    """[M] seconds per micro-batch of one communication stage for each count in mb [M, 1]:
    cut-through busy / m + latency, or Eq. 1 (ports = (bw [Pt], latency [Pt])) the busiest
    port with 1/m of every transfer."""
    if ports is None:
        return (busy / mb + lat)[:, 0]
    return eq1.time_s(ports[0][None, :], ports[1][None, :], mb, tau)


def pipeline_stages_s(stages, tau=0.0):
    """`pipeline_s` from per-micro-batch stage times [S, M] (m from the stage times)."""
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
    comp = compute_time_s(tokens_ed * m.expert_flops_per_token, dev.flops(cfg.expert_dtype))
    mem = memory_time_s(relax.positive(tokens_ed, tau_tok) * m.expert_weight_bytes * share,
                        dev.memory_Bps)
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
    comp = compute_time_s(tokens * m.expert_flops_per_token, dev.flops(cfg.expert_dtype))

    def fast():
        g = jnp.where(ce > 0, jnp.maximum(
            compute_time_s(ce * m.expert_flops_per_token, dev.flops(cfg.expert_dtype)),
            memory_time_s(m.expert_weight_bytes, dev.memory_Bps)), 0.0)
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
    ctx = cfg.context_len if cfg.context_len > 0 else tok / 2
    flops = tok * (m.attention_flops_per_token + 4.0 * ctx * m.num_heads * m.head_dim) / g
    kv = tok * ctx * m.kv_bytes_per_token * (cfg.context_len > 0)
    bytes_ = (m.attention_weight_bytes + kv) / g
    comp = compute_time_s(flops, dev.flops(cfg.attention_dtype))
    return relax.maximum(comp, memory_time_s(bytes_, dev.memory_Bps), tau_s)


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
    bw = jnp.asarray(topo.link_Bps, jnp.float32)
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


# --- migration (001 §V-A) ------------------------------------------------------------------


def migration_traffic(cfg: WaferConfig, native, new_copies):
    """[D(src), D(dst)] bytes of expert copies: new_copies [L, E, D] 0/1, from the native host."""
    per = new_copies.sum(0)  # [E, D(dst)]
    return native.T @ per * cfg.model.expert_weight_bytes


def migration_time_s(cfg: WaferConfig, mig):
    """Seconds of an invasive migration `mig` [D, D] bytes (001 §III-C, Fig. 7(b)): the copies
    as one phase of transfers, timed by the layer's network model (Eq. 1 per port, or the
    cut-through busiest link + longest route latency)."""
    if cfg.eq1:
        return eq1.phase_time_s(mig, cfg.topo, cfg.eq1_ports)
    busy, lat, _ = phase_parts(mig, cfg.topo)
    return busy + lat


def cold_links(loads, cold_fraction):
    """[Lk] bool: links whose load in a phase is at most `cold_fraction` of the phase's peak."""
    return loads <= cold_fraction * jnp.max(loads)


def non_invasive_split(cfg: WaferConfig, need, ar_loads, ar_s, a2a_loads, a2a_s):
    """Split migration link bytes `need` [Lk] over the cold links of each phase (001 §V-A).

    Local steps ride links cold during the all-reduce, Global steps links cold during the
    all-to-all; each phase's spare capacity on a cold link is (phase time * bw - its load)
    summed over the model's layers. Returns (local [Lk], global [Lk], spill [Lk]) bytes.
    """
    bw = jnp.asarray(cfg.topo.link_Bps, jnp.float32)
    layers = cfg.model.num_layers
    cold_ar = cold_links(ar_loads, cfg.cold_fraction)
    cold_a2a = cold_links(a2a_loads, cfg.cold_fraction)
    cap_ar = jnp.where(cold_ar, jnp.maximum(ar_s * bw - ar_loads, 0.0), 0.0) * layers
    cap_a2a = jnp.where(cold_a2a, jnp.maximum(a2a_s * bw - a2a_loads, 0.0), 0.0) * layers
    local = jnp.minimum(need, cap_ar)
    glob = jnp.minimum(need - local, cap_a2a)
    return local, glob, need - local - glob


def ni_delay_iterations(cfg: WaferConfig, need, ar_loads, ar_s, a2a_loads, a2a_s):
    """Iterations the non-invasive stream needs to move `need` [Lk] bytes (>= 1).

    Each iteration offers the cold capacity of `non_invasive_split` (Local + Global steps).
    A link on a migration route that is hot in both phases offers nothing there; the paper
    routes around it (Local -> Global -> Local, Fig. 11(d)), which we approximate by letting
    such a link use the spare capacity of its less loaded phase.
    """
    bw = jnp.asarray(cfg.topo.link_Bps, jnp.float32)
    layers = cfg.model.num_layers
    cold_ar = cold_links(ar_loads, cfg.cold_fraction)
    cold_a2a = cold_links(a2a_loads, cfg.cold_fraction)
    spare_ar = jnp.maximum(ar_s * bw - ar_loads, 0.0)
    spare_a2a = jnp.maximum(a2a_s * bw - a2a_loads, 0.0)
    cap = (jnp.where(cold_ar, spare_ar, 0.0) + jnp.where(cold_a2a, spare_a2a, 0.0))
    cap = jnp.where(cold_ar | cold_a2a, cap, jnp.where(ar_loads < a2a_loads, spare_ar,
                                                      spare_a2a)) * layers
    ratio = jnp.where(need > 0, need / jnp.maximum(cap, 1e-30), 0.0)
    return jnp.maximum(jnp.ceil(jnp.max(ratio)), 1.0)


@struct.dataclass
class WaferState:
    """Balancer state and accumulators (float32)."""

    trace: Trace
    shadow: jax.Array  # [L, E, D] current shadow-slot assignment
    history: jax.Array  # [L, E] EMA of expert loads (Alg. 1 Load_e)
    since_migration: jax.Array  # iterations since the last migration (Eq. 2 dt_mig)
    pending: jax.Array  # [L, E, D] non-invasive: shadow plan still moving on cold links
    pending_left: jax.Array  # iterations until `pending` is in place (<= 0: none pending)
    sums: dict  # per-metric sums over iterations
    link_bytes: jax.Array  # [Lk] all-to-all bytes per link (summed)
    ar_link_bytes: jax.Array  # [Lk] all-reduce bytes per link (summed)
    iterations: jax.Array


SCALARS = ("layer_s", "forward_s", "all_to_all_s", "all_reduce_s", "esp_reduce_s",
           "attention_s", "moe_compute_s", "moe_phase_s", "attention_phase_s", "avg_hops",
           "max_over_mean",
           "migrations", "migration_s", "migration_bytes", "spill_bytes", "micro_batches",
           "moe_throughput", "utilization_mean", "tokens", "activation_delay")


def build(cfg: WaferConfig, num_iterations: int) -> System:
    """The wafer EP system over `num_iterations` iterations (one step = one iteration)."""
    d, lk, e = cfg.num_devices, cfg.topo.num_links, cfg.model.num_experts
    hops = np.asarray(cfg.topo.hops)
    # statically nothing to move: the shadow slots stay params.shadow for the whole run
    static = cfg.balancer == "none" or cfg.shadow_slots == 0

    def init(params: WaferParams, trace: Trace, key):
        del key
        n_layers = trace.counts.shape[-2]
        z = jnp.float32(0.0)
        # static (nothing moves): the step reads params.shadow, so the state carries an empty
        # [L, 0, D] placeholder instead of a per-trace [L, E, D] copy (32 MB at 1024 traces)
        shadow = (jnp.zeros((n_layers, 0, d)) if static else
                  jnp.broadcast_to(params.shadow, (n_layers, e, d)).astype(jnp.float32))
        return WaferState(trace, shadow, jnp.zeros((n_layers, e)), jnp.float32(1e9), shadow,
                          z, {k: z for k in SCALARS}, jnp.zeros(lk), jnp.zeros(lk), z)

    def step(params: WaferParams, state: WaferState, t):
        tr = state.trace
        native = params.placement.astype(jnp.float32)
        ids, mask, counts = tr.expert_ids[t], tr.token_mask[t], tr.counts[t]
        # host = clip(native + shadow) is 0/1 when the params are (plans add 0/1 replicas);
        # a relaxed trigger (tau > 0) leaves soft shadows, but `binary` only selects the
        # fast expert path in hard mode (`expert_times`)
        binary = is_binary(params.placement) & is_binary(params.shadow)
        if static:  # the shadow slots never move: one host for every layer and trace, so
            # under the engine's vmap over traces the layer's host products stay matrix
            # products with a shared [E, D] (not a [T, E, D] batch; 25x less work at 8x8)
            host1 = jnp.clip(native + params.shadow, 0.0, 1.0)  # [E, D]
            out = jax.vmap(lambda i, c: layer(cfg, params, host1, i, mask, c, binary))(ids,
                                                                                      counts)
        else:
            host = jnp.clip(native[None] + state.shadow, 0.0, 1.0)  # [L, E, D]
            out = jax.vmap(lambda h, i, c: layer(cfg, params, h, i, mask, c, binary))(
                host, ids, counts)
        real = (counts.sum() > 0).astype(jnp.float32)
        m = cfg.model
        dev_load = out["device_tokens"]  # [L, D]
        ratio = dev_load.max(-1) / jnp.maximum(dev_load.mean(-1), 1e-30)
        history = jnp.where(state.iterations > 0,
                            cfg.history_decay * state.history + (1 - cfg.history_decay) * counts,
                            counts)
        idle = state.pending_left <= 0  # no non-invasive migration still in flight
        # the trace's layers sample the model's sparse layers: each of those layers migrates
        layer_scale = m.num_sparse_layers / counts.shape[0]
        if static:
            trigger = jnp.float32(0.0)
            planned = plan_shadow = state.shadow
            copies = jnp.float32(0.0)
            mig = jnp.zeros((d, d))
            mig_busy, mig_lat, need = jnp.float32(0.0), jnp.float32(0.0), jnp.zeros(lk)
        else:
            # 001 Eq. 2 as a gate g in [0, 1] (1[trigger] at tau_trigger = 0; the imbalance
            # comparison a sigmoid of width tau_trigger > 0, so alpha has a gradient; the
            # iteration counters are compared hard). Every decision below is the blend
            # g * (re-plan) + (1 - g) * (keep), which is the boolean path at g in {0, 1}.
            trigger = (bal.eq2_gate(dev_load, state.since_migration, params.alpha,
                                    params.beta, params.tau_trigger, tau_since=0.0)
                       * (real > 0) * idle)
            planned = jnp.clip(jax.vmap(lambda ld: bal.plan(
                ld, native, cfg.shadow_slots, hops, cfg.balancer))(history) - native[None],
                0.0, 1.0)  # [L, E, D] shadow slots of a new plan
            plan_shadow = trigger * planned + (1.0 - trigger) * state.shadow
            copies = jnp.clip(planned - host, 0.0, 1.0) * trigger  # replicas that move
            mig = migration_traffic(cfg, native, copies) * layer_scale
            mig_busy, mig_lat, need = phase_parts(mig, cfg.topo)
        a2a_loads = out["a2a_link_bytes"].mean(0)
        ar_loads = out["ar_link_bytes"].mean(0)
        delay = jnp.float32(0.0)
        spill = jnp.zeros_like(need)
        if cfg.migration_free:  # NVL72 with NVMe channels: off the network (001 §VI-D)
            mig_s = jnp.float32(0.0)
            new_shadow, pending, left = plan_shadow, state.pending, state.pending_left
        elif cfg.invasive:  # 001 §III-C, Fig. 7(b): iterations stop while experts move
            mig_s = mig_busy + mig_lat if static else migration_time_s(cfg, mig)
            spill = need
            new_shadow, pending, left = plan_shadow, state.pending, state.pending_left
        else:  # 001 §V-A: a background stream on cold links; replicas go live when moved
            mig_s = jnp.float32(0.0)
            delay = ni_delay_iterations(cfg, need, ar_loads, out["ar_busy_s"].mean(),
                                        a2a_loads, out["a2a_busy_s"].mean())
            pending = trigger * planned + (1.0 - trigger) * state.pending
            left = trigger * delay + (1.0 - trigger) * state.pending_left - 1.0
            new_shadow = jnp.where(left <= 0, pending, state.shadow)
        att_only = out["attention_phase_s"].mean()
        forward = (out["layer_s"].mean() * m.num_sparse_layers
                   + att_only * m.num_dense_layers + mig_s)
        moe_tp = (counts.sum(-1) / jnp.maximum(out["moe_phase_s"], 1e-30)).mean() / d
        vals = {
            "layer_s": out["layer_s"].mean(), "forward_s": forward,
            "all_to_all_s": out["all_to_all_s"].mean(), "all_reduce_s": out["all_reduce_s"].mean(),
            "esp_reduce_s": out["esp_reduce_s"].mean(),
            "attention_s": out["attention_s"].mean(), "moe_compute_s": out["moe_compute_s"].mean(),
            "moe_phase_s": out["moe_phase_s"].mean(),
            "attention_phase_s": out["attention_phase_s"].mean(),
            "avg_hops": out["avg_hops"].mean(), "max_over_mean": ratio.mean(),
            "migrations": copies.sum() * layer_scale, "migration_s": mig_s,
            "migration_bytes": mig.sum() - jnp.trace(mig), "spill_bytes": spill.sum(),
            "micro_batches": out["micro_batches"].mean(), "moe_throughput": moe_tp,
            "utilization_mean": (out["device_compute_s"].mean(-1)
                                 / jnp.maximum(out["layer_s"], 1e-30)).mean(),
            "tokens": counts[0].sum() / m.top_k, "activation_delay": delay,
        }
        sums = {k: state.sums[k] + real * vals[k] for k in SCALARS}
        new = state.replace(
            shadow=jnp.where(real > 0, new_shadow, state.shadow),
            history=jnp.where(real > 0, history, state.history),
            since_migration=(1.0 - trigger) * (state.since_migration + 1.0),
            pending=jnp.where(real > 0, pending, state.pending),
            pending_left=jnp.where(real > 0, left, state.pending_left),
            sums=sums,
            link_bytes=state.link_bytes + real * a2a_loads,
            ar_link_bytes=state.ar_link_bytes + real * ar_loads,
            iterations=state.iterations + real,
        )
        per_iter = {"max_over_mean": ratio.mean(), "migrations": copies.sum() * layer_scale,
                    "migration_s": mig_s, "forward_s": forward,
                    "device_load": dev_load.mean(0), "moe_throughput": moe_tp}
        return new, per_iter

    def finish(params: WaferParams, state: WaferState, outs):
        n = jnp.maximum(state.iterations, 1.0)
        res = {k: v / n for k, v in state.sums.items()}
        res["migrations"] = state.sums["migrations"]
        res["activation_delay"] = state.sums["activation_delay"] / jnp.maximum(
            (outs["migrations"] > 0).sum(), 1.0)
        res["comm_s"] = res["all_to_all_s"] + res["all_reduce_s"] + res["esp_reduce_s"]
        res["migration_ratio"] = res["migration_s"] / jnp.maximum(res["forward_s"], 1e-30)
        res["link_bytes"] = state.link_bytes / n
        res["ar_link_bytes"] = state.ar_link_bytes / n
        res["latency_s"] = res["layer_s"]
        res["compute_s"] = res["moe_compute_s"]
        res["tokens_per_s"] = state.sums["tokens"] / jnp.maximum(state.sums["forward_s"], 1e-30)
        res["per_iteration"] = outs
        return res

    return System(name="wafer", init=init, step=step, finish=finish, num_steps=num_iterations,
                  accelerator_chunk=ACCELERATOR_CHUNK)


# --- policy options ------------------------------------------------------------------------


def _read_options(t) -> tuple[dict, dict]:
    """(make_config kwargs, params kwargs) from a policy's [options] Table."""
    opts = dict(
        mapping=t.str("mapping", "baseline", choices=mp.MAPPINGS),
        tp_size=t.int("tp_size", 4),
        retain_allgather=t.bool("retain_allgather", True),
        balancer=t.str("balancer", "none", choices=bal.BALANCERS),
        invasive=t.bool("invasive", True),
        shadow_slots=t.int("shadow_slots", 0, lo=0),
        history_decay=t.float("history_decay", 0.8, positive=False, hi=0.999),
        cold_fraction=t.float("cold_fraction", 0.5, hi=1.0),
        context_len=t.int("context_len", 0, lo=0),
        expert_shards=t.int("expert_shards", 0, lo=0),  # ESP, 001 §VI-B5 (0 = off)
        network=t.str("network", "eq1", choices=NETWORKS),  # 001 Eq. 1 or cut-through
        eq1_ports=t.str("eq1_ports", "link", choices=eq1.PORTS),
        bidirectional_rings=t.bool("bidirectional_rings", True),  # 001 §IV-B2
    )
    mbs = t._get("micro_batches", [1, 2, 4, 8], False)
    if not (isinstance(mbs, list) and mbs and all(isinstance(x, int) and not isinstance(x, bool)
                                                   and x >= 1 for x in mbs)):
        raise ConfigError(f"{t.where}: key 'micro_batches' must be a non-empty list of "
                          f"integers >= 1, got {mbs!r}")
    opts["micro_batches"] = tuple(mbs)
    pk = dict(alpha=t.float("alpha", 0.0, positive=False),
              beta=t.float("beta", 0.0, positive=False))
    placement = t._get("placement", "contiguous", False)
    t.close()
    if isinstance(placement, str):
        if placement != "contiguous":
            raise ConfigError(f"{t.where}: key 'placement' = {placement!r}; allowed: "
                              "contiguous, or a list of one device id per expert")
    elif not (isinstance(placement, list) and placement
              and all(isinstance(x, int) and not isinstance(x, bool) for x in placement)):
        raise ConfigError(f"{t.where}: key 'placement' must be 'contiguous' or a list of "
                          f"device ids, got {placement!r}")
    pk["placement"] = placement
    if not opts["invasive"] and pk["beta"] != 0.0:
        raise ConfigError(f"{t.where}: key 'beta' = {pk['beta']} must be 0 when invasive = false "
                          "(001 Eq. 2: beta = 0 for non-invasive)")
    return opts, pk


def check_options(t) -> None:
    """Validate a policy's [options] for the wafer system (names, types, ranges)."""
    _read_options(t)


def from_policy(platform: Platform, model: ModelSpec, t, num_iterations: int):
    """(System, params) for the wafer system from a policy's options Table."""
    opts, pk = _read_options(t)
    placement = pk.pop("placement")
    cfg = make_config(platform, model, **opts)
    params = default_params(cfg, **pk)
    if not isinstance(placement, str):
        e, d = model.num_experts, cfg.num_devices
        if len(placement) != e or not all(0 <= x < d for x in placement):
            raise ConfigError(f"{t.where}: key 'placement' needs {e} device ids in [0, {d}), "
                              f"got {len(placement)} ids")
        params = params.replace(placement=jax.nn.one_hot(np.asarray(placement), d))
    return build(cfg, num_iterations), params
