"""moejax's prediction for each kind of published measurement: the one adapter between the
validation table and the physics layer (re-point a kind here and every row of it follows).

Each predictor takes the row's platform and `params` and returns the value in the row's unit
(us, GB/s or TFLOP/s), computed the way the measurement's own benchmark computes it (the
`busbw` of nccl-tests, the logical bandwidth of DeepEP's tests, 2 m n k / t of DeepGEMM's).
Routing in the DeepEP rows is the benchmarks' own: uniform random scores, top-k experts among
the top-`min(nodes, 4)` node groups (normal kernels) or among all experts (low-latency), taken
in expectation, so every traffic matrix is the mean one (closed form, no sampling).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from moejax.catalog.hardware import Platform
from moejax.errors import ConfigError
from moejax.physics import collectives, comm, gemm, internode, topology

US, GBPS, TFLOPS = 1e-6, 1e9, 1e12


def _call(fn, *arrays, **static) -> float:
    """`fn(*arrays, **static)` compiled as one program: a handful of XLA compiles for the
    whole table instead of one per primitive and shape in eager mode."""
    return float(jax.jit(functools.partial(fn, **static))(*arrays))


def nccl_alltoall_time(p: Platform, size_bytes: float) -> float:
    """nccl-tests alltoall_perf time (us) for `size_bytes` per rank (a 1/n share to each rank,
    its own share local), through the all-to-all every system prices with (`physics.comm`,
    kernel "nccl")."""
    n = p.num_devices
    traffic = jnp.full((n, n), size_bytes / n, jnp.float32)
    return _call(comm.alltoall_time_s, traffic, fabric=p) / US


def nccl_alltoall_busbw(p: Platform, size_bytes: float) -> float:
    """nccl-tests alltoall busbw (GB/s) = size (n - 1) / n / time."""
    n = p.num_devices
    return size_bytes * (n - 1) / n / (nccl_alltoall_time(p, size_bytes) * US) / GBPS


def nccl_allreduce_busbw(p: Platform, size_bytes: float) -> float:
    """nccl-tests all_reduce_perf busbw (GB/s) = 2 (n - 1) / n size / time, ring all-reduce."""
    n = p.num_devices
    groups = np.arange(n)[None, :]
    t = _call(collectives.all_reduce_time_s, jnp.float32(size_bytes), groups=groups,
              topo=topology.build(p))
    return 2 * (n - 1) / n * size_bytes / t / GBPS


def _hit(pool: int, owned: int, topk: int) -> float:
    """P(a set of `owned` experts out of `pool` gets at least one of `topk` uniform draws
    without replacement)."""
    if pool - owned < topk:
        return 1.0
    return 1.0 - math.comb(pool - owned, topk) / math.comb(pool, topk)


@dataclasses.dataclass(frozen=True)
class DeepEPRouting:
    """Expected routing of DeepEP's benchmark: per-token probabilities, closed form."""

    nodes: int
    per_node: int
    gpu_hit: float  # P(a given GPU receives a token), any node
    node_hit: float  # P(a given node receives a token)

    @property
    def nodes_per_token(self) -> float:
        return self.nodes * self.node_hit


def deepep_routing(ep: int, experts: int, topk: int, per_node: int = 8,
                   group_limited: bool = True) -> DeepEPRouting:
    """DeepEP tests/test_internode.py: groups = nodes, top-`min(nodes, 4)` groups chosen by
    their best score, then top-k experts inside them; low-latency: top-k of all experts.
    A GPU's hit probability takes the k experts as uniform draws from the chosen groups (the
    expected experts per chosen node, k / groups, is exact; `tests/test_validation.py`
    checks both probabilities against the benchmark's sampling)."""
    nodes = max(ep // per_node, 1)
    per_gpu = experts // ep
    per_group = experts // nodes
    groups = min(nodes, 4) if group_limited else nodes
    pool = groups * per_group
    chosen = groups / nodes
    # when groups are really selected (fewer than the nodes), a group is chosen for its best
    # score, so that expert is (all but surely) among the token's top-k when k >= the groups
    # chosen: every chosen node receives the token
    selected = groups < nodes and topk >= groups
    node_hit = chosen if selected else chosen * _hit(pool, per_group, topk)
    return DeepEPRouting(
        nodes=nodes, per_node=min(ep, per_node),
        gpu_hit=chosen * _hit(pool, per_gpu, topk), node_hit=node_hit,
    )


def _token_bytes(phase: str, hidden: int) -> float:
    """Bytes DeepEP's tests count per token: FP8 dispatch (hidden + a 4 B scale per 128),
    BF16 combine."""
    if phase == "dispatch":
        return hidden * (1 + 4 / 128)
    if phase == "combine":
        return hidden * 2.0
    raise ConfigError(f"params.phase = {phase!r}; allowed: dispatch, combine")


def deepep_normal(p: Platform, phase: str, tokens: int, hidden: int, experts: int, topk: int,
                  ep: int, profile: internode.DeepEPProfile = internode.DEFAULT_PROFILE) -> float:
    """DeepEP normal kernel's logical bandwidth (GB/s) as its test prints it: NVLink bytes
    received (incl. the local share) / time on one node, (token, node) pairs incl. the local
    node x bytes / time across nodes."""
    r = deepep_routing(ep, experts, topk)
    b = _token_bytes(phase, hidden)
    n = p.num_devices
    traffic = jnp.full((n, n), tokens * r.gpu_hit * b, jnp.float32)
    nodes = internode.node_shape(p)[0]
    rdma = jnp.full((n, nodes), tokens * r.node_hit * b, jnp.float32)
    t = _call(lambda tr, rd: internode.deepep_normal_time_s(
        tr, None, p, rdma_node_bytes=rd, profile=profile),
              traffic, rdma)
    logical = tokens * (r.nodes_per_token if nodes > 1 else n * r.gpu_hit) * b
    return logical / t / GBPS


def _ll_message_bytes(phase: str, hidden: int) -> float:
    """DeepEP low-latency message: FP8 token + scales + a 16 B header, or a BF16 token."""
    if phase == "dispatch":
        return hidden + hidden / 128 * 4 + 16
    return _token_bytes(phase, hidden)


def deepep_low_latency(p: Platform, phase: str, tokens: int, hidden: int, experts: int,
                       topk: int, ep: int,
                       profile: internode.DeepEPProfile = internode.DEFAULT_PROFILE) -> float:
    """DeepEP low-latency dispatch / combine time (us): one message per (token, expert),
    spread evenly over the EP ranks."""
    n = p.num_devices
    msgs = jnp.full((n, n), tokens * topk / n, jnp.float32)
    traffic = msgs * _ll_message_bytes(phase, hidden)
    return _call(lambda tr, ms: internode.deepep_low_latency_time_s(
        tr, ms, p, profile=profile), traffic, msgs) / US


def _profile(kernel: str, device) -> gemm.GemmProfile:
    """GEMM kernel constants by library: DeepGEMM's and Triton's grouped kernels are wgmma
    kernels at the device's measured GEMM efficiency (`GemmProfile.of`: `gemm_efficiency`,
    `grouped_gemm_derate` of the hardware TOML), not the warp-level-MMA grouped kernels of the
    default (cuBLAS, 003's reading) profile."""
    if kernel in ("deepgemm", "triton"):
        return gemm.GemmProfile.of(device)
    if kernel == "cublas":
        return gemm.GemmProfile()
    raise ConfigError(f"params.kernel = {kernel!r}; allowed: cublas, deepgemm, triton")


def _gemm_kw(p: Platform, dtype: str, kernel: str) -> dict:
    size = {"fp8": 1.0, "int8": 1.0, "bf16": 2.0, "fp16": 2.0}
    if dtype not in size:
        raise ConfigError(f"params.dtype = {dtype!r}; allowed: {', '.join(size)}")
    d = p.device
    return dict(sms=d.sm_count, sm_total=d.sm_count, peak_flops=d.flops(dtype),
                memory_Bps=d.memory_Bps, weight_bytes=size[dtype], act_bytes=size[dtype],
                profile=_profile(kernel, d))


def gemm_grouped(p: Platform, groups: int, m: int, n: int, k: int, dtype: str,
                 kernel: str) -> float:
    """TFLOP/s of one grouped GEMM launch over `groups` experts of `m` rows each."""
    rows = jnp.full((groups,), m, jnp.float32)
    t = _call(gemm.group_time_s, rows, k_dim=k, n_out=n, **_gemm_kw(p, dtype, kernel))
    return 2.0 * groups * m * n * k / t / TFLOPS


def gemm_dense(p: Platform, m: int, n: int, k: int, dtype: str, kernel: str) -> float:
    """TFLOP/s of one dense GEMM [m, k] x [k, n]."""
    t = _call(gemm.dense_expert_time_s, jnp.float32(m), k_dim=k, n_out=n,
              **_gemm_kw(p, dtype, kernel))
    return 2.0 * m * n * k / t / TFLOPS


def expert_rows(tokens: int, experts: int, topk: int) -> np.ndarray:
    """Rows per expert [E] when `tokens` x `topk` assignments spread as evenly as they can
    (each token's k experts distinct)."""
    pairs = tokens * topk
    active = min(experts, pairs)
    rows = np.zeros(experts, np.float32)
    rows[:active] = pairs // active
    rows[: pairs % active] += 1
    return rows


def moe_layer(p: Platform, tokens: int, experts: int, topk: int, hidden: int, inter: int,
              dtype: str) -> float:
    """One GPU's fused MoE layer (us): a grouped up-projection (gate and up, 2 x `inter`
    columns) and a grouped down-projection over the experts' rows."""
    rows = jnp.asarray(expert_rows(tokens, experts, topk))
    kw = _gemm_kw(p, dtype, "triton")
    up = _call(gemm.group_time_s, rows, k_dim=hidden, n_out=2 * inter, **kw)
    down = _call(gemm.group_time_s, rows, k_dim=inter, n_out=hidden, **kw)
    return (up + down) / US


PREDICTORS = {
    "nccl_alltoall_time": nccl_alltoall_time,
    "nccl_alltoall_busbw": nccl_alltoall_busbw,
    "nccl_allreduce_busbw": nccl_allreduce_busbw,
    "deepep_normal": deepep_normal,
    "deepep_low_latency": deepep_low_latency,
    "gemm_grouped": gemm_grouped,
    "gemm_dense": gemm_dense,
    "moe_layer": moe_layer,
}
UNITS = {
    "nccl_alltoall_time": "us", "nccl_alltoall_busbw": "GB/s", "nccl_allreduce_busbw": "GB/s",
    "deepep_normal": "GB/s", "deepep_low_latency": "us", "gemm_grouped": "TFLOP/s",
    "gemm_dense": "TFLOP/s", "moe_layer": "us",
}


def predict(kind: str, platform: Platform, params: dict) -> float:
    """moejax's value for one measurement row, in the row's unit."""
    return float(PREDICTORS[kind](platform, **params))
