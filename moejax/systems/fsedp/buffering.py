"""Token buffering, Algorithm 2 of 000 §V-A (per-request deferral at MoE layer boundaries).

Requests: the N token slots of an iteration are split into `num_requests` contiguous groups
(request r holds slots [r N / R, (r + 1) N / R)). Per request the QoS timer T_QoS(r) and the
forward-pass counter C_fw(r) follow Algorithm 2: every N_threshold = 1 / slack completed
passes grant one deferral (lines 2-5); at layer l, after gating, a request whose activated
experts include one with fewer than theta_min tokens (over all active requests) and whose
timer is positive is paused (lines 6-9). A paused request resumes from the same layer in the
next iteration with its activations and gating unchanged (its new tokens wait until its
pass is complete).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax.systems.fsedp.config import FSEDPConfig
from moejax.systems.fsedp.layer import token_owner


def request_of(num_tokens: int, num_requests: int) -> np.ndarray:
    """int [N]: request owning token slot n (contiguous groups)."""
    return np.arange(num_tokens) * num_requests // max(num_tokens, 1)


def tokens_per_request(cfg: FSEDPConfig, expert_ids, token_mask):
    """[R, L, D, E] tokens of request r on die d routed to expert e at layer l; and [R] sizes.

    expert_ids [L, N, K], token_mask [N].
    """
    n = expert_ids.shape[-2]
    d, e, r = cfg.num_devices, cfg.model.num_experts, cfg.num_requests
    owner = jax.nn.one_hot(token_owner(n, d), d)  # [N, D]
    req = jax.nn.one_hot(request_of(n, r), r) * token_mask[:, None]  # [N, R]
    routed = jax.nn.one_hot(expert_ids, e).sum(-2)  # [L, N, E]
    return jnp.einsum("nr,nd,lne->rlde", req, owner, routed), req.sum(0)


@struct.dataclass
class BufferState:
    """Per-request state of Algorithm 2 (axes [R] requests, [L] layers, [D], [E])."""

    qos: jax.Array  # int [R] T_QoS(r)
    cfw: jax.Array  # int [R] C_fw(r)
    resume: jax.Array  # int [R] 1 + layer the paused pass resumes from (0: fresh pass)
    carry: jax.Array  # [R, L, D, E] tokens of the paused pass
    carry_tokens: jax.Array  # [R] tokens of the paused pass


def init_state(cfg: FSEDPConfig, num_layers: int) -> BufferState:
    r, d, e = cfg.num_requests, cfg.num_devices, cfg.model.num_experts
    zi = jnp.zeros(r, jnp.int32)
    return BufferState(zi, zi, zi, jnp.zeros((r, num_layers, d, e)), jnp.zeros(r))


def plan_iteration(cfg: FSEDPConfig, bs: BufferState, tok_r, size_r, enabled: bool):
    """Which tokens each layer runs this iteration, and the next buffer state.

    tok_r [R, L, D, E], size_r [R] (this iteration's fresh passes).
    Returns tok_l [L, D, E] (tokens computed per layer), completed tokens (scalar),
    deferrals (scalar), new state.
    """
    n_l = tok_r.shape[1]
    resuming = bs.resume > 0
    pass_tok = jnp.where(resuming[:, None, None, None], bs.carry, tok_r)
    pass_size = jnp.where(resuming, bs.carry_tokens, size_r)
    # Algorithm 2 lines 2-5: a granted buffering opportunity every N_threshold passes
    grant = bs.cfw >= cfg.n_threshold
    qos = bs.qos + grant.astype(jnp.int32)
    cfw = jnp.where(grant, 0, bs.cfw)

    def layer(carry, l):
        qos, paused, pause_at = carry
        in_pass = (l >= jnp.maximum(bs.resume - 1, 0)) & ~paused & (pass_size > 0)
        tl = pass_tok[:, l]  # [R, D, E]
        n_e = jnp.einsum("r,rde->e", in_pass.astype(jnp.float32), tl)
        uses = tl.sum(1) > 0  # [R, E]
        cold = jnp.any(uses & (n_e[None, :] < cfg.theta_min), axis=-1)
        defer = in_pass & cold & (qos > 0) & enabled  # lines 6-9
        qos = qos - defer.astype(jnp.int32)
        run = in_pass & ~defer
        pause_at = jnp.where(defer, l, pause_at)
        return (qos, paused | defer, pause_at), jnp.einsum("r,rde->de", run.astype(jnp.float32),
                                                           tl)

    r = tok_r.shape[0]
    (qos, paused, pause_at), tok_l = jax.lax.scan(
        layer, (qos, jnp.zeros(r, bool), jnp.zeros(r, jnp.int32)), jnp.arange(n_l))
    completed = ~paused & (pass_size > 0)
    new = BufferState(
        qos=qos,
        cfw=cfw + completed.astype(jnp.int32),
        resume=jnp.where(paused, pause_at + 1, 0).astype(jnp.int32),
        carry=jnp.where(paused[:, None, None, None], pass_tok, 0.0),
        carry_tokens=jnp.where(paused, pass_size, 0.0),
    )
    return tok_l, (completed * pass_size).sum(), paused.sum(), new
