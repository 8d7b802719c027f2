"""Static configuration and tunable parameters of the wafer-scale EP system (001 MoEntwine).

`WaferConfig` (static, hashable by identity) holds the platform, model, topology, the TP /
FTD mapping (001 §IV) and the token source split built once by `make_config`; ESP slices
every expert over an EP group (001 §VI-B5). `WaferParams` holds what tuning may change:
the native placement, the initial shadow slots (001 §III-C) and the Eq. 2 trigger (001 §V-B).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.physics import eq1, topology
from moejax.systems.wafer import balancer as bal
from moejax.systems.wafer import mapping as mp


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
    # default: the physical cut-through link loads (within 1.07-1.14x of a cycle-level
    # wormhole-router simulation of the same traffic, where Eq. 1 reads 2.1-2.4x slower;
    # docs/physics.md); 001's own Eq. 1 is network="eq1", which the 001 reproduction sets
    network: str = "link_load"
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

def make_config(platform: Platform, model: ModelSpec, *, mapping: str = "baseline",
                tp_size: int = 4, retain_allgather: bool = True,
                micro_batches: tuple[int, ...] = (1, 2, 4, 8), balancer: str = "none",
                invasive: bool = True, shadow_slots: int = 0, history_decay: float = 0.8,
                cold_fraction: float = 0.5, context_len: int = 0,
                migration_free: bool = False, expert_shards: int = 0,
                network: str = "link_load", eq1_ports: str = "link",
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
        native = g[np.arange(e) * g.shape[0] // e, 0]
    else:
        native = np.arange(e) * d // e
    # host NumPy put on the device: building params compiles nothing (`jnp.asarray` of a
    # host array and `jnp.float32` each compile a small XLA program per shape)
    return jax.device_put(WaferParams(one_hot_np(native, d), np.zeros((e, d), np.float32),
                                      np.float32(alpha), np.float32(beta)))


def one_hot_np(ids, num: int) -> np.ndarray:
    """float32 [len(ids), num] one-hot rows of device ids (`jax.nn.one_hot` on the host)."""
    return np.eye(num, dtype=np.float32)[np.asarray(ids)]


def time_scale_s(cfg: WaferConfig) -> float:
    """Seconds of one expert's weight load: the unit of the relaxation temperature `tau`."""
    return cfg.model.expert_weight_bytes / cfg.platform.device.memory_Bps
