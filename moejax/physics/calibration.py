"""The two readings of a platform: physical (calibrated, the default) and a paper's ideal.

A platform TOML states measured calibration constants (docs/physics.md): link protocol
efficiencies, per-message and per-kernel latencies, the per-SM injection rate of
communication kernels, and GEMM efficiencies. The reproductions of the papers' models set
the papers' own assumptions explicitly: `paper_reading` returns the platform with every
calibration constant at its ideal value (100% link and GEMM efficiency, no fixed latencies,
no SM limit), which prices exactly as the catalog did before calibration.
"""

from __future__ import annotations

from moejax.catalog.hardware import Platform, load_platform

IDEAL = {
    "protocol_efficiency": 1.0,
    "inter_protocol_efficiency": 1.0,
    "message_latency_s": 0.0,
    "kernel_latency_s": 0.0,
    "gemm_efficiency": 1.0,
    "grouped_gemm_derate": 1.0,
    "sm_comm_Bps": 0.0,
}


def is_ideal(platform: Platform) -> bool:
    """True when every calibration constant of `platform` is at its ideal value."""
    dev, top = platform.device, platform.topology
    return all(getattr(dev if hasattr(dev, k) else top, k) == v for k, v in IDEAL.items())


def paper_reading(platform: Platform, **keep) -> Platform:
    """`platform` with the papers' ideal assumptions: every calibration constant at its ideal
    value, except those named in `keep` (name=value)."""
    if is_ideal(platform) and not keep:
        return platform
    return platform.with_overrides(**{**IDEAL, **keep})


def paper_platform(name: str, **keep) -> Platform:
    """The catalog platform `name` (or TOML path) in the papers' ideal reading."""
    return paper_reading(load_platform(name), **keep)


def paper_toml_text(platform: Platform) -> str:
    """The TOML text of a catalog platform without its calibration keys (its paper reading,
    for tools that load a platform from a file)."""
    with open(platform.path, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    return "".join(x for x in lines if x.partition("=")[0].strip() not in IDEAL)
