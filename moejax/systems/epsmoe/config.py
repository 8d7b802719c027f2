"""Static configuration and parameters of EPS-MoE (paper 003) and its TP+TP / DP+EP / TP+EP
baselines: one MoE prefill forward on an NVLink node.

Names follow the spec's ambiguity A5: `top_k` (routing), `overhead_per_chunk_s` (the slope of
R(N) = overhead * (N - 1), §5.2 (5)); `pn` is the pipeline degree N (§4.3, "PN").
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError
from moejax.physics import topology
from moejax.physics.gemm import GemmProfile
from moejax.systems.epsmoe.assignment import check_assignment

MODES = ("tp-tp", "dp-ep", "tp-ep")  # 003 §4.2: attention mode + MoE mode
KERNELS = ("group", "dense", "threshold", "adaptive")  # 003 §3.2, §4.4 load-aware switch

# Constants 003 does not give (each cited in policies/epsmoe.toml; never fitted to a claim).
DEFAULT_ALPHA_S = 15e-6  # per collective call: nccl-tests small-message all2all / all-reduce
#   latency on one NVSwitch node is ~10-20 us (NVIDIA nccl-tests, DGX H100)
DEFAULT_C_SAT = 16  # comm-kernel SMs at saturation: 003 Fig. 7b "10-20 SMs" (A100 all2all)
DEFAULT_PHI_MIN = 0.5  # share of its saturated rate an all2all keeps when the GEMM holds every
#   SM (003 §5.2 (3) "cannot be scheduled"): assumption, no public measurement; sensitivity
#   in docs/reproduction/epsmoe.md
DEFAULT_SWITCH_ROWS = 2048.0  # 003 §3.2 Conclusion 1: GroupGemm better below m = 2048 rows
# Grouped-kernel readings: its per-SM share of the dense (wgmma) rate, `GemmProfile.mma_group`.
# "wgmma" (default): 003 Fig. 5 footnote 1 names its GroupGemm CUTLASS Pingpong, a wgmma kernel;
#   the one measured wgmma grouped / dense ratio on H800 is DeepGEMM's grouped contiguous 1288 vs
#   dense 1304 TFLOP/s = 0.995 (hardware/h800x8.toml `grouped_gemm_derate`, DeepGEMM README).
# "warp-mma": NVIDIA's cuBLAS grouped-GEMM APIs "only leverage warp-level MMA instructions",
#   about 2/3 of the wgmma rate (the reading before; not the kernel 003 names).
GROUPED_KERNELS = {"wgmma": 0.995, "warp-mma": 2.0 / 3.0}
# Dense-kernel tile schedules (`physics.gemm.TILE_SCHEDULES`). Default "stream_k": a dense
# library spreads the k loop of an under-filled grid over the idle SMs (cuBLASLt's heuristic
# picks split-K per shape, CUBLASLT_ALGO_CONFIG_SPLITK_NUM; CUTLASS 3 ships an SM90 stream-K
# tile scheduler, Osama et al., PPoPP 2023); "data_parallel": one tile per SM per wave.
DENSE_SCHEDULES = ("stream_k", "split_k", "data_parallel")


@dataclasses.dataclass(frozen=True, eq=False)
class EPSConfig:
    """Static configuration (hashable by identity)."""

    platform: Platform
    model: ModelSpec
    topo: topology.Topology
    mode: str = "tp-ep"
    pn: int = 1  # pipeline degree N; divides the local expert count (A3)
    overlap: bool = True  # chunk c+1 comm overlaps chunk c GEMM (False: Fig. 11 "serial")
    gemm: str = "group"  # group | dense | threshold | adaptive
    sm_gemm: int = 0  # SMs the GEMM kernels may use (0: all, "not controlled")
    sm_comm: int = DEFAULT_C_SAT  # SMs of the comm kernel
    fp8_comm: bool = False  # all2all payload in FP8 (Table 5 "FP8")
    alpha_s: float = DEFAULT_ALPHA_S
    c_sat: int = DEFAULT_C_SAT
    phi_min: float = DEFAULT_PHI_MIN
    overhead_per_chunk_s: float = -1.0  # R(N) slope; < 0: two launches (permute, unpermute)
    profile: GemmProfile = GemmProfile()
    seq_len: int = 2048  # tokens per sequence (causal attention context = seq_len / 2)
    tokens_per_forward: int = 0  # real tokens one trace stands for (0: its own tokens)
    # False (default): each token reaches a device once, with the earliest chunk that needs
    # it: 003 §5.2 (4) prices a chunk's all2all as S(m / N), the volume split, not amplified,
    # and Table 7's eps0 falls to 0.02-0.07 at m = 2000-2200. True: E11 read literally, chunk
    # c dispatches every token it needs again, even if an earlier chunk already sent it to
    # that device (the "re-send" reading, docs/reproduction/epsmoe.md)
    resend: bool = False
    grouped_kernel: str = "wgmma"  # GROUPED_KERNELS key (sets `profile.mma_group`)
    dense_schedule: str = "stream_k"  # DENSE_SCHEDULES: the dense kernel's tile schedule
    # knobs a tuning system reads relaxed at params.tau > 0 (`relaxed.RELAXABLE`; () = hard)
    relaxed: tuple[str, ...] = ()
    # chunk of each local expert per device, D tuples of E_loc ints in [0, pn) (beyond 003:
    # `assignment.py`); () = the paper's equal contiguous groups (local expert j in chunk
    # j // (E_loc / N), the code path of the shipped numbers)
    chunk_assignment: tuple[tuple[int, ...], ...] = ()

    @property
    def num_devices(self) -> int:
        return self.topo.num_devices

    @property
    def local_experts(self) -> int:
        return self.model.num_experts // self.num_devices

    @property
    def sm_total(self) -> int:
        return self.platform.device.sm_count

    @property
    def gemm_sms(self) -> int:
        return self.sm_total if self.sm_gemm <= 0 else self.sm_gemm

    @property
    def chunk_overhead_s(self) -> float:
        if self.overhead_per_chunk_s >= 0:
            return self.overhead_per_chunk_s
        return 2.0 * self.profile.launch_s

    @property
    def dense_profile(self) -> GemmProfile:
        """The profile the dense kernel runs under (its own tile schedule)."""
        return dataclasses.replace(self.profile, tile_schedule=self.dense_schedule)

    @property
    def comm_token_bytes(self) -> float:
        """Bytes of one token's hidden state on the all2all wire (FP8: 1 byte per element)."""
        return self.model.hidden_size * (1.0 if self.fp8_comm else self.model.act_bytes)


def _f(x):
    return struct.field(default_factory=lambda: jnp.float32(x))


@struct.dataclass
class EPSParams:
    """Traced values (float32 scalars; sweepable with one compile per (mode, platform, model)).

    pn: pipeline degree N (a divisor of the local experts); kernel: 0 group, 1 dense,
    2 threshold, 3 adaptive (`KERNELS` order); switch_rows: threshold in rows per expert;
    sm_gemm (0: all SMs), sm_comm; fp8_comm, overlap: 0 / 1; tokens_per_forward (0: the
    trace's own) and seq_len: the workload; tau: the relaxation temperature (0: hard mode;
    read only by a system built with `relaxed` knobs, `system.build`); pn_index: the
    position of pn among the divisors of the local expert count, fractional while tuning
    (read instead of pn by a system built with "pn" relaxed, `relaxed.block`); assign: the
    soft chunk assignment of a system built with "assignment" relaxed (`assignment.py`).
    """

    pn: jax.Array = _f(1.0)
    kernel: jax.Array = _f(0.0)
    switch_rows: jax.Array = _f(DEFAULT_SWITCH_ROWS)
    sm_gemm: jax.Array = _f(0.0)
    sm_comm: jax.Array = _f(DEFAULT_C_SAT)
    fp8_comm: jax.Array = _f(0.0)
    overlap: jax.Array = _f(1.0)
    tokens_per_forward: jax.Array = _f(0.0)
    seq_len: jax.Array = _f(2048.0)
    tau: jax.Array = _f(0.0)
    pn_index: jax.Array = _f(0.0)
    # soft chunk assignment [D, E_loc, E_loc slots] (rows sum to 1; `assignment.py`), read
    # only by a system built with "assignment" relaxed; a scalar placeholder otherwise
    assign: jax.Array = _f(0.0)

    # `moejax sweep` (moejax/sweep.py): fields only the tuning system reads, not design values
    TUNING_ONLY = ("pn_index", "assign")

    @staticmethod
    def check_sweep(options: dict, keys) -> None:
        """A policy's `chunk_assignment` holds chunk ids for its own pn: sweeping pn over it
        would count GEMMs of chunks that get no all2all (ids >= the swept pn)."""
        if "pn" in keys and options.get("chunk_assignment"):
            raise ConfigError("--vary pn: the policy fixes chunk_assignment (chunk ids for its "
                              "own pn); sweep pn with a policy without chunk_assignment")


def default_params(cfg: EPSConfig, **changes) -> EPSParams:
    """EPSParams holding the config's values (and `changes`, validated like the config)."""
    f = jnp.float32
    vals = dict(pn=cfg.pn, kernel=KERNELS.index(cfg.gemm), switch_rows=DEFAULT_SWITCH_ROWS,
                sm_gemm=cfg.sm_gemm, sm_comm=cfg.sm_comm, fp8_comm=float(cfg.fp8_comm),
                overlap=float(cfg.overlap), tokens_per_forward=cfg.tokens_per_forward,
                seq_len=cfg.seq_len)
    if "gemm" in changes:
        g = changes.pop("gemm")
        if g not in KERNELS:
            raise ConfigError(f"gemm = {g!r}; allowed: {', '.join(KERNELS)}")
        vals["kernel"] = KERNELS.index(g)
    vals.update(changes)
    check = dataclasses.replace(cfg, pn=int(vals["pn"]), sm_gemm=int(vals["sm_gemm"]),
                                sm_comm=int(vals["sm_comm"]))
    make_config(cfg.platform, cfg.model, **{k: getattr(check, k) for k in (
        "mode", "pn", "sm_gemm", "sm_comm")})
    vals.setdefault("pn_index", divisors(cfg.local_experts).index(int(vals["pn"])))
    return EPSParams(**{k: f(v) for k, v in vals.items()})


def config_of(cfg: EPSConfig, params: EPSParams) -> EPSConfig:
    """The config whose static values are these (unbatched) params (for the reference)."""
    return dataclasses.replace(
        cfg, pn=int(params.pn), gemm=KERNELS[int(params.kernel)], sm_gemm=int(params.sm_gemm),
        sm_comm=int(params.sm_comm), fp8_comm=bool(params.fp8_comm),
        overlap=bool(params.overlap), tokens_per_forward=int(params.tokens_per_forward),
        seq_len=int(params.seq_len))


def profile_for(device, grouped_kernel: str = "wgmma") -> GemmProfile:
    """GEMM rates of the platform's measured kernels (`GemmProfile.of`: 003's defaults on a
    platform in its paper reading), the grouped kernel at its reading's share: a platform
    that states its own measured grouped derate keeps it under "wgmma"."""
    prof = GemmProfile.of(device)
    if grouped_kernel == "wgmma" and device.grouped_gemm_derate != 1.0:
        return prof
    return dataclasses.replace(prof, mma_group=GROUPED_KERNELS[grouped_kernel])


def divisors(n: int) -> tuple[int, ...]:
    return tuple(i for i in range(1, n + 1) if n % i == 0)


def make_config(platform: Platform, model: ModelSpec, **kw) -> EPSConfig:
    """Validated EPSConfig (one clear ConfigError per bad field)."""
    mode = kw.get("mode", "tp-ep")
    if mode not in MODES:
        raise ConfigError(f"mode = {mode!r}; allowed: {', '.join(MODES)}")
    gemm = kw.get("gemm", "group")
    if gemm not in KERNELS:
        raise ConfigError(f"gemm = {gemm!r}; allowed: {', '.join(KERNELS)}")
    d = platform.num_devices
    if platform.device.sm_count <= 0:
        raise ConfigError(f"platform {platform.name}: sm_count must be > 0 (GPU platforms)")
    if model.num_experts % d:
        raise ConfigError(f"model {model.name}: {model.num_experts} experts do not split over "
                          f"{d} devices of {platform.name}")
    e_loc = model.num_experts // d
    pn = int(kw.get("pn", 1))
    if mode == "tp-tp" and pn != 1:
        raise ConfigError(f"pn = {pn}; allowed for mode tp-tp: 1 (no expert pipeline)")
    if pn not in divisors(e_loc):
        raise ConfigError(f"pn = {pn}; allowed: divisors of the {e_loc} local experts: "
                          f"{', '.join(map(str, divisors(e_loc)))}")
    sm_gemm = int(kw.get("sm_gemm", 0))
    if not 0 <= sm_gemm <= platform.device.sm_count:
        raise ConfigError(f"sm_gemm = {sm_gemm}; allowed: 0 (all) .. "
                          f"{platform.device.sm_count}")
    sm_comm = int(kw.get("sm_comm", DEFAULT_C_SAT))
    if sm_comm < 1:
        raise ConfigError(f"sm_comm = {sm_comm}; allowed: >= 1")
    if kw.get("chunk_assignment"):
        if mode == "tp-tp":
            raise ConfigError("chunk_assignment: allowed only for modes dp-ep, tp-ep "
                              "(tp-tp has no expert pipeline)")
        kw["chunk_assignment"] = check_assignment(kw["chunk_assignment"], d, e_loc, pn)
    grouped = kw.get("grouped_kernel", "wgmma")
    if grouped not in GROUPED_KERNELS:
        raise ConfigError(f"grouped_kernel = {grouped!r}; allowed: {', '.join(GROUPED_KERNELS)}")
    sched = kw.get("dense_schedule", "stream_k")
    if sched not in DENSE_SCHEDULES:
        raise ConfigError(f"dense_schedule = {sched!r}; allowed: {', '.join(DENSE_SCHEDULES)}")
    kw.setdefault("profile", profile_for(platform.device, grouped))
    return EPSConfig(platform, model, topology.build(platform), **kw)
