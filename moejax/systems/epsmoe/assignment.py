"""Chunk assignment of local experts in the expert pipeline (beyond 003).

003 §4.3 (E11) splits each device's E_loc local experts into N equal contiguous groups:
chunk c holds local experts [c E_loc / N, (c + 1) E_loc / N). On skewed routing a chunk of
hot experts has a long GEMM while its dispatch overlaps little; another grouping can balance
the per-chunk GEMM against the per-chunk dispatch. Here an assignment is any map (device,
local expert) -> chunk in [0, N):

- Hard (`EPSConfig.chunk_assignment`, policy option `chunk_assignment`): D lists of E_loc
  chunk ids. Chunks may be unequal or empty. An empty chunk on one device only means that
  device runs no GEMM in that stage. A chunk that is empty on every device still runs as a
  stage: its all2all pair is launched (2 alpha, no bytes), and it counts in R(N) =
  overhead (N - 1). N is the policy's pn, and the stages run in chunk-id order.
- Soft (the tuning system, "assignment" in `EPSConfig.relaxed`): P [D, E_loc, S] with rows
  summing to 1 over S = E_loc slots; at degree N slot s belongs to chunk s // (E_loc / N),
  so P_chunks = P @ chunk_matrix(N). The identity (expert j in slot j) is the paper's
  contiguous grouping at every N, so pn and the assignment tune together. For a fixed N the
  slot logits [E_loc, E_loc] are [E_loc, N] chunk logits (a chunk's logit is the logsumexp
  of its slots'); hard = the chunk of the argmax slot.

The soft block reads P as independent per-expert chunk probabilities:
- rows of chunk c on device d: sum_j rows[d, j] P[d, j, c] (likewise tiles, bytes and
  dense-kernel time, all linear);
- dispatch, deduplicated per (token, device, chunk) (E11 read literally): the expected
  number of (token, device, chunk) triples with at least one of the token's experts,
  1 - prod_a (1 - p_a,c) over the token's choices a on that device. It is attributed to the
  choices in order: w_a,c = p_a,c prod_{b < a, same device} (1 - p_b,c). For the send-once
  reading (`resend = False`) it is P(the earliest chunk on that device is c) = G(c - 1) -
  G(c), with G(c) = prod_a (1 - F_a(c)) and F_a the cumulative chunk probability;
- GEMM waves ceil(tiles / SMs) as a smooth staircase at temperature tau, in wave units
  (`soft_ceil`).
For a one-hot P every step is exact: the expected counts are the hard counts (0/1 products,
integer sums), and the staircase is the ceil at tau = 0. That makes the tuning system at
tau = 0 the hard system with that assignment (tested against the plain-Python reference).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from moejax import ops
from moejax.errors import ConfigError


def check_assignment(value, num_devices: int, local_experts: int, pn: int):
    """The assignment as D tuples of E_loc ints in [0, pn); one ConfigError line otherwise."""
    allowed = (f"allowed: {num_devices} lists of {local_experts} chunk ids in [0, {pn}) "
               f"(pn = {pn})")
    try:
        a = np.asarray(value)
    except (TypeError, ValueError):
        raise ConfigError(f"chunk_assignment: not a rectangular array; {allowed}") from None
    if a.shape != (num_devices, local_experts) or not np.issubdtype(a.dtype, np.integer):
        raise ConfigError(f"chunk_assignment: shape {a.shape} of {a.dtype}; {allowed}")
    if ((a < 0) | (a >= pn)).any():
        raise ConfigError(f"chunk_assignment: chunk id {int(a[(a < 0) | (a >= pn)][0])}; "
                          f"{allowed}")
    return tuple(tuple(int(x) for x in row) for row in a)


def contiguous(num_devices: int, local_experts: int, pn: int) -> np.ndarray:
    """The paper's grouping (E11): local expert j in chunk j // (E_loc / N), every device."""
    return np.tile(np.arange(local_experts) // (local_experts // pn), (num_devices, 1))


def identity_slots(num_devices: int, local_experts: int) -> np.ndarray:
    """Slot ids of the contiguous grouping (expert j in slot j): the same at every N."""
    return np.tile(np.arange(local_experts), (num_devices, 1))


def slots_to_chunks(slots, local_experts: int, pn: int) -> np.ndarray:
    """Chunk ids [D, E_loc] of slot ids at degree pn."""
    return np.asarray(slots) // (local_experts // pn)


def balanced_slots(load_e, num_devices: int, pn: int) -> np.ndarray:
    """A load-balancing baseline (not in 003): per device, the hottest expert first onto the
    chunk with the least expected rows that still has room for E_loc / N experts (equal
    sizes, like the paper's groups), as slot ids [D, E_loc] at degree pn."""
    load = np.asarray(load_e, np.float64).reshape(num_devices, -1)
    e_loc = load.shape[1]
    g = e_loc // pn
    out = np.empty((num_devices, e_loc), np.int64)
    for d in range(num_devices):  # host side, once per baseline: not a hot path
        fill, count = np.zeros(pn), np.zeros(pn, np.int64)
        for j in np.argsort(-load[d], kind="stable"):
            c = int(np.argmin(np.where(count < g, fill, np.inf)))
            out[d, j] = c * g + count[c]
            fill[c] += load[d, j]
            count[c] += 1
    return out


def chunk_probs(slots_p, onehot_pn):
    """P_chunks [D, E_loc, C] of slot probabilities [D, E_loc, S] at the degree whose slot ->
    chunk matrix is onehot_pn [S, C] (`layer.chunk_matrix`)."""
    return jnp.einsum("djs,sc->djc", slots_p, onehot_pn)


def hard_probs(cfg) -> jax.Array:
    """One-hot P_chunks [D, E_loc, E_loc] of the config's hard assignment."""
    return jax.nn.one_hot(jnp.asarray(cfg.chunk_assignment), cfg.local_experts,
                          dtype=jnp.float32)


def group(x, probs):
    """Per-chunk sums [..., D, C] of per-expert values x [..., D, E_loc]."""
    return jnp.einsum("...dj,djc->...dc", x, probs)


def expected_demand(cfg, expert_ids, token_mask, scale, probs):
    """(tokens sent [C, D(src), D(dst)], rows [D, E_loc]) in real tokens under the chunk
    probabilities probs [D, E_loc, C] (module docstring); exact for a one-hot probs."""
    d, e_loc = cfg.num_devices, cfg.local_experts
    n_tok, k = expert_ids.shape
    valid = (expert_ids >= 0) & token_mask[:, None]
    ids = jnp.maximum(expert_ids, 0)
    p = probs.reshape(d * e_loc, -1)[ids] * valid[..., None]  # [N, K, C]
    dev = ids // e_loc
    owner = jnp.asarray(np.arange(n_tok) % d * d, jnp.int32)[:, None]
    same = [[(dev[:, a] == dev[:, b]) & valid[:, b] for b in range(k)] for a in range(k)]
    if cfg.resend:  # first of its (device, chunk) among the choices, in expectation
        w = []
        for a in range(k):
            keep = p[:, a]
            for b in range(a):
                keep = keep * (1.0 - jnp.where(same[a][b][:, None], p[:, b], 0.0))
            w.append(keep)
    else:  # send once per (token, device), with the earliest chunk: P(min chunk = c)
        cum = jnp.cumsum(p, -1)  # F_a(c)
        w = []
        for a in range(k):
            first = valid[:, a]
            for b in range(a):
                first = first & ~same[a][b]
            g = 1.0 - cum[:, a]
            for b in range(k):
                if b != a:
                    g = g * (1.0 - jnp.where(same[a][b][:, None], cum[:, b], 0.0))
            prev = jnp.concatenate([jnp.ones_like(g[:, :1]), g[:, :-1]], -1)
            w.append(jnp.where(first[:, None], prev - g, 0.0))
    w = jnp.stack(w, 1)  # [N, K, C]
    keys = jnp.where(valid, owner + dev, d * d)  # bin src * D + dst; invalid dropped
    sent = jax.ops.segment_sum(w.reshape(n_tok * k, -1), keys.reshape(-1), d * d)
    sent = sent.T.reshape(-1, d, d)
    rows = ops.bincount(jnp.where(valid, ids, -1), valid, d * e_loc)
    return sent * scale, rows.reshape(d, e_loc).astype(jnp.float32) * scale


def soft_ceil(x, tau, window: int = 4):
    """ceil(x) for x >= 0 at tau = 0; for tau > 0 the smooth staircase
    sum_{k >= 0} sigmoid((x - k) / tau) (each step of width ~tau, in units of x), summed
    over the `window` steps either side of x (the others are 0 or 1 to within
    sigmoid(-window / tau))."""
    t = jnp.maximum(tau, 1e-6)
    base = jax.lax.stop_gradient(jnp.floor(x)) - window
    k = base[..., None] + jnp.arange(2 * window + 1, dtype=jnp.float32)
    s = jnp.where(k >= 0, jax.nn.sigmoid((x[..., None] - k) / t), 0.0).sum(-1)
    soft = jnp.maximum(base, 0.0) + s
    return jnp.where(tau > 0, soft, jnp.ceil(x))
