"""Point-to-point link time: Eq. 1 of the wafer-scale paper (001 §III-B)."""

from __future__ import annotations


def eq1_latency_s(volume_bytes, bandwidth_Bps, link_latency_s, hops):
    """001 Eq. 1: latency = (volume / bandwidth + link_latency) * hops.

    A store-and-forward estimate for one transfer over `hops` identical links. The
    contention model of `moejax.physics.collectives` reduces to it for a lone transfer
    over one hop; over several hops it charges the volume once per link it occupies.
    """
    return (volume_bytes / bandwidth_Bps + link_latency_s) * hops
