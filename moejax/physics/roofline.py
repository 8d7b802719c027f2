"""Roofline time of a kernel: the larger of its compute time and its memory time."""

from __future__ import annotations

from moejax import relax


def compute_time_s(flops, peak_flops):
    """Seconds to execute `flops` at `peak_flops` FLOP/s."""
    return flops / peak_flops


def memory_time_s(bytes_, mem_Bps):
    """Seconds to move `bytes_` at `mem_Bps` bytes/s."""
    return bytes_ / mem_Bps


def roofline_time_s(flops, bytes_, peak_flops, mem_Bps, tau=0.0):
    """max(compute, memory) time (smooth for tau > 0): compute and memory fully overlap."""
    return relax.maximum(compute_time_s(flops, peak_flops), memory_time_s(bytes_, mem_Bps), tau)
