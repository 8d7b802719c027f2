"""DeepEP's communication kernels between nodes: normal (NVLink forwarding + RDMA) and
low-latency (pure RDMA, one message per token and expert), timed from a traffic matrix.

Both functions share the communication-kernel signature
`fn(traffic_bytes [..., D, D], messages [..., D, D] or None, platform, sms=None) -> seconds`
(`traffic_bytes[s, d]`: bytes GPU s sends to GPU d; `messages[s, d]`: messages s sends to d),
so a system can pick them by name. A platform is nodes of `devices_per_node` GPUs on an
NVSwitch (`link_Bps` per direction per GPU) joined by one RDMA NIC per GPU (`inter_Bps` per
direction, rail-optimized: GPU i of every node sits on rail i); a `switch` platform is one node.

Normal kernels (DeepEP README "Normal kernels with NVLink and RDMA forwarding"; DeepSeek-V3
§3.2.2): a token bound for GPU d in another node crosses the network once per node, to the GPU
of d's node on the sender's rail, which forwards it over NVLink to d (and to every other GPU of
that node the token visits). Time = fixed + max(NVLink port time, NIC time): the two legs are
pipelined in chunks, so the slower one sets the pace.

Low-latency kernels (DeepEP README "Low-latency kernels with pure RDMA"): every (token, expert)
pair is its own message, sent straight to the destination GPU: over NVLink inside a node, over
the NIC between nodes, no forwarding, no deduplication. Time = fixed + max(NVLink, NIC) +
one pass of the received bytes through HBM (the receiver packs them for the expert GEMM).

Every function is jit / vmap safe over leading axes; node structure is static (host NumPy).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from moejax.catalog.hardware import Platform


@dataclasses.dataclass(frozen=True)
class DeepEPProfile:
    """Efficiency and latency constants of DeepEP's kernels on Hopper + ConnectX-7 NDR.

    nvl_efficiency: share of the NVLink line rate (`link_Bps`) a DeepEP kernel moves: the
      intranode normal kernels on 8 x H800 reach 153 / 158 GB/s of logical bandwidth
      (DeepEP README), 0.69 of the 200 GB/s line once the local share is removed; fit by
      `moejax.validation.fit` to those calibration rows of `validation/measurements.toml`.
    rdma_efficiency: share of the NIC line rate (`inter_Bps`) reached by RDMA writes of
      token-sized messages; fit with `ll_fixed_s` to DeepEP's low-latency EP16 and EP256
      rows (calibration rows; `tests/test_validation.py` refits and compares). NVIDIA quotes
      48-49 GB/s (0.97) for large NCCL messages on CX-7 NDR (NVIDIA/nccl-tests#267); DeepEP's
      7-14 KB messages with per-message signalling reach less.
    ll_fixed_s: the low-latency kernel's fixed time: launch, the count exchange (one network
      round trip) and the wait for the slowest sender; same fit.
    normal_fixed_s: the normal kernel's fixed time: the layout notify (a barrier over NVLink
      and RDMA) before data moves; an assumption (two 4 us launches + 2 network round trips),
      negligible against its millisecond transfers.
    """

    nvl_efficiency: float = 0.69
    rdma_efficiency: float = 0.87
    ll_fixed_s: float = 22e-6
    normal_fixed_s: float = 16e-6


DEFAULT_PROFILE = DeepEPProfile()


def node_shape(platform: Platform) -> tuple[int, int]:
    """(nodes, devices per node) of a platform; a `switch` platform is one node."""
    top = platform.topology
    if top.kind == "hierarchical":
        return top.nodes, top.devices_per_node
    return 1, platform.num_devices


def _layout(platform: Platform):
    nodes, per = node_shape(platform)
    d = nodes * per
    node = np.arange(d) // per
    local = np.arange(d) % per
    same = (node[:, None] == node[None, :]).astype(np.float32)
    rail = (local[:, None] == local[None, :]).astype(np.float32)
    onehot = (node[:, None] == np.arange(nodes)[None, :]).astype(np.float32)  # [D, N]
    return same, rail, onehot


def _nic_Bps(platform: Platform, profile: DeepEPProfile) -> float:
    return max(platform.topology.inter_Bps, 1.0) * profile.rdma_efficiency


def _nvl_Bps(platform: Platform, profile: DeepEPProfile) -> float:
    return platform.topology.link_Bps * profile.nvl_efficiency


def forwarded_nvlink_bytes(traffic_bytes, platform: Platform):
    """NVLink traffic [..., D, D] of the normal kernels: intranode pairs directly, internode
    bytes from the rail GPU of the destination node to the destination (none when the rail GPU
    is the destination itself)."""
    same, rail, _ = _layout(platform)
    d = same.shape[0]
    off = 1.0 - np.eye(d, dtype=np.float32)
    intra = traffic_bytes * (same * off)
    inter = traffic_bytes * (1.0 - same)
    fwd = jnp.einsum("sf,...sd->...fd", rail, inter) * (same * off)
    return intra + fwd


def node_bytes(traffic_bytes, platform: Platform):
    """Bytes [..., D, N] each GPU sends to each other node, without deduplication (each
    (token, GPU) pair counted once: exact when a token visits one GPU per remote node)."""
    same, _, onehot = _layout(platform)
    return jnp.einsum("...sd,dn->...sn", traffic_bytes * (1.0 - same), onehot)


def _port_time_s(traffic, bandwidth_Bps):
    """Busiest GPU port (send or receive) of a [..., D, D] traffic at `bandwidth_Bps`."""
    busiest = jnp.maximum(traffic.sum(-1).max(-1), traffic.sum(-2).max(-1))
    return busiest / bandwidth_Bps


def _nic_time_s(rdma_node_bytes, platform: Platform, profile: DeepEPProfile):
    """Busiest NIC (send or receive) for bytes [..., D, N] from each GPU to each node, received
    by the GPU of that node on the sender's rail."""
    same, rail, onehot = _layout(platform)
    rdma_node_bytes = rdma_node_bytes * (1.0 - onehot)  # nothing crosses the NIC to its own node
    send = rdma_node_bytes.sum(-1)
    recv = jnp.einsum("sf,...sn,fn->...f", rail, rdma_node_bytes, onehot)
    return jnp.maximum(send.max(-1), recv.max(-1)) / _nic_Bps(platform, profile)


def _crosses_nodes(traffic_bytes, platform: Platform):
    same, _, _ = _layout(platform)
    return ((traffic_bytes * (1.0 - same)).sum((-2, -1)) > 0).astype(jnp.float32)


def deepep_normal_time_s(traffic_bytes, messages, platform: Platform, sms=None, *,
                         rdma_node_bytes=None, profile: DeepEPProfile = DEFAULT_PROFILE):
    """Seconds of one DeepEP normal dispatch or combine moving `traffic_bytes` [..., D, D].

    rdma_node_bytes: optional [..., D, N] bytes each GPU sends to each node after the per-node
      deduplication (a token crosses the network once per node however many GPUs of it it
      visits); default `node_bytes(traffic_bytes)`, the bound without deduplication.
    `messages` and `sms` are accepted for the shared signature: the normal kernels move
    chunks, not per-token messages, and run on the SMs DeepEP assigns them (24 on H800).
    """
    del messages, sms
    traffic_bytes = jnp.asarray(traffic_bytes, jnp.float32)
    if rdma_node_bytes is None:
        rdma_node_bytes = node_bytes(traffic_bytes, platform)
    nvl = _port_time_s(forwarded_nvlink_bytes(traffic_bytes, platform),
                       _nvl_Bps(platform, profile))
    nic = _nic_time_s(jnp.asarray(rdma_node_bytes, jnp.float32), platform, profile)
    top = platform.topology
    lat = jnp.where(_crosses_nodes(traffic_bytes, platform) > 0,
                    top.inter_latency_s + top.hop_latency_s, top.hop_latency_s)
    return profile.normal_fixed_s + lat + jnp.maximum(nvl, nic)


def deepep_low_latency_time_s(traffic_bytes, messages, platform: Platform, sms=None, *,
                              profile: DeepEPProfile = DEFAULT_PROFILE):
    """Seconds of one DeepEP low-latency dispatch or combine: `traffic_bytes` [..., D, D] are
    the (token, expert) messages' bytes, each sent directly (NVLink inside a node, the NIC
    between nodes). `messages` and `sms` are accepted for the shared signature (the kernel's
    fixed time already holds its per-message signalling at DeepEP's batch sizes)."""
    del messages, sms
    traffic_bytes = jnp.asarray(traffic_bytes, jnp.float32)
    same, _, _ = _layout(platform)
    d = same.shape[0]
    off = 1.0 - np.eye(d, dtype=np.float32)
    nvl = _port_time_s(traffic_bytes * (same * off), _nvl_Bps(platform, profile))
    inter = traffic_bytes * (1.0 - same)
    nic = _port_time_s(inter, _nic_Bps(platform, profile))
    received = traffic_bytes.sum(-2).max(-1)
    pack = 2.0 * received / platform.device.memory_Bps  # read + write of what arrived
    return profile.ll_fixed_s + jnp.maximum(nvl, nic) + pack
