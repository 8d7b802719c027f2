"""FSE-DP configuration (static), parameters (tunable) and the ablation switches of 000 §VI-C.

Paper 000 (FSE-DP, "Expert Streaming"). The package is a `chiplet-*` platform: D dies, each
with a PE array (`peak_flops`), an on-chip expert-weight buffer, one DDR channel
(`memory_Bps`, Table I "4 x 25.6 GB/s" = one per die) and UCIe D2D links in a 2D mesh
(`link_Bps`, `hop_latency_s`). Expert trajectories are logical rings over the mesh (§VI-A),
here the snake (boustrophedon) order of the dies.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.physics import topology
from moejax.physics.roofline import sustained_flops

# Per-micro-slice control overhead (000 §IV: "finer micro-slices ... increase relative
# control/scheduling overhead and per-transfer header cost"; §VI-D Fig. 17). The paper gives
# no number; its scheduler decides in "sub-microsecond" time (§V-B). We charge 0.5 us of the
# chiplet's compute pipeline per micro-slice visit (one dispatch decision + D2D handshake),
# chosen once, before any result, and never tuned to a claim.
DEFAULT_CTRL_OVERHEAD_S = 0.5e-6

# Ablation configurations of 000 §VI-C (Fig. 15).
ABLATIONS = {
    "A1": dict(naive=True, paired_load=False, rule5=False, token_buffering=False),
    "A2": dict(naive=False, paired_load=False, rule5=False, token_buffering=False),
    "A3": dict(naive=False, paired_load=True, rule5=False, token_buffering=False),
    "A4": dict(naive=False, paired_load=True, rule5=True, token_buffering=False),
    "A5": dict(naive=False, paired_load=True, rule5=False, token_buffering=True),
}

# Micro-slices a running expert keeps in one chiplet's buffer under eager usage (§IV,
# Fig. 4b): the one being computed and forwarded (Rule 1) and the one being received.
SLOTS_PER_RUNNING_EXPERT = 2

DDR_LOADING = ("any", "trajectory")
D2D_ACCOUNTING = ("link", "sender", "die")
SHARED = ("stream", "omit")


@dataclasses.dataclass(frozen=True, eq=False)
class FSEDPConfig:
    """Static configuration of FSE-DP on a chiplet package (hashable by identity).

    naive: A1, §III (token redistribution + whole-slice circulation, no micro-slice flow).
    paired_load: §IV-A paired-load order (hottest, coldest, 2nd hottest, ...) of Algorithm 1;
      each expert still starts on its own (Algorithm 1 lines 5-10, `layer.unit_order`).
    rule5: §IV-C Rule 5 (DDR sends micro-slices to the trajectory chiplet with most space).
    token_buffering: Algorithm 2 (§V-A) with `slack` (fraction of forward passes a request
      may be deferred), `theta_min` (tokens below which an expert is cold) and
      `num_requests` requests per iteration.
    weight_buffer_bytes: per-chiplet expert-weight storage (Fig. 17 axis).
    ctrl_overhead_s: compute-pipeline time charged per micro-slice visit (see above).
    """

    platform: Platform
    model: ModelSpec
    topo: topology.Topology
    naive: bool = False
    paired_load: bool = False
    rule5: bool = False
    token_buffering: bool = False
    slack: float = 0.2
    theta_min: float = 2.0
    num_requests: int = 4
    weight_buffer_bytes: float = 0.0
    ctrl_overhead_s: float = DEFAULT_CTRL_OVERHEAD_S
    dtype: str = "bf16"
    # DDR loading (000 Rule 4, Algorithm 1 line 12 "Pre-load e to any idle buffer", §IV-C
    # "regardless of storage location, weights can be swept into the dataflow", Fig. 6):
    # "any" = every die with a free buffer loads a share of a streaming expert from its own
    # channel and forwards it over D2D to the nearest trajectory die; "trajectory" = only
    # the dies of T_e load (the narrower reading).
    ddr_loading: str = "any"
    # D2D accounting: "link" = the ring flows (and forwards) load every directed mesh link
    # on their XY route once (`topology.link_loads`; 000 §V-C routers, Table I per-hop
    # latency); "sender" = bytes x hops charged to the sending die's one D2D resource;
    # "die" = the link loads, but all links leaving a die share one budget of link_Bps
    # (Table I "Multiple UCIE D2D IPs: 288 GB/s" read per die, as §VI-D Eq. (1) sizes the
    # UCIe modules per chiplet: ceil(BW_D2D / BW_UCIe) x A_UCIe).
    d2d: str = "link"
    # Per-transfer overhead (000 §IV "per-transfer header cost"): seconds each micro-slice
    # load (DDR) and each micro-slice forward (D2D link) costs on top of bytes / bandwidth
    # (`layer.with_transfer_overhead`). 0 = none (the compute-side `ctrl_overhead_s` only).
    xfer_overhead_s: float = 0.0
    # Shared experts (DeepSeek-MoE's 2): "stream" = streamed like any expert, as units of one
    # routed expert's size that every token visits (000 §IV: FSE-DP streams every expert;
    # the paper names no special path for shared ones); "omit" = left out of the MoE layer
    # (the earlier reading).
    shared: str = "stream"
    # Algorithm 2: a deferred request's slot runs a fresh pass in the next iteration too
    # (`buffering` module docstring); False = its new tokens wait (the earlier reading).
    refill: bool = True

    @property
    def shared_units(self) -> int:
        """Streamed shared units per layer (0 if omitted or the model has none)."""
        return shared_units(self.model) if self.shared == "stream" else 0

    @property
    def num_devices(self) -> int:
        return self.topo.num_devices

    @property
    def ring_order(self) -> np.ndarray:
        """int [D]: position of each die on the logical ring (snake order over the mesh)."""
        return ring_position(self.topo)

    @property
    def peak_flops(self) -> float:
        """FLOP/s the experts' GEMMs sustain (`physics.roofline.sustained_flops`: the peak
        on an ideal device, the measured GEMM efficiency where the platform states one)."""
        return sustained_flops(self.platform.device, self.dtype)

    @property
    def ddr_Bps(self) -> float:
        return self.platform.device.memory_Bps

    @property
    def link_Bps(self) -> float:
        """Bytes/s of the slowest D2D link under bulk transfer (`Topology.sustained_Bps`:
        link_Bps x the link type's protocol efficiency, 1 on an ideal platform)."""
        return float(np.min(self.topo.sustained_Bps)) if self.topo.num_links else 1.0

    @property
    def hop_latency_s(self) -> float:
        return self.platform.topology.hop_latency_s

    @property
    def n_threshold(self) -> int:
        """Algorithm 2 N_threshold: forward passes per granted deferral (1 / slack)."""
        return max(1, int(round(1.0 / self.slack)))


def shared_units(model: ModelSpec) -> int:
    """Shared experts as units of one routed expert's weights (DeepSeek-MoE: 2 of 1408)."""
    if model.num_shared_experts == 0:
        return 0
    units = model.shared_weight_bytes / model.expert_weight_bytes
    if abs(units - round(units)) > 1e-9 or round(units) < 1:
        raise ConfigError(
            f"shared = 'stream': {model.name}'s shared experts ({model.shared_weight_bytes:.4g} "
            f"B) are not a whole number of routed experts ({model.expert_weight_bytes:.4g} B); "
            "allowed: shared = 'omit'")
    return int(round(units))


def ring_position(topo: topology.Topology) -> np.ndarray:
    """Snake order of a rows x cols mesh (a Hamiltonian path; a cycle when rows is even)."""
    d = topo.num_devices
    if topo.rows and topo.cols:
        order = []
        for r in range(topo.rows):
            cs = range(topo.cols) if r % 2 == 0 else range(topo.cols - 1, -1, -1)
            order += [r * topo.cols + c for c in cs]
    else:
        order = list(range(d))
    pos = np.empty(d, np.int32)
    pos[np.asarray(order)] = np.arange(d)
    return pos


def make_config(platform: Platform, model: ModelSpec, *, ablation: str | None = None,
                naive: bool = False, paired_load: bool = False, rule5: bool = False,
                token_buffering: bool = False, slack: float = 0.2, theta_min: float = 2.0,
                num_requests: int = 4, weight_buffer_bytes: float = 0.0,
                ctrl_overhead_s: float = DEFAULT_CTRL_OVERHEAD_S,
                dtype: str = "bf16", ddr_loading: str = "any",
                d2d: str = "link", xfer_overhead_s: float = 0.0,
                shared: str = "stream", refill: bool = True) -> FSEDPConfig:
    """Validated FSEDPConfig; `ablation` ("A1".."A5") sets the four switches of §VI-C."""
    if platform.family != "chiplet":
        raise ConfigError(f"fsedp: platform {platform.name} is a {platform.family} platform; "
                          "allowed: chiplet platforms (chiplet-2x2, chiplet-3x3, chiplet-4x4)")
    if ablation is not None:
        if ablation not in ABLATIONS:
            raise ConfigError(f"ablation = {ablation!r}; allowed: {', '.join(ABLATIONS)}")
        sw = ABLATIONS[ablation]
        naive, paired_load, rule5, token_buffering = (
            sw["naive"], sw["paired_load"], sw["rule5"], sw["token_buffering"])
    if not 0.0 < slack <= 1.0:
        raise ConfigError(f"slack = {slack!r}; allowed: a fraction in (0, 1]")
    if theta_min < 0:
        raise ConfigError(f"theta_min = {theta_min!r}; allowed: >= 0 tokens")
    if num_requests < 1:
        raise ConfigError(f"num_requests = {num_requests!r}; allowed: an integer >= 1")
    if weight_buffer_bytes < 0:
        raise ConfigError(f"weight_buffer_bytes = {weight_buffer_bytes!r}; allowed: >= 0 "
                          "(0 = the platform's onchip_buffer_bytes)")
    if ctrl_overhead_s < 0:
        raise ConfigError(f"ctrl_overhead_s = {ctrl_overhead_s!r}; allowed: >= 0 seconds")
    if xfer_overhead_s < 0:
        raise ConfigError(f"xfer_overhead_s = {xfer_overhead_s!r}; allowed: >= 0 seconds")
    if ddr_loading not in DDR_LOADING:
        raise ConfigError(f"ddr_loading = {ddr_loading!r}; allowed: {', '.join(DDR_LOADING)}")
    if shared not in SHARED:
        raise ConfigError(f"shared = {shared!r}; allowed: {', '.join(SHARED)}")
    if shared == "stream":
        shared_units(model)  # raises when the shared experts do not cut into expert units
    if d2d not in D2D_ACCOUNTING:
        raise ConfigError(f"d2d = {d2d!r}; allowed: {', '.join(D2D_ACCOUNTING)}")
    buf = weight_buffer_bytes or platform.device.onchip_buffer_bytes
    return FSEDPConfig(platform, model, topology.build(platform), naive, paired_load, rule5,
                       token_buffering, float(slack), float(theta_min), int(num_requests),
                       float(buf), float(ctrl_overhead_s), dtype, ddr_loading, d2d,
                       float(xfer_overhead_s), shared, bool(refill))


def min_microslices(cfg: FSEDPConfig) -> int:
    """Smallest micro-slice count whose slots fit the buffer (2 experts x 2 slots, §IV-B)."""
    need = 2 * SLOTS_PER_RUNNING_EXPERT
    return max(1, math.ceil(need * cfg.model.expert_weight_bytes / cfg.weight_buffer_bytes))


@struct.dataclass
class FSEDPParams:
    """Tunable parameters of FSE-DP.

    num_microslices: micro-slices per expert (§IV-C single-level notation), float scalar;
      read through `relax.round`.
    tau: relaxation temperature (0 = exact).
    theta_min, slack: Algorithm 2 knobs as traced scalars (moejax.tune), read by
      `buffering.plan_iteration`; None = the static config's values.
    ddr_Bps, link_Bps, weight_buffer_bytes: per-die DDR bandwidth, D2D link bandwidth and
      expert-weight buffer as traced scalars, so a design-space sweep (§VI-D, Fig. 16) is one
      vmapped call over params; None = the platform / config values.
    """

    num_microslices: jax.Array = struct.field(default_factory=lambda: jnp.float32(8.0))
    tau: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))
    theta_min: jax.Array | None = None
    slack: jax.Array | None = None
    ddr_Bps: jax.Array | None = None
    link_Bps: jax.Array | None = None
    weight_buffer_bytes: jax.Array | None = None


def default_params(cfg: FSEDPConfig, num_microslices: float = 8.0) -> FSEDPParams:
    """Params with `num_microslices` raised to the buffer minimum (`min_microslices`)."""
    check_microslices(cfg, num_microslices, raise_low=False)
    m = max(float(num_microslices), float(min_microslices(cfg)))
    return FSEDPParams(num_microslices=jnp.float32(m))


def check_microslices(cfg: FSEDPConfig, m: float, raise_low: bool = True) -> None:
    """ConfigError unless 1 <= m and (raise_low) the slots fit the weight buffer."""
    if not m >= 1:
        raise ConfigError(f"num_microslices = {m!r}; allowed: >= 1")
    lo = min_microslices(cfg)
    if raise_low and m < lo:
        raise ConfigError(
            f"num_microslices = {m!r} is too coarse for weight_buffer_bytes = "
            f"{cfg.weight_buffer_bytes:.3g}: a micro-slice of {cfg.model.name} must fit "
            f"{2 * SLOTS_PER_RUNNING_EXPERT} times; allowed: >= {lo}")
