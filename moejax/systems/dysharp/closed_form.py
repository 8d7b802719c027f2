"""Closed forms of spec §5 for uniform top-k routing over E experts on G GPUs (balanced
placement, E/G experts per GPU, source GPU uniform): what the tests and the study compare
the vectorized traces with. Counts in token vectors per token."""

from __future__ import annotations

from math import comb


def no_hit_probability(num_experts: int, num_devices: int, top_k: int) -> float:
    """q: probability that a given GPU holds none of a token's k experts."""
    epg = num_experts // num_devices
    return comb(num_experts - epg, top_k) / comb(num_experts, top_k)


def expected_distinct_gpus(num_experts: int, num_devices: int, top_k: int) -> float:
    """E[D] = G (1 - q) (spec §5.1)."""
    return num_devices * (1.0 - no_hit_probability(num_experts, num_devices, top_k))


def expected_remote_gpus(num_experts: int, num_devices: int, top_k: int) -> float:
    """E[R] = E[D] (G - 1) / G."""
    g = num_devices
    return expected_distinct_gpus(num_experts, g, top_k) * (g - 1) / g


def probability_any_remote(num_experts: int, num_devices: int, top_k: int) -> float:
    """P(R >= 1) = 1 - C(E/G, k) / C(E, k)."""
    epg = num_experts // num_devices
    return 1.0 - comb(epg, top_k) / comb(num_experts, top_k)


def expected_remote_pairs(num_experts: int, num_devices: int, top_k: int) -> float:
    """E[K^r] = k (G - 1) / G."""
    return top_k * (num_devices - 1) / num_devices


def traffic_per_token(num_experts: int, num_devices: int, top_k: int) -> dict[str, float]:
    """Port traversals per token, dispatch + combine, up + down (spec §5.2, variant A)."""
    r = expected_remote_gpus(num_experts, num_devices, top_k)
    p = probability_any_remote(num_experts, num_devices, top_k)
    kr = expected_remote_pairs(num_experts, num_devices, top_k)
    g = num_devices
    return {"unicast_pair": 4 * kr, "unicast_rank": 4 * r, "dymultimem": 2 * (r + p),
            "nvls": 2 * (1 + (g - 1))}


def redundancy(num_experts: int, num_devices: int, top_k: int) -> float:
    """Share of DeepEP's bytes that in-switch multicast / reduction removes: (R - P) / (2R)."""
    r = expected_remote_gpus(num_experts, num_devices, top_k)
    p = probability_any_remote(num_experts, num_devices, top_k)
    return (r - p) / (2 * r) if r > 0 else 0.0


def ideal_speedup(num_experts: int, num_devices: int, top_k: int) -> float:
    """Fused DySHARP comm vs DeepEP comm, 2R / (R + P) (spec §5.4; 2R/(R+1) for P = 1)."""
    r = expected_remote_gpus(num_experts, num_devices, top_k)
    p = probability_any_remote(num_experts, num_devices, top_k)
    return 2 * r / (r + p) if r > 0 else 1.0


def nvls_useless(num_experts: int, num_devices: int, top_k: int) -> float:
    """NVLS dispatch downlink / needed downlink - 1 = (G - 1) / E[R] - 1 (spec §5.3)."""
    return (num_devices - 1) / expected_remote_gpus(num_experts, num_devices, top_k) - 1.0
