"""Payload efficiency of each primitive's packets (004 §III-A, §III-B Fig. 7, §V-A).

The catalog packet (`[packet]` of the platform: 256 B payload + 64 B header, 80%, the ideal of
004 §III-A) carries every unicast and NVLS transfer. A dynamic multimem packet adds
ceil(k / 8) target-extension flits of 16 B (Fig. 7: eight 16-bit expert ids per flit); an
explicitly addressed packet adds one destination address per target (spec §7.6: 8 B each;
004's own 69% cannot be derived from a standard flit layout, spec §5.5).
"""

from __future__ import annotations

import math

from moejax.catalog.hardware import Platform
from moejax.systems.dysharp.config import EXPLICIT_ADDRESS_BYTES, TARGETS_PER_FLIT

DEFAULT_PACKET = (320.0, 64.0, 16.0)  # 004 §III-A 80% ideal, §V-A 16 B flits (gh200-nvl32)


def packet_of(platform: Platform) -> tuple[float, float, float]:
    """(packet_bytes, header_bytes, flit_bytes) of the platform (the 004 default if none)."""
    p = platform.packet
    if p is None:
        return DEFAULT_PACKET
    return p.packet_bytes, p.header_bytes, p.flit_bytes or DEFAULT_PACKET[2]


def payload_efficiency(platform: Platform, primitive: str, top_k: int,
                       address_bytes: float = EXPLICIT_ADDRESS_BYTES) -> float:
    """Payload bytes / wire bytes of one full packet of `primitive` for top-k routing."""
    packet, header, flit = packet_of(platform)
    payload = packet - header
    extra = 0.0
    if primitive == "dymultimem":
        extra = math.ceil(top_k / TARGETS_PER_FLIT) * flit
    elif primitive == "explicit":
        extra = top_k * address_bytes
    return payload / (packet + extra)
