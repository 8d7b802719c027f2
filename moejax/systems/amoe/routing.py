"""Counter-based expert routing: the experts of (request, token, block) from an integer hash.

002 §5: "We replaced the routing layer in Mixtral 8x7B with our own routing which randomly
selects experts based on the profiled exponential distribution." Each routing decision is a
pure function of (stream seed, request r, token index i, block b), so the vectorized
simulation, the synchronous baseline and the plain-Python reference draw the same experts
without storing a [R, tokens, blocks, K] table. The functions take the array module `xp`
(numpy or jax.numpy) and use only uint32 arithmetic and float32 comparisons, which are
exact in both.

Top-k without replacement: up to `M` candidate draws from the block's popularity (inverse
CDF), keeping the first K distinct ones (sequential sampling without replacement, by
rejection); in the rare case of fewer than K distinct draws the lowest unused expert ids
fill in.
"""

from __future__ import annotations

import numpy as np

_C_REQ, _C_TOK, _C_BLK, _C_DRAW = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F


def popularity_cdf(popularity) -> np.ndarray:
    """float32 [NB, E] cumulative popularity per block (last column forced to 1)."""
    p = np.asarray(popularity, np.float64)
    c = np.cumsum(p / p.sum(-1, keepdims=True), -1)
    c[:, -1] = 1.0
    return c.astype(np.float32)


def num_draws(top_k: int) -> int:
    """Candidate draws per routing decision (1 for top-1)."""
    return 1 if top_k == 1 else 4 * top_k


def _mix32(xp, x):
    """lowbias32 integer finalizer (uint32 -> uint32)."""
    x = x ^ (x >> xp.uint32(16))
    x = x * xp.uint32(0x7FEB352D)
    x = x ^ (x >> xp.uint32(15))
    x = x * xp.uint32(0x846CA68B)
    return x ^ (x >> xp.uint32(16))


def uniforms(xp, seed, req, tok, blk, m: int):
    """float32 [..., m] uniforms in [0, 1) for each (req, tok, blk) (broadcast shapes)."""
    u32 = xp.uint32
    base = (xp.asarray(req).astype(u32) * u32(_C_REQ)) ^ (xp.asarray(tok).astype(u32)
                                                          * u32(_C_TOK))
    base = base ^ (xp.asarray(blk).astype(u32) * u32(_C_BLK)) ^ xp.asarray(seed).astype(u32)
    base = _mix32(xp, base)
    draws = xp.arange(m).astype(u32) * u32(_C_DRAW)
    h = _mix32(xp, base[..., None] ^ draws)
    h = _mix32(xp, h + u32(0x165667B1))
    return (h >> u32(8)).astype(xp.float32) * xp.float32(2.0**-24)


def choose_experts(xp, seed, req, tok, blk, cdf, top_k: int):
    """int32 [..., K] experts of each (req, tok, blk); `cdf` float32 [NB, E] (popularity_cdf)."""
    cdf = xp.asarray(cdf)
    num_experts = cdf.shape[-1]
    m = num_draws(top_k)
    u = uniforms(xp, seed, req, tok, blk, m)  # [..., m]
    rows = cdf[xp.asarray(blk)][..., None, : num_experts - 1]  # [..., 1, E-1]
    draws = (u[..., None] >= rows).sum(-1).astype(xp.int32)  # [..., m]
    if top_k == 1:
        return draws
    earlier = np.tril(np.ones((m, m), bool), -1)  # earlier[i, j]: j < i
    same = draws[..., :, None] == draws[..., None, :]
    is_new = ~(same & earlier).any(-1)  # [..., m]
    order = xp.cumsum(is_new.astype(xp.int32), -1) - 1
    chosen = []
    for k in range(top_k):  # K is static and small
        sel = is_new & (order == k)
        found = sel.any(-1)
        pick = (sel * draws).sum(-1)
        fill = _lowest_unused(xp, chosen, num_experts, pick.shape)
        chosen.append(xp.where(found, pick, fill).astype(xp.int32))
    return xp.stack(chosen, -1)


def _lowest_unused(xp, chosen, num_experts: int, shape):
    """The smallest expert id not in `chosen` (a list of int arrays of `shape`)."""
    if not chosen:  # 0; spelled out so XLA does not constant-fold an argmax over `shape`
        return xp.zeros(shape, xp.int32)
    ids = xp.arange(num_experts)
    used = xp.zeros((*shape, num_experts), bool)
    for c in chosen:
        used = used | (xp.asarray(c)[..., None] == ids)
    return xp.argmax(~used, -1).astype(xp.int32)
