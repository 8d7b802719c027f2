"""Layer time of each schedule from port loads and GEMM times (spec §2 "Schedules").

Inputs are per layer: `loads` [4, G] wire bytes (dispatch up / down, combine up / down, already
divided by payload efficiency), `x1` / `x2` [G] GEMM-1 / GEMM-2 seconds at the full SM count,
`x1s` / `x2s` the same on the SMs left beside the comm kernels (`system.gemm_times_s` with the
share: compute-bound experts slow down, memory-bound ones stream at the HBM rate), and the
one-tile terms of `TileTerms`. Ports are full duplex: a phase ends when its busiest port
direction drains (`physics.collectives.phase_time_s`, per-direction port bandwidth).

serial   Cd + X1 + X2 + Cc                                   (DeepEP, NVLS, DySHARP-Basic)
coarse   min_n max(C, X_n) + min(C, X_n) / n + (n - 1) * 2 lat   (FasterMoE n fixed, Tutel best
         n); X_1 = X (one chunk runs comm and GEMMs one after the other), X_n = X' for n > 1
fine     max(Cd, X1') + max(X2', Cc) + fill + drain          (CCFuser, COMET, DySHARP-COMET)
fused    max(max_g sum U / B, max_g sum V / B, X') + fill + drain   (004 §IV)
X' = the GEMMs on the SMs left to them while comm kernels run (every overlapped schedule pays
its comm SMs, `config.OVERLAPPED`); in the overlapped schedules link_Bps is the rate the comm
SMs reach (`config.comm_rate_of`). `chunks`: a tuple of degrees (the best one taken) or one
traced degree (tuned). fill + drain = the first tile's dispatch, GEMM-1 and GEMM-2 and the
last tile's combine plus one round trip (004 §IV: tiles of tsize tokens pace the pipeline),
for the tokens a tile holds (`system.tile_terms`).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from moejax import relax


@struct.dataclass
class TileTerms:
    """One tile's time in each phase (seconds): dispatch, GEMM-1, GEMM-2, combine; rtt."""

    dispatch_s: jnp.ndarray
    gemm1_s: jnp.ndarray
    gemm2_s: jnp.ndarray
    combine_s: jnp.ndarray
    rtt_s: jnp.ndarray

    @property
    def fill_drain_s(self):
        return self.dispatch_s + self.gemm1_s + self.gemm2_s + self.combine_s + self.rtt_s


def phase_times_s(loads, link_Bps, latency_s, tau=0.0):
    """(Cd, Cc): dispatch and combine phase seconds when each runs alone."""
    busy = loads / link_Bps  # [4, G]
    cd = relax.max(relax.maximum(busy[0], busy[1], tau), tau) + latency_s
    cc = relax.max(relax.maximum(busy[2], busy[3], tau), tau) + latency_s
    return cd, cc


def layer_time_s(schedule: str, loads, x1, x2, link_Bps, latency_s, chunks, tile: TileTerms,
                 tau=0.0, phases=None, x1s=None, x2s=None):
    """dict: latency_s, comm_s (Cd + Cc alone), gemm_s (slowest GPU, full SMs) of one layer.

    phases: (Cd, Cc) seconds from a communication kernel's own time model (None: the port
    link model of `phase_times_s`); the serial, coarse and fine schedules use them.
    x1s / x2s: GEMM seconds on the SMs left beside the comm kernels (None: x1 / x2)."""
    cd, cc = phase_times_s(loads, link_Bps, latency_s, tau) if phases is None else phases
    x1s = x1 if x1s is None else x1s
    x2s = x2 if x2s is None else x2s
    x = relax.max(x1 + x2, tau)
    xs = relax.max(x1s + x2s, tau)
    x1m, x2m = relax.max(x1, tau), relax.max(x2, tau)
    if schedule == "serial":
        t = cd + x1m + x2m + cc
    elif schedule == "coarse":
        c = cd + cc

        def pipe(n, xn):
            hi, lo = relax.maximum(c, xn, tau), relax.minimum(c, xn, tau)
            return hi + lo / n + (n - 1) * 2 * latency_s

        if isinstance(chunks, tuple):  # the policy's degrees, the best one taken
            opts = jnp.stack([pipe(n, x if n == 1 else xs) for n in chunks])
            t = relax.min(opts, tau, axis=0)
        else:  # one traced degree (tuned; fractional while relaxed)
            t = pipe(chunks, jnp.where(chunks > 1, xs, x))
    elif schedule == "fine":
        t = (relax.maximum(cd, relax.max(x1s, tau), tau)
             + relax.maximum(relax.max(x2s, tau), cc, tau) + tile.fill_drain_s)
    elif schedule == "fused":
        up = relax.max((loads[0] + loads[2]) / link_Bps, tau)  # seconds, as tau
        down = relax.max((loads[1] + loads[3]) / link_Bps, tau)
        t = relax.max(jnp.stack([up, down, xs]), tau, axis=0) + tile.fill_drain_s
    else:
        raise ValueError(schedule)
    return {"latency_s": t, "comm_s": cd + cc, "gemm_s": x}
