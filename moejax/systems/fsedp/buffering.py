"""Token buffering, Algorithm 2 of 000 §V-A (per-request deferral at MoE layer boundaries).

Requests: the N token slots of an iteration are split into `num_requests` contiguous groups
(request r holds slots [r N / R, (r + 1) N / R)). Per request the QoS timer T_QoS(r) and the
forward-pass counter C_fw(r) follow Algorithm 2: every N_threshold = 1 / slack completed
passes grant one deferral (lines 2-5); at layer l, after gating, a request whose activated
experts include one with fewer than theta_min tokens (over all active requests) and whose
timer is positive is paused (lines 6-9). A paused request resumes from the same layer in the
next iteration with its activations and gating unchanged. With `cfg.refill` (default) the
freed slot is refilled: the iteration also runs a fresh pass in that slot from layer 0 (a
queued request takes it, so tokens per iteration stay constant, and the resumed tokens batch
with the fresh ones on the cold experts, §V-A); a slot holds one paused pass, so a request
resuming one does not defer again in that iteration. Without refill (the earlier reading) the
request's new tokens wait until its paused pass is complete.

Relaxed mode (moejax.tune): theta_min and slack may come from `FSEDPParams` (traced) and,
with `tau > 0`, every decision of Algorithm 2 is smooth, through `moejax.relax`:
"some activated expert has fewer than theta_min tokens" is step(theta_min - min_e n_e)
with a soft min over the used experts; the N_threshold test is step(C_fw - N + 1/2) with
N = 1 / slack unrounded; the timer test is clip(T_QoS, 0, 1). A request is then a mass in
[0, 1]: a fraction of it is deferred at a layer, resumes from there in the next iteration,
and the rest completes; the tokens a layer computes are the mass-weighted tokens. State is
float, and at `tau = 0` (masses 0 / 1) it is exactly the hard algorithm.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from moejax import relax
from moejax.systems.fsedp.config import FSEDPConfig
from moejax.systems.fsedp.layer import token_owner

_NO_EXPERT = 1e6  # token count standing in for "no used expert" in the min over experts


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
    """Per-request state of Algorithm 2 (axes [R] requests, [L] layers, [D], [E]); float so
    that the relaxed mode can hold fractions (integers in hard mode)."""

    qos: jax.Array  # [R] T_QoS(r)
    cfw: jax.Array  # [R] C_fw(r)
    paused_at: jax.Array  # [R, L] mass of the paused pass resuming at layer l (one-hot / 0)
    carry: jax.Array  # [R, L, D, E] tokens of the paused pass
    carry_tokens: jax.Array  # [R] tokens of the paused pass


def init_state(cfg: FSEDPConfig, num_layers: int) -> BufferState:
    r, d, e = cfg.num_requests, cfg.num_devices, cfg.model.num_experts
    z = jnp.zeros(r)
    return BufferState(z, z, jnp.zeros((r, num_layers)), jnp.zeros((r, num_layers, d, e)), z)


def knobs(cfg: FSEDPConfig, params=None):
    """(theta_min, slack, tau): from `params` (FSEDPParams) where it carries them, else the
    static config (tau 0). A Python-number tau stays one (relax picks its branch statically)."""
    theta = getattr(params, "theta_min", None)
    slack = getattr(params, "slack", None)
    tau = getattr(params, "tau", None)
    return (jnp.float32(cfg.theta_min) if theta is None else jnp.asarray(theta),
            jnp.float32(cfg.slack) if slack is None else jnp.asarray(slack),
            0.0 if tau is None else tau if isinstance(tau, (int, float)) else jnp.asarray(tau))


def n_threshold(slack, tau):
    """Algorithm 2 N_threshold = 1 / slack: max(1, round(1 / slack)) in hard mode, the
    unrounded max(1, 1 / slack) for tau > 0 (relax.round)."""
    return jnp.maximum(relax.round(1.0 / jnp.maximum(slack, 1e-6), tau), 1.0)


def plan_iteration(cfg: FSEDPConfig, bs: BufferState, tok_r, size_r, enabled: bool,
                   params=None):
    """Which tokens each layer runs this iteration, and the next buffer state.

    tok_r [R, L, D, E], size_r [R] (this iteration's fresh passes). params: FSEDPParams
    (theta_min, slack, tau read through `knobs`; None = the config's, hard).
    Returns tok_l [L, D, E] (tokens computed per layer), completed tokens (scalar),
    deferrals (scalar; a mass in relaxed mode), new state.
    """
    theta, slack, tau = knobs(cfg, params)
    paused = bs.paused_at.sum(-1)  # [R] mass of the request that resumes a paused pass
    # mass running a fresh pass from layer 0 (refill: the slot always runs one)
    fresh0 = (1.0 if cfg.refill else 1.0 - paused) * (size_r > 0)
    may_defer = (1.0 - paused) if cfg.refill else 1.0  # one paused pass per slot
    mix = fresh0[:, None, None, None] * tok_r + paused[:, None, None, None] * bs.carry
    uses_all = mix.sum(2) > 0  # [R, L, E]: experts the pass activates (trace-given)
    # Algorithm 2 lines 2-5: a granted buffering opportunity every N_threshold passes
    grant = relax.step(bs.cfw - n_threshold(slack, tau) + 0.5, tau)
    qos = bs.qos + grant
    cfw = (1.0 - grant) * bs.cfw

    def layer(carry, l):
        qos, f, g, qf, qg = carry  # live fresh / resumed mass; deferred fresh / resumed
        g = g + bs.paused_at[:, l]  # a paused pass re-enters at the layer it stopped at
        tf, tg = tok_r[:, l], bs.carry[:, l]  # [R, D, E]
        live_tok = f[:, None, None] * tf + g[:, None, None] * tg
        n_e = live_tok.sum((0, 1))  # [E] tokens of expert e over all live requests
        uses = uses_all[:, l] & ((f + g) > 0)[:, None]
        n_min = relax.min(jnp.where(uses, n_e[None, :], _NO_EXPERT), tau)  # [R]
        cold = relax.step(theta - n_min, tau) * uses.any(-1)  # lines 6-7
        frac = cold * jnp.clip(qos, 0.0, 1.0) * enabled * may_defer  # line 8: a timer left
        df, dg = f * frac, g * frac  # lines 8-9: defer this part of the request
        qos = qos - (df + dg)
        f, g = f - df, g - dg
        run = f[:, None, None] * tf + g[:, None, None] * tg
        return (qos, f, g, qf + df, qg + dg), (run.sum(0), df + dg)

    r, n_l = tok_r.shape[:2]
    z = jnp.zeros(r)
    (qos, f, g, qf, qg), (tok_l, deferred) = jax.lax.scan(
        layer, (qos, fresh0, z, z, z), jnp.arange(n_l))
    new_paused = deferred.T  # [R, L]
    p = qf + qg
    safe = jnp.maximum(p, 1e-6)  # exact for p in {0, 1}; no 1 / p^2 blow-up in gradients
    w_f, w_g = (qf / safe)[:, None, None, None], (qg / safe)[:, None, None, None]
    done = f * size_r + g * bs.carry_tokens  # completed passes' tokens, [R]
    new = BufferState(
        qos=qos,
        cfw=cfw + f + g,
        paused_at=new_paused,
        carry=w_f * tok_r + w_g * bs.carry,
        carry_tokens=(qf * size_r + qg * bs.carry_tokens) / safe,
    )
    return tok_l, done.sum(), p.sum(), new
