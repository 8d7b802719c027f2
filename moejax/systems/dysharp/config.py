"""Static configuration and tunable parameters of the DySHARP study (paper 004).

One MoE layer (dispatch, GEMM-1, GEMM-2, combine) on an NVLink switch fabric. A system is a
(primitive, schedule) pair (docs/reproduction/dysharp.md, spec §2):

primitive (how dispatch and combine move bytes per GPU port):
  unicast_pair  one copy per (token, remote expert): FasterMoE, Tutel, CCFuser, COMET (spec §7.4)
  unicast_rank  one copy per (token, remote GPU), the GPU pre-sums its experts: DeepEP
  nvls          NVLS workaround, all-gather dispatch + reduce-scatter combine (004 §II-C)
  dymultimem    dynamic multimem multicast + in-switch reduction (004 §III)
  explicit      the same bytes with one address per target in every packet (004 §III-A)
schedule (how the four phases overlap):
  serial        dispatch, GEMM-1, GEMM-2, combine one after another (DeepEP, NVLS, Basic)
  coarse        n-chunk pipeline of comm against GEMMs (FasterMoE, Tutel adaptive n)
  fine          two fused kernels, dispatch+GEMM-1 then GEMM-2+combine (CCFuser, COMET)
  fused         token-centric tile pipeline of all four phases (004 §IV)
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
from moejax.physics.comm import KERNELS

PRIMITIVES = ("unicast_pair", "unicast_rank", "nvls", "dymultimem", "explicit")
SCHEDULES = ("serial", "coarse", "fine", "fused")
# schedules whose comm kernels run on SMs beside the GEMMs (they pay `comm_sms`, COMM_SMS)
OVERLAPPED = ("coarse", "fine", "fused")
COMBINES = ("per_gpu", "per_expert")  # spec §7.5 variant A (default) / variant B (literal)
PHASES = ("forward", "training")
# how a primitive's bytes meet the link rate: "measured" (default) = the platform's measured
# bulk rate for unicast (`TopologySpec.protocol_efficiency`, the rate every system prices
# unicast traffic at), other primitives scaled by their packet payload efficiency relative to
# unicast's; "packet" = 004's own packet model alone (unicast at 256 / 320 = 80% of link_Bps,
# 004 §III-A), the reading the 004 reproduction sets.
LINK_MODELS = ("measured", "packet")
IN_SWITCH = ("nvls", "dymultimem", "explicit")  # need switch multicast / reduction
# primitives a point-to-point all-to-all kernel can move (`comm_kernel`): GPU-to-GPU unicast
UNICAST = ("unicast_pair", "unicast_rank")

# 004 §IV-B: "tsize = 128", the GEMM tile height (checked by Fig. 30).
TILE_TOKENS = 128
# DeepSeek-V3 technical report §3.2.2: 20 of the H800's 132 SMs run the all-to-all kernels.
# Spec §7.8: 004 gives no SM split. One rule for every system: a schedule whose communication
# runs as SM kernels while GEMMs run (coarse: NCCL all-to-all on its own stream, whose
# channels are CUDA blocks on SMs, NCCL user guide `NCCL_MIN_NCHANNELS`; fine, fused;
# DualPipe's end-to-end block) leaves those SMs to the comm kernels; a
# serial schedule runs comm and GEMMs one after the other, each on every SM.
COMM_SMS = 20
# 004 §III-B Fig. 7: target-extension flits hold eight 16-bit expert ids each.
TARGETS_PER_FLIT = 8
# Explicit addressing (004 §III-A): one 64-bit destination address per target (spec §7.6).
EXPLICIT_ADDRESS_BYTES = 8
# Hopper tensor cores: warpgroup MMA (wgmma.mma_async) has a fixed M = 64 (PTX ISA 8.x,
# "wgmma.mma_async ... .m64nNk16"): a GEMM tile of fewer token rows computes 64 rows.
WGMMA_M = 64
# DeepEP normal-mode dispatch starts with `notify_dispatch` (deepseek-ai/DeepEP
# csrc/kernels/intranode.cu): every rank writes its per-rank and per-expert token counts
# (int32) into each peer's buffer between two device barriers; 004 §VI-A2 credits DySHARP
# with avoiding this "metadata transmission, e.g., token arrival counts".
NOTIFY_BARRIERS = 2
COUNT_BYTES = 4


@dataclasses.dataclass(frozen=True, eq=False)
class DyConfig:
    """Static configuration of one (primitive, schedule) system (hashable by identity).

    tokens_per_gpu: tokens each GPU owns per layer (0: the trace's own token count); the
      trace's N tokens are a sample whose port loads and expert counts are scaled by
      `tokens_per_gpu * G / N` (exact in the flow model, spec §6).
    chunks: chunk counts the coarse pipeline may use (the best one is taken: Tutel's adaptive
      pipelining degree); one value = a fixed count (FasterMoE).
    comm_sms: SMs that run communication while GEMMs run (overlapped schedules: coarse, fine,
      fused; and DualPipe's end-to-end block, `share_beside_comm`); with
      fewer than COMM_SMS the ports drain at comm_sms / COMM_SMS of the link rate
      (`comm_rate`), more leave fewer SMs to the GEMMs (`gemm_share`).
    notify: a metadata exchange (token counts, two barriers) before each forward dispatch
      (DeepEP's notify_dispatch; software all-to-alls exchange split sizes the same way).
    adaptive_comm_sms: candidate comm SM counts; each pass takes the fastest (COMET's
      adaptive workload assignment, Zhang et al. MLSys'25 §3.3: the comm / compute thread
      block split is chosen per input shape); empty: the fixed `comm_sms`.
    comm_kernel: the all-to-all kernel of `physics.comm.KERNELS` that times a unicast
      primitive's dispatch and combine phases: "nccl" (default) = the per-port link model of
      `schedule.phase_times_s`; "deepep_normal" / "deepep_low_latency" = DeepEP's kernels
      (`physics.internode`) on the phase's [G, G] traffic matrix. Unicast primitives and
      phase-level schedules (serial, coarse, fine) only.
    """

    platform: Platform
    model: ModelSpec
    primitive: str = "dymultimem"
    schedule: str = "fused"
    combine: str = "per_gpu"
    phase: str = "forward"
    chunks: tuple[int, ...] = (1,)
    comm_sms: int = COMM_SMS
    tile_tokens: int = TILE_TOKENS
    tokens_per_gpu: int = 0
    gemm_dtype: str = "fp8"  # 004 §V-A FP8 GEMM kernels
    comm_bytes_per_element: float = 2.0  # spec §7.2: BF16 dispatch and combine
    nvls_self_copy: bool = False  # spec §7.11
    notify: bool = False
    adaptive_comm_sms: tuple[int, ...] = ()
    name: str = "dysharp"
    link_model: str = "measured"
    comm_kernel: str = "nccl"

    @property
    def num_devices(self) -> int:
        return self.platform.num_devices

    @property
    def token_bytes(self) -> float:
        """Bytes of one token vector on the wire (dispatch and combine alike)."""
        return self.model.hidden_size * self.comm_bytes_per_element

    @property
    def latency_s(self) -> float:
        """One-way GPU-switch-GPU latency (004 §V-A: 2 x 250 ns)."""
        return self.platform.topology.hop_latency_s

    @property
    def gemm_share(self) -> float:
        """Fraction of the SMs left to GEMMs under this layer's schedule (1 when serial)."""
        return 1.0 if self.schedule == "serial" else self.share_beside_comm

    @property
    def share_beside_comm(self) -> float:
        """Fraction of the SMs left to compute while `comm_sms` SMs run comm kernels beside
        it (any overlapped schedule, and DualPipe's end-to-end block whatever the layer's)."""
        sms = max(self.platform.device.sm_count, 1)
        return 1.0 - min(self.comm_sms, sms - 1) / sms

    @property
    def overlapped(self) -> bool:
        """Comm kernels share the SMs with GEMMs (coarse, fine and fused schedules)."""
        return self.schedule in OVERLAPPED


def gemm_share_of(cfg: DyConfig, comm_sms):
    """`DyConfig.gemm_share` at a traced (possibly fractional) comm SM count."""
    if cfg.schedule == "serial":
        return jnp.float32(1.0)
    sms = max(cfg.platform.device.sm_count, 1)
    return 1.0 - jnp.clip(comm_sms, 0.0, sms - 1) / sms


def comm_rate_of(cfg: DyConfig, comm_sms):
    """Fraction of the port bandwidth the comm kernels reach: min(1, comm_sms / COMM_SMS)
    when they share the SMs with GEMMs (DeepSeek-V3 §3.2.2: COMM_SMS SMs suffice to saturate
    the links; fewer issue proportionally less), 1 for serial schedules (comm kernels run
    alone, on the SMs they need)."""
    if not cfg.overlapped:
        return jnp.float32(1.0)
    return jnp.minimum(jnp.maximum(comm_sms, 1e-3) / COMM_SMS, 1.0)


@struct.dataclass
class DyParams:
    """Tunable parameters: placement [E, G] (or [L, E, G]) share matrix, tau (0 = exact).

    comm_sms, tile_tokens, chunks: traced overrides of the config's knobs (None: the
    config's value; `moejax tune --system dysharp` sets them, fractional while relaxed).
    `chunks` replaces the coarse schedule's list by one pipeline degree.
    """

    placement: jax.Array
    tau: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))
    comm_sms: jax.Array | None = None
    tile_tokens: jax.Array | None = None
    chunks: jax.Array | None = None


def contiguous_placement(num_experts: int, num_devices: int) -> np.ndarray:
    """Expert e on GPU e * G // E (004 §III-D2: OutPort = Target / experts_per_GPU)."""
    return np.eye(num_devices, dtype=np.float32)[np.arange(num_experts) * num_devices
                                                  // num_experts]


def make_config(platform: Platform, model: ModelSpec, **kw) -> DyConfig:
    """Validated DyConfig; unknown or out-of-range values raise ConfigError naming the field."""
    cfg = DyConfig(platform, model, **kw)
    checks = [("primitive", cfg.primitive, PRIMITIVES), ("schedule", cfg.schedule, SCHEDULES),
              ("combine", cfg.combine, COMBINES), ("phase", cfg.phase, PHASES),
              ("link_model", cfg.link_model, LINK_MODELS),
              ("comm_kernel", cfg.comm_kernel, tuple(KERNELS))]
    for field, value, allowed in checks:
        if value not in allowed:
            raise ConfigError(f"{field} = {value!r}; allowed: {', '.join(allowed)}")
    if cfg.comm_kernel != "nccl" and cfg.primitive not in UNICAST:
        raise ConfigError(f"comm_kernel = {cfg.comm_kernel!r} needs a unicast primitive; "
                          f"primitive = {cfg.primitive!r}; allowed with it: comm_kernel = nccl")
    if cfg.comm_kernel != "nccl" and cfg.schedule == "fused":
        raise ConfigError(f"comm_kernel = {cfg.comm_kernel!r} times whole dispatch / combine "
                          "phases; schedule = 'fused' paces them per tile; allowed with it: "
                          "comm_kernel = nccl")
    if platform.topology.kind != "switch":
        raise ConfigError(f"hardware {platform.name}: topology kind = "
                          f"{platform.topology.kind!r}; allowed: switch (NVLink switch fabric)")
    if cfg.primitive in IN_SWITCH and not platform.topology.in_switch_compute:
        raise ConfigError(f"primitive = {cfg.primitive!r} needs in-switch compute, which "
                          f"hardware {platform.name} lacks (topology.in_switch_compute = false)")
    if any(int(c) != c or not 1 <= c < platform.device.sm_count
           for c in cfg.adaptive_comm_sms):
        raise ConfigError(f"adaptive_comm_sms = {list(cfg.adaptive_comm_sms)}; allowed: ints "
                          f"in 1 .. {platform.device.sm_count - 1}")
    if not cfg.chunks or any(int(c) != c or c < 1 for c in cfg.chunks):
        raise ConfigError(f"chunks = {list(cfg.chunks)}; allowed: a non-empty list of ints >= 1")
    if cfg.tile_tokens < 1:
        raise ConfigError(f"tile_tokens = {cfg.tile_tokens}; allowed: an int >= 1")
    if cfg.tokens_per_gpu < 0:
        raise ConfigError(f"tokens_per_gpu = {cfg.tokens_per_gpu}; allowed: an int >= 0")
    if not 0 <= cfg.comm_sms < max(platform.device.sm_count, 1):
        raise ConfigError(f"comm_sms = {cfg.comm_sms}; allowed: 0 .. "
                          f"{max(platform.device.sm_count, 1) - 1}")
    if cfg.gemm_dtype not in dict(platform.device.peak_flops):
        raise ConfigError(f"gemm_dtype = {cfg.gemm_dtype!r}; allowed: "
                          f"{', '.join(dict(platform.device.peak_flops))}")
    return cfg


def default_params(cfg: DyConfig) -> DyParams:
    """Contiguous placement, hard mode."""
    return DyParams(placement=jnp.asarray(contiguous_placement(cfg.model.num_experts,
                                                               cfg.num_devices)))
