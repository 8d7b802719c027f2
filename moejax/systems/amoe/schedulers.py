"""Layer schedulers of one AMoE runtime (002 §3.4): which μ-queue a free GPU drains next.

Each takes the ready-token counts `Q [NB, U]` of every (block, unit) queue (units are the
attention DP ranks then the experts), the mask `on [U]` of units hosted by this GPU, and
returns (block, unit). Ties go to the lowest flat index (block-major).
"""

from __future__ import annotations

import jax.numpy as jnp


def most_tokens_first(q):
    """MTFS (§3.4 first strawman): the queue holding the most tokens."""
    return q.astype(jnp.float32)


def defrag_scores(q, num_local, decay, lookahead: int):
    """Algorithm 1 (§3.4, defragging scheduler): Scores[b, e] = LScore[b] + Q[b][e] if Q > 0.

    LScore[b] = sum_{k=1..K} (TotalTokens[(b + k) mod N_B] / N_E) * delta^k, where
    TotalTokens sums this GPU's queues of block b' and N_E is the number of local queues
    per block. The sum runs k = 1..K in order with delta^k by repeated multiplication, the
    float32 order the plain reference uses.
    """
    total = q.sum(1).astype(jnp.float32)  # [NB]
    n_e = jnp.asarray(num_local, jnp.float32)
    lscore = jnp.zeros_like(total)
    dk = jnp.float32(1.0)
    for k in range(1, lookahead + 1):  # K is static (lookahead depth)
        dk = dk * decay
        lscore = lscore + (jnp.roll(total, -k) / n_e) * dk
    return jnp.where(q > 0, lscore[:, None] + q.astype(jnp.float32), 0.0)


def select(kind: str, q, on, decay, lookahead: int):
    """(block, unit) int32 scalars chosen by scheduler `kind` (defrag | mtfs | flfs)."""
    nb, nu = q.shape
    qm = jnp.where(on[None, :], q, 0)
    if kind == "flfs":
        # §3.4 second strawman: the lowest block with any ready token, its fullest queue
        b = jnp.argmax(qm.sum(1) > 0).astype(jnp.int32)
        return b, jnp.argmax(qm[b]).astype(jnp.int32)
    if kind == "mtfs":
        score = most_tokens_first(qm)
    else:
        score = defrag_scores(qm, on.sum(), decay, lookahead)
    flat = jnp.argmax(score.reshape(-1)).astype(jnp.int32)
    return flat // nu, flat % nu
