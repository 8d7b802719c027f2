"""Roofline time of a kernel: the larger of its compute time and its memory time.

Compute runs at the device's peak for the kernel's dtype times the share of it a GEMM
sustains (`DeviceSpec.gemm_efficiency`: clocks under a full tensor-core load, measured on
large dense GEMMs), and a grouped (MoE) kernel at `grouped_gemm_derate` of that; memory at the
device's bandwidth. Both default to 1 (the ideal roofline a paper's model assumes); the
platform TOMLs cite their measured values (docs/physics.md). Wave quantization over the SMs
and small-m tiles are `moejax.physics.gemm`.
"""

from __future__ import annotations

from moejax import relax

KINDS = ("dense", "grouped")


def compute_time_s(flops, peak_flops):
    """Seconds to execute `flops` at `peak_flops` FLOP/s."""
    return flops / peak_flops


def memory_time_s(bytes_, mem_Bps):
    """Seconds to move `bytes_` at `mem_Bps` bytes/s."""
    return bytes_ / mem_Bps


def roofline_time_s(flops, bytes_, peak_flops, mem_Bps, tau=0.0):
    """max(compute, memory) time (smooth for tau > 0): compute and memory fully overlap."""
    return relax.maximum(compute_time_s(flops, peak_flops), memory_time_s(bytes_, mem_Bps), tau)


def sustained_flops(device, dtype: str, kind: str = "dense") -> float:
    """FLOP/s a `kind` GEMM sustains on `device` in `dtype`: peak x gemm_efficiency (x the
    grouped derate for a grouped kernel). Exactly the peak on an ideal device."""
    peak = device.flops(dtype)
    eff = device.gemm_efficiency * (device.grouped_gemm_derate if kind == "grouped" else 1.0)
    return peak if eff == 1.0 else peak * eff


def device_compute_s(flops, device, dtype: str, kind: str = "dense"):
    """Seconds of `flops` of a `kind` GEMM on `device` (`sustained_flops`)."""
    return compute_time_s(flops, sustained_flops(device, dtype, kind))


def device_memory_s(bytes_, device):
    """Seconds to move `bytes_` through `device`'s local memory."""
    return memory_time_s(bytes_, device.memory_Bps)


def device_roofline_s(flops, bytes_, device, dtype: str, tau=0.0, kind: str = "dense"):
    """max(compute, memory) seconds of one kernel on `device` (smooth for tau > 0)."""
    return relax.maximum(device_compute_s(flops, device, dtype, kind),
                         device_memory_s(bytes_, device), tau)
