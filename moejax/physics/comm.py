"""The one MoE all-to-all (dispatch / combine) every system prices its traffic with.

A communication kernel moving `traffic` [..., D, D] bytes (s -> d; the diagonal is local and
free) on a platform takes

    t = kernel_latency + max(link term, SM term) + path latency + message term

- link term: the busiest directed link's load over the rate it sustains under bulk traffic,
  max_l load_l / (link_Bps_l x protocol efficiency of its link type)
  (`collectives.phase_time_s`, `Topology.sustained_Bps`);
- SM term (only when the kernel runs on `sms` SMs and the device states `sm_comm_Bps`): a
  kernel given S SMs reaches at most S x sm_comm_Bps per device and direction, so
  max_s(bytes out of s, bytes into s) / (S x sm_comm_Bps);
- message term: each sender issues its messages one after another at
  `message_latency_s` apiece, max_s sum_d messages[s, d] x message_latency_s
  (`messages` None: one message per destination with traffic);
- kernel latency: `kernel_latency_s` once per kernel (launch and the completion barrier).

On an ideal platform (efficiency 1, no fixed latencies, no SM limit) this is exactly
`collectives.all_to_all_time_s`, the cut-through link-load model. The constants come from
the platform's TOML, each citing its measurement (docs/physics.md).

`KERNELS` maps a kernel name to fn(traffic, messages, fabric, sms=None, tau=0.0) -> seconds
[...]; `fabric` is a Platform or a Topology. Systems select one by name (the `comm_kernel`
policy option of EP and of DySHARP's baselines); kernels with their own protocol (DeepEP's
normal and low-latency modes) register here beside "nccl".
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from moejax import relax
from moejax.catalog.hardware import Platform
from moejax.errors import ConfigError
from moejax.physics import collectives, internode, topology


@functools.lru_cache(maxsize=64)
def _topology_of(platform: Platform) -> topology.Topology:
    return topology.build(platform)


def topology_of(fabric) -> topology.Topology:
    """The Topology of a Platform (built once per platform) or a Topology itself."""
    return fabric if isinstance(fabric, topology.Topology) else _topology_of(fabric)


def message_time_s(traffic, messages, topo: topology.Topology):
    """Seconds the busiest sender spends issuing its messages [...] (0 when the platform
    has no per-message cost)."""
    if not topo.message_latency_s:
        return 0.0
    d = traffic.shape[-1]
    off = 1.0 - jnp.eye(d, dtype=jnp.float32)
    n = (traffic * off > 0).astype(jnp.float32) if messages is None else messages * off
    return jnp.max(n.sum(-1), axis=-1) * topo.message_latency_s


def sm_time_s(traffic, sms, topo: topology.Topology, tau=0.0):
    """Seconds [...] a kernel on `sms` SMs per device needs to inject and drain `traffic`
    at `Topology.sm_comm_Bps` per SM (0 when not SM-limited)."""
    if sms is None or not topo.sm_comm_Bps:
        return None
    d = traffic.shape[-1]
    off = traffic * (1.0 - jnp.eye(d, dtype=traffic.dtype))
    per_dev = jnp.maximum(off.sum(-1), off.sum(-2))
    return relax.max(per_dev, tau, axis=-1) / (jnp.asarray(sms, jnp.float32) * topo.sm_comm_Bps)


def nccl_alltoall_s(traffic, messages, fabric, sms=None, tau=0.0):
    """NCCL-style all-to-all: the link-load phase at the links' sustained rates, bounded by
    the SMs it runs on, plus per-message and per-kernel fixed costs (seconds [...])."""
    topo = topology_of(fabric)
    busy = collectives.link_busy_s(traffic, topo, tau)
    sm = sm_time_s(traffic, sms, topo, tau)
    if sm is not None:
        busy = relax.maximum(busy, sm, tau)
    t = busy + collectives.path_latency_s(traffic, topo)
    return t + message_time_s(traffic, messages, topo) + topo.kernel_latency_s


def _on_platform(name: str, time_s):
    """A `KERNELS` entry for a kernel timed from the whole platform (its nodes and NICs:
    `physics.internode`); hard max only (tau is not used). `needs_platform` tells
    `alltoall_time_s` to hand it the platform rather than a Topology."""
    def fn(traffic, messages, fabric, sms=None, tau=0.0):
        if not isinstance(fabric, Platform):
            raise ConfigError(f"comm_kernel = {name!r} needs the platform (its nodes and "
                              "NICs), not a bare Topology")
        return time_s(traffic, messages, fabric, sms)

    fn.needs_platform = True
    fn.__doc__ = f"`{name}`: `internode.{time_s.__name__}` on the platform."
    return fn


KERNELS = {
    "nccl": nccl_alltoall_s,
    # DeepEP's normal kernels: NVLink forwarding + RDMA between nodes
    "deepep_normal": _on_platform("deepep_normal", internode.deepep_normal_time_s),
    # DeepEP's low-latency kernels: one direct message per token and expert
    "deepep_low_latency": _on_platform("deepep_low_latency",
                                       internode.deepep_low_latency_time_s),
}


def kernel(name: str):
    """The all-to-all kernel `name` of `KERNELS` (ConfigError naming the known ones)."""
    if name not in KERNELS:
        raise ConfigError(f"comm_kernel = {name!r}; allowed: {', '.join(KERNELS)}")
    return KERNELS[name]


def alltoall_time_s(traffic, fabric, *, messages=None, sms=None, kernel_name: str = "nccl",
                    tau=0.0, platform: Platform | None = None):
    """Seconds [...] of one MoE dispatch or combine moving `traffic` [..., D, D] bytes on
    `fabric` (Platform or Topology) with the kernel `kernel_name` of `KERNELS`; `platform`
    (when `fabric` is its Topology) is handed to the kernels that need nodes and NICs."""
    fn = kernel(kernel_name)
    if getattr(fn, "needs_platform", False) and platform is not None:
        fabric = platform
    return fn(traffic, messages, fabric, sms=sms, tau=tau)
