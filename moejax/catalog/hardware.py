"""Platform specs: typed, validated, immutable, loaded from `hardware/*.toml`.

A platform is a number of identical devices (chiplet dies, wafer dies, GPUs) and a topology
that connects them. Bandwidths are bytes per second per direction (`_Bps`), latencies are
seconds per hop (`_s`), compute is FLOP/s per dtype. See `docs/architecture.md` for the
schema with an example; `hardware/chiplet-2x2.toml` is annotated key by key.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from moejax.catalog import paths as catalog
from moejax.catalog.schema import Table, read_toml
from moejax.errors import ConfigError

FAMILIES = ("chiplet", "wafer", "gpu")
TOPOLOGY_KINDS = ("ring", "mesh2d", "multi_wafer_mesh", "switch", "hierarchical")
# calibration constants that are shares of an ideal rate: allowed range (0, 1]
UNIT_FRACTIONS = ("gemm_efficiency", "grouped_gemm_derate", "protocol_efficiency",
                  "inter_protocol_efficiency")
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """One device (die / GPU): compute, on-chip buffer, local memory."""

    peak_flops: tuple[tuple[str, float], ...]  # (dtype, FLOP/s) pairs, dense
    onchip_buffer_bytes: float  # SRAM / scratchpad / L2 available to kernels
    memory_capacity_bytes: float  # HBM / DDR capacity reachable by this device
    memory_Bps: float  # local memory bandwidth (HBM, or this die's DDR share)
    sm_count: int = 0  # streaming multiprocessors (GPUs only, 0 otherwise)
    area_mm2: float = 0.0  # die area where the paper gives one (000 Eq. 1), else 0
    power_w: float = 0.0  # power where the paper gives one (000 Eq. 2), else 0
    # calibration (`moejax.physics`, docs/physics.md); the defaults are the ideal device
    gemm_efficiency: float = 1.0  # share of peak a large dense GEMM sustains, (0, 1]
    grouped_gemm_derate: float = 1.0  # grouped (MoE) kernel's rate / the dense one's, (0, 1]
    sm_comm_Bps: float = 0.0  # bytes/s one SM drives into the fabric (0: not SM-limited)

    def flops(self, dtype: str) -> float:
        """Peak FLOP/s for `dtype`; the nearest wider dtype if this one is not listed."""
        table = dict(self.peak_flops)
        order = DTYPES[DTYPES.index(dtype):: -1] + DTYPES[DTYPES.index(dtype) + 1:]
        for d in order:
            if d in table:
                return table[d]
        raise ConfigError(f"device has no peak_flops entry; dtypes listed: {sorted(table)}")


@dataclasses.dataclass(frozen=True)
class TopologySpec:
    """How devices connect. Which fields matter depends on `kind`:

    ring: devices in a bidirectional ring (`link_Bps` per direction per link).
    mesh2d: `rows` x `cols` mesh, XY routing, `link_Bps` per direction per link.
    multi_wafer_mesh: `wafer_rows` x `wafer_cols` wafers of `rows` x `cols` dies each, joined
      into one mesh; the links across a wafer border share `border_Bps` per direction.
    switch: every device has a port of `link_Bps` per direction to a non-blocking switch
      (NVSwitch / fat tree); `in_switch_compute` marks multicast / reduction support (NVLS).
    hierarchical: `nodes` nodes of `devices_per_node` devices; inside a node a switch with
      `link_Bps` ports; between nodes each device has a NIC of `inter_Bps` per direction
      (rail-optimized), `inter_latency_s` per traversal.
    """

    kind: str
    link_Bps: float
    hop_latency_s: float
    rows: int = 0
    cols: int = 0
    wafer_rows: int = 1
    wafer_cols: int = 1
    border_Bps: float = 0.0
    nodes: int = 1
    devices_per_node: int = 0
    inter_Bps: float = 0.0
    inter_latency_s: float = 0.0
    in_switch_compute: bool = False
    # calibration (`moejax.physics.comm`, docs/physics.md); the defaults are the ideal fabric
    protocol_efficiency: float = 1.0  # share of link_Bps a bulk transfer sustains, (0, 1]
    inter_protocol_efficiency: float = 1.0  # the same for the inter-node NICs, (0, 1]
    message_latency_s: float = 0.0  # fixed cost per message a sender issues, seconds
    kernel_latency_s: float = 0.0  # fixed cost per communication kernel (launch, sync)


@dataclasses.dataclass(frozen=True)
class PacketSpec:
    """Link-layer packet format, where the paper gives one (004 §II, flits / headers)."""

    packet_bytes: float  # max payload+header per packet
    header_bytes: float  # header / control bytes per packet
    flit_bytes: float = 0.0  # flit granularity (0: not modelled)


@dataclasses.dataclass(frozen=True)
class Platform:
    """A whole platform: `num_devices` identical devices and their topology."""

    name: str
    description: str
    source: str
    family: str
    num_devices: int
    device: DeviceSpec
    topology: TopologySpec
    packet: PacketSpec | None = None
    path: str = ""

    def with_overrides(self, **changes) -> Platform:
        """A copy with some device / topology fields changed (for sweeps), re-validated."""
        dev = {k: v for k, v in changes.items() if k in _fields(DeviceSpec)}
        top = {k: v for k, v in changes.items() if k in _fields(TopologySpec)}
        rest = set(changes) - set(dev) - set(top)
        if rest:
            raise ConfigError(f"{self.name}: cannot override {sorted(rest)}")
        for k, v in {**dev, **top}.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0 and k not in (
                "hop_latency_s", "inter_latency_s", "sm_count", "area_mm2", "power_w",
                "sm_comm_Bps", "message_latency_s", "kernel_latency_s"
            ):
                raise ConfigError(f"{self.name}: override {k} = {v!r} must be > 0")
            if k in UNIT_FRACTIONS and isinstance(v, (int, float)) and not 0 < v <= 1:
                raise ConfigError(f"{self.name}: override {k} = {v!r} must be in (0, 1]")
        return dataclasses.replace(
            self,
            device=dataclasses.replace(self.device, **dev),
            topology=dataclasses.replace(self.topology, **top),
        )


def _fraction(t: Table, key: str) -> float:
    """An optional calibration share in (0, 1] (default 1: the ideal rate)."""
    v = t.float(key, 1.0, positive=False, lo=float("-inf"))
    if not 0.0 < v <= 1.0:
        raise ConfigError(f"{t.where}: key {key!r} = {v!r} must be in (0, 1] (a share of the "
                          "ideal rate)")
    return v


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def parse_platform(data: dict, where: str, name: str) -> Platform:
    """Validate one platform table (from TOML) into a Platform."""
    t = Table(data, where)
    family = t.str("family", choices=FAMILIES)
    description = t.str("description")
    source = t.str("source")
    num_devices = t.int("num_devices", lo=1, hi=4096)

    d = t.table("device")
    flops_t = d.table("peak_flops")
    peak = []
    for dtype in DTYPES:
        v = flops_t.float(dtype, required=False)
        if v is not None:
            peak.append((dtype, v))
    flops_t.close()
    if not peak:
        raise ConfigError(f"{flops_t.where}: needs at least one of {', '.join(DTYPES)}")
    device = DeviceSpec(
        peak_flops=tuple(peak),
        onchip_buffer_bytes=d.float("onchip_buffer_bytes"),
        memory_capacity_bytes=d.float("memory_capacity_bytes"),
        memory_Bps=d.float("memory_Bps"),
        sm_count=d.int("sm_count", 0, lo=0),
        area_mm2=d.float("area_mm2", 0.0, positive=False),
        power_w=d.float("power_w", 0.0, positive=False),
        gemm_efficiency=_fraction(d, "gemm_efficiency"),
        grouped_gemm_derate=_fraction(d, "grouped_gemm_derate"),
        sm_comm_Bps=d.float("sm_comm_Bps", 0.0, positive=False),
    )
    d.close()

    g = t.table("topology")
    kind = g.str("kind", choices=TOPOLOGY_KINDS)
    topo = dict(
        kind=kind,
        link_Bps=g.float("link_Bps"),
        hop_latency_s=g.float("hop_latency_s", positive=False),
    )
    topo.update(
        protocol_efficiency=_fraction(g, "protocol_efficiency"),
        message_latency_s=g.float("message_latency_s", 0.0, positive=False),
        kernel_latency_s=g.float("kernel_latency_s", 0.0, positive=False),
    )
    if kind in ("mesh2d", "multi_wafer_mesh"):
        topo.update(rows=g.int("rows"), cols=g.int("cols"))
    if kind == "multi_wafer_mesh":
        topo.update(
            wafer_rows=g.int("wafer_rows"), wafer_cols=g.int("wafer_cols"),
            border_Bps=g.float("border_Bps"),
        )
    if kind == "switch":
        topo.update(in_switch_compute=g.bool("in_switch_compute", False))
    if kind == "hierarchical":
        topo.update(
            nodes=g.int("nodes"), devices_per_node=g.int("devices_per_node"),
            inter_Bps=g.float("inter_Bps"),
            inter_latency_s=g.float("inter_latency_s", positive=False),
            inter_protocol_efficiency=_fraction(g, "inter_protocol_efficiency"),
            in_switch_compute=g.bool("in_switch_compute", False),
        )
    g.close()
    topology = TopologySpec(**topo)

    p = t.table("packet", required=False)
    packet = None
    if p is not None:
        packet = PacketSpec(
            packet_bytes=p.float("packet_bytes"),
            header_bytes=p.float("header_bytes", positive=False),
            flit_bytes=p.float("flit_bytes", 0.0, positive=False),
        )
        p.close()
    t.close()

    expected = {
        "ring": num_devices,
        "switch": num_devices,
        "mesh2d": topology.rows * topology.cols,
        "multi_wafer_mesh": topology.rows * topology.cols * topology.wafer_rows
        * topology.wafer_cols,
        "hierarchical": topology.nodes * topology.devices_per_node,
    }[kind]
    if expected != num_devices:
        raise ConfigError(
            f"{where}: num_devices = {num_devices} but the {kind} topology has {expected} devices"
        )
    return Platform(
        name=name, description=description, source=source, family=family,
        num_devices=num_devices, device=device, topology=topology, packet=packet,
        path=str(where),
    )


@functools.cache
def _load_file(path: Path) -> Platform:
    return parse_platform(read_toml(path), str(path), path.stem)


def load_platform(name: str) -> Platform:
    """A platform by catalog name (`chiplet-2x2`) or by path to a TOML file."""
    return _load_file(catalog.resolve("hardware", name).resolve())


def platform_names() -> list[str]:
    """Every platform name in the catalog."""
    return list(catalog.catalog_files("hardware"))
