"""Grouped vs dense GEMM on a GPU: tile waves over the SMs, per-kernel efficiency, launches.

Model (003 §3.2 Fig. 5, spec check 9): a GEMM [m, k] x [k, n] is cut into output tiles of
`tile_m x tile_n`; tiles run in waves of `sms` (one tile per SM at a time), so a kernel of T
tiles takes ceil(T / sms) waves, each as long as one tile at the kernel's efficiency. A
**dense** kernel (cuBLAS, one launch per expert) quantizes per expert; a **grouped** kernel
(one launch for all experts of a group) packs every expert's tiles into shared waves, so its
last wave is fuller, but its per-tile efficiency is lower. The kernel also has to read its
weights and activations once (memory floor), and each launch costs `launch_s`.

    t_kernel = launch_s + max(waves * t_tile, bytes / memory_Bps)
    t_tile   = 2 * tile_m * tile_n * k / r(sms)
    r(sms)   = peak / sm_total * mma_share * min(1, clock_share * sm_total / sms)

Per-SM rate r: `mma_share` is the kernel's share of the tensor-core peak per SM at full
clock (1 for wgmma kernels, 2/3 for warp-level MMA); `clock_share` is the clock the whole
chip sustains under a full tensor-core load, relative to the boost clock the peak assumes
(power cap). With fewer busy SMs the clock rises until the per-SM rate reaches its cap, so
a GEMM keeps its speed on fewer SMs "within a range" (003 §3.2 Conclusion 3, Fig. 5c), here
down to clock_share * sm_total SMs (99 of 132).

Every function is elementwise over `rows` arrays (any shape) and jit / vmap safe; the hard
`ceil` has no smooth form here (tuning of the SM split goes through the zeroth-order tuner).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class GemmProfile:
    """Kernel constants of a GPU. Defaults: H800 / H100 SXM (cited in `policies/epsmoe.toml`).

    tile_m, tile_n: CTA output tile; 128 x 128 is the common Hopper bf16 tile of cuBLAS and
      CUTLASS (spec check 9, an assumption: the paper names no tile).
    clock_share: public cuBLAS bf16 measurements on H100 SXM reach about 740 of 989 TFLOP/s
      on large GEMMs (0.75), the chip's power-capped clock under full tensor load.
    mma_group: the grouped kernel's per-SM share of the wgmma peak; NVIDIA's cuBLAS
      grouped-GEMM blog states the grouped kernels "only leverage warp-level MMA
      instructions" (not Hopper's wgmma), which reach about two thirds of the wgmma rate.
    launch_s: one kernel launch as seen on a busy stream (CUDA launch overhead ~4 us).
    dense_tile_m: tile heights the dense library picks from per shape (cuBLAS's heuristic
      selects a kernel per problem; Hopper wgmma works on 64-row warpgroup tiles, and cuBLAS
      ships 64 x N and 128 x N tile kernels); same per-SM rate assumed. The grouped kernel
      has one compiled tile (tile_m).
    tile_schedule: how output tiles meet the SMs when there are few of them (small m):
      "data_parallel" (one tile per SM per wave, `waves`), "split_k" (each tile's k loop cut
      into `k_splits` parts, so k_splits times the work items of 1 / k_splits the length), or
      "stream_k" (the k-loop iterations of every tile, `tile_k` deep, dealt evenly over the
      SMs: Osama et al., "Stream-K: Work-centric Parallel Decomposition for Dense Matrix-
      Matrix Multiplication on the GPU", PPoPP 2023). The partial-sum fix-up of split-K and
      stream-K is not charged (one extra pass over the output tile, small beside the k loop).
    """

    tile_m: int = 128
    tile_n: int = 128
    clock_share: float = 0.75
    mma_group: float = 2.0 / 3.0
    launch_s: float = 4e-6
    dense_tile_m: tuple[int, ...] = (64, 128)
    tile_schedule: str = "data_parallel"
    k_splits: int = 2
    tile_k: int = 64

    @classmethod
    def of(cls, device, **kw) -> GemmProfile:
        """The profile of a device: its measured `gemm_efficiency` and `grouped_gemm_derate`
        (`DeviceSpec`) as clock_share and mma_group when the device states them (not both
        1); the H800 / H100 defaults above otherwise (003's kernels, the EPS-MoE reading)."""
        if device.gemm_efficiency == 1.0 and device.grouped_gemm_derate == 1.0:
            return cls(**kw)
        return cls(**{"clock_share": device.gemm_efficiency,
                      "mma_group": device.grouped_gemm_derate, **kw})

    @property
    def eff_dense(self) -> float:
        """Share of peak of the dense kernel on every SM."""
        return self.clock_share

    @property
    def eff_group(self) -> float:
        """Share of peak of the grouped kernel on every SM."""
        return self.clock_share * self.mma_group


def tiles(rows, n_out: int, profile: GemmProfile):
    """Output tiles of one GEMM with `rows` rows and `n_out` columns (0 rows -> 0 tiles)."""
    return jnp.ceil(jnp.asarray(rows, jnp.float32) / profile.tile_m) * math.ceil(
        n_out / profile.tile_n)


def waves(num_tiles, sms):
    """Waves of `num_tiles` tiles over `sms` SMs: ceil(T / S)."""
    return jnp.ceil(jnp.asarray(num_tiles, jnp.float32) / sms)


TILE_SCHEDULES = ("data_parallel", "split_k", "stream_k")


def schedule_waves(num_tiles, sms, k_dim: int, profile: GemmProfile):
    """Waves (in units of one whole tile's time) of `num_tiles` tiles of depth `k_dim` on
    `sms` SMs under the profile's tile schedule; "data_parallel" is exactly `waves`."""
    if profile.tile_schedule == "data_parallel":
        return waves(num_tiles, sms)
    if profile.tile_schedule == "split_k":
        s = profile.k_splits
        return _ceil_div(jnp.asarray(num_tiles, jnp.float32) * s, sms) / s
    if profile.tile_schedule == "stream_k":
        it = max(math.ceil(k_dim / profile.tile_k), 1)
        return _ceil_div(jnp.asarray(num_tiles, jnp.float32) * it, sms) / it
    raise ValueError(f"tile_schedule = {profile.tile_schedule!r}; allowed: "
                     f"{', '.join(TILE_SCHEDULES)}")


def _ceil_div(items, sms):
    """ceil(items / sms) for whole counts, exact whatever way the compiler divides (a
    reciprocal multiply can put an exact quotient n a rounding above n, and ceil then jumps
    a whole step; the k-loop items of split-K / stream-K are often exact multiples)."""
    q = jnp.round(items / sms)
    return q + (items - q * sms > 0)


def fill_fraction(num_tiles, sms):
    """Share of SM-slots busy over the waves: T / (waves * S) (1 = no idle tail)."""
    w = waves(num_tiles, sms)
    return jnp.where(w > 0, num_tiles / jnp.maximum(w * sms, 1.0), 1.0)


def tile_time_s(k_dim: int, peak_flops: float, sm_total: int, mma_share: float,
                profile: GemmProfile, sms=None):
    """Seconds one of `sms` busy SMs (default all) spends on one output tile of depth k."""
    sms = sm_total if sms is None else sms
    per_sm = peak_flops / sm_total * mma_share * jnp.minimum(
        1.0, profile.clock_share * sm_total / sms)
    return 2.0 * profile.tile_m * profile.tile_n * k_dim / per_sm


def gemm_bytes(rows, k_dim: int, n_out: int, weight_bytes: float, act_bytes: float):
    """Bytes one expert's GEMM moves: weights (if it has rows), input and output rows."""
    rows = jnp.asarray(rows, jnp.float32)
    used = (rows > 0).astype(jnp.float32)
    return used * k_dim * n_out * weight_bytes + rows * (k_dim + n_out) * act_bytes


def dense_expert_time_s(rows, k_dim: int, n_out: int, *, sms, sm_total: int,
                        peak_flops: float, memory_Bps: float, weight_bytes: float,
                        act_bytes: float, profile: GemmProfile):
    """One dense launch per expert with rows > 0, elementwise over `rows`; the faster of the
    library's tile heights (`profile.dense_tile_m`)."""
    rows = jnp.asarray(rows, jnp.float32)
    mem = gemm_bytes(rows, k_dim, n_out, weight_bytes, act_bytes) / memory_Bps
    t_full = tile_time_s(k_dim, peak_flops, sm_total, 1.0, profile, sms)
    best = None
    for tm in profile.dense_tile_m:
        n_tiles = jnp.ceil(rows / tm) * math.ceil(n_out / profile.tile_n)
        t = jnp.maximum(schedule_waves(n_tiles, sms, k_dim, profile) * t_full
                        * (tm / profile.tile_m), mem)
        best = t if best is None else jnp.minimum(best, t)
    return (rows > 0).astype(jnp.float32) * (profile.launch_s + best)


def dense_time_s(rows, k_dim: int, n_out: int, **kw):
    """One dense launch per expert (axis -1 = experts), summed over experts."""
    return dense_expert_time_s(rows, k_dim, n_out, **kw).sum(-1)


def group_time_s(rows, k_dim: int, n_out: int, *, sms, sm_total: int, peak_flops: float,
                 memory_Bps: float, weight_bytes: float, act_bytes: float,
                 profile: GemmProfile):
    """One grouped launch over the experts on axis -1 (none if every expert has 0 rows)."""
    rows = jnp.asarray(rows, jnp.float32)
    t_tile = tile_time_s(k_dim, peak_flops, sm_total, profile.mma_group, profile, sms)
    comp = schedule_waves(tiles(rows, n_out, profile).sum(-1), sms, k_dim, profile) * t_tile
    mem = gemm_bytes(rows, k_dim, n_out, weight_bytes, act_bytes).sum(-1) / memory_Bps
    any_rows = (rows.sum(-1) > 0).astype(jnp.float32)
    return any_rows * (profile.launch_s + jnp.maximum(comp, mem))


def kernel_time_s(num_tiles, nbytes, launches, t_tile, sms, memory_Bps, launch_s):
    """Generic kernel(s): `launches` launches, ceil(tiles / sms) waves of `t_tile`, at least
    `nbytes` / memory_Bps (elementwise; arrays broadcast)."""
    comp = waves(num_tiles, sms) * t_tile
    return launches * launch_s + jnp.maximum(comp, nbytes / memory_Bps) * (launches > 0)
