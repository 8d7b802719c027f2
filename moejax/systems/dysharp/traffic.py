"""Per-port uplink / downlink bytes of every dispatch / combine primitive (004 §II, §III).

Notation (spec §2): token n is owned by GPU s(n) (data-parallel attention: slot n on GPU
n mod G, as `systems.ep.token_owner`); m_nd = experts of n on GPU d (a share sum under a
fractional placement); hit_nd = 1 - prod_j (1 - P[e_nj, d]) (1 if any of n's experts lives
on d; exact for one-hot P); S_n = {d != s(n): hit_nd > 0}, R_n = |S_n|, K^r_n = sum_{d != s} m_nd.
U_g / V_g: bytes GPU g sends up to / receives down from the switch, per phase.

Every function returns loads for one layer as a float32 array [4, G]: rows are dispatch
uplink, dispatch downlink, combine uplink, combine downlink, in token vectors (multiply by
bytes per token). All five primitives come from one pass (`port_loads`), since each metric of
one system (redundancy, useless traffic) compares it with the others.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# rows of `port_loads`
LOAD_ROWS = ("dispatch_up", "dispatch_down", "combine_up", "combine_down")
# primitives in the order `port_loads` stacks them; "dymultimem_b" is the literal reading of
# 004 §III-D2 (per-expert partials, local targets echoed through the switch; spec §7.5 B)
LOAD_KINDS = ("unicast_pair", "unicast_rank", "nvls", "dymultimem", "dymultimem_b")


def token_owner(num_tokens: int, num_devices: int) -> np.ndarray:
    """int [N]: GPU that owns token slot n (round-robin, DP attention; 004 §V-B)."""
    return np.arange(num_tokens) % num_devices


def experts_per_gpu(expert_ids, token_mask, placement, exact=False):
    """(m [N, G], hit [N, G]) of one layer: a token's experts on each GPU (a share sum under a
    fractional placement) and whether any of them is there, 1 - prod_j (1 - P[e_nj, d]).

    exact (a traced bool): the caller is in hard mode; then a one-hot placement takes a fast
    path (each expert's GPU id, compared with every GPU: no [N, K, G] row gather), chosen by
    `lax.cond` at run time with the same result. Relaxed callers (tuning) always take the
    general path, so gradients never see the fast path's argmax.
    """
    valid = (expert_ids >= 0) & token_mask[:, None]  # [N, K]
    safe = jnp.clip(expert_ids, 0)
    g = placement.shape[-1]

    def general(_):
        m, q = 0.0, 1.0
        for j in range(expert_ids.shape[1]):  # top-k slots, unrolled: one fused pass per slot
            pj = placement[safe[:, j]] * valid[:, j, None]  # [N, G]
            m, q = m + pj, q * (1.0 - pj)
        return (jnp.broadcast_to(m, (expert_ids.shape[0], g)),
                jnp.broadcast_to(1.0 - q, (expert_ids.shape[0], g)))

    def one_hot(_):
        dev = jnp.where(valid, jnp.argmax(placement, -1).astype(jnp.int32)[safe], -1)  # [N, K]
        m = (dev[..., None] == jnp.arange(g, dtype=jnp.int32)).sum(1).astype(jnp.float32)
        return m, (m > 0).astype(jnp.float32)

    if exact is False:
        return general(None)
    is_one_hot = (((placement == 0) | (placement == 1)).all()
                  & (placement.sum(-1) == 1).all())
    return jax.lax.cond(jnp.asarray(exact) & is_one_hot, one_hot, general, None)


def port_loads(expert_ids, token_mask, placement, nvls_self_copy: bool = False, exact=False):
    """Port loads [5, 4, G] (token vectors) of one layer for each of `LOAD_KINDS`.

    expert_ids [N, K] (-1 = no expert), token_mask [N], placement [E, G] share matrix;
    exact: hard mode (`experts_per_gpu`'s one-hot fast path).
    """
    n = expert_ids.shape[0]
    g = placement.shape[-1]
    valid = (expert_ids >= 0) & token_mask[:, None]  # [N, K]
    m, hit = experts_per_gpu(expert_ids, token_mask, placement, exact)  # [N, G]
    own = jnp.asarray(np.eye(g, dtype=np.float32)[token_owner(n, g)])  # [N, G]
    real = (valid.any(-1)).astype(jnp.float32)  # [N]
    rem_hit = hit * (1.0 - own)
    rem_m = m * (1.0 - own)
    r = rem_hit.sum(-1)  # R_n
    kr = rem_m.sum(-1)  # K^r_n
    any_remote = jnp.minimum(r, 1.0)  # 1[R_n > 0], exact for integer R
    any_target = jnp.minimum(hit.sum(-1), 1.0)

    def up(x):  # per-token amount charged to the owner's port
        return x @ own

    pair = jnp.stack([up(kr), rem_m.sum(0), rem_m.sum(0), up(kr)])
    rank = jnp.stack([up(r), rem_hit.sum(0), rem_hit.sum(0), up(r)])
    n_g = up(real)  # tokens owned per GPU
    others = n_g.sum() - n_g + (n_g if nvls_self_copy else 0.0)
    nvls = jnp.stack([n_g, others, others, n_g])
    dyn_a = jnp.stack([up(any_remote), rem_hit.sum(0), rem_hit.sum(0), up(any_remote)])
    dyn_b = jnp.stack([up(any_target), hit.sum(0), m.sum(0), up(any_target)])
    return jnp.stack([pair, rank, nvls, dyn_a, dyn_b])


def dispatch_matrix(expert_ids, token_mask, placement, primitive: str, exact=False):
    """Dispatch traffic [G, G] of a unicast primitive in token vectors: [s, d] = copies GPU s
    sends GPU d (unicast_pair: sum_n 1[s(n) = s] m_nd, unicast_rank: the same with hit_nd);
    the diagonal is the local share. Its row / column sums off the diagonal are the
    primitive's dispatch uplink / downlink of `port_loads`, and the combine moves its
    transpose (the same copies back)."""
    n = expert_ids.shape[0]
    g = placement.shape[-1]
    m, hit = experts_per_gpu(expert_ids, token_mask, placement, exact)  # [N, G]
    own = jnp.asarray(np.eye(g, dtype=np.float32)[token_owner(n, g)])  # [N, G]
    return own.T @ (m if primitive == "unicast_pair" else hit)


def load_index(primitive: str, combine: str) -> int:
    """Row of `port_loads` that a config's primitive moves (explicit = DySHARP's bytes)."""
    if primitive in ("dymultimem", "explicit"):
        return LOAD_KINDS.index("dymultimem" if combine == "per_gpu" else "dymultimem_b")
    return LOAD_KINDS.index(primitive)


def distinct_remote_gpus(expert_ids, token_mask, placement):
    """R_n [N]: remote GPUs token n must reach (0 for padded slots)."""
    g = placement.shape[-1]
    _, hit = experts_per_gpu(expert_ids, token_mask, placement)
    own = jax.nn.one_hot(token_owner(expert_ids.shape[0], g), g)
    return (hit * (1.0 - own)).sum(-1)
