"""What `moejax tune --system ep` tunes in synchronous EP (`moejax.systems.ep`), and EP's
registry entry (beside its tuning target, since the entry names both and `ep` is one module).

`placement` (one device per expert) or `replicas` (experts replicated into slots, with
learned token shares), optionally one per trace layer; the expected-cost relaxation
`expected` reads a placement as a distribution over devices.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from moejax import relax
from moejax import tunable as fam
from moejax.errors import ConfigError
from moejax.physics import collectives
from moejax.physics.roofline import device_compute_s, device_memory_s
from moejax.placement import eplb, slots
from moejax.system import SystemEntry, TuneSetup, Tuning
from moejax.systems import ep


def setup(platform, model, policy, num_iterations, names, capacity=0,
          num_layers=0) -> TuneSetup:
    """Synchronous EP (moejax.systems.ep). `placement`: one device per expert (no replicas,
    the policy format's `placement = [device id per expert]`), at most `capacity` experts
    per device (default: ceil(E / D), the memory EP sizes each device for). `replicas`
    (`params.ReplicaPlacement`): experts replicated into `capacity` slots per device
    (default ceil(E / D) + 1: one redundant slot, DeepSeek-V3's prefill deployment) with
    learned token shares; exported as replica device lists and `replica_shares`.
    `num_layers` > 0: one placement per trace layer (as EPLB plans them). Baselines:
    contiguous, round-robin, greedy (per layer when per-layer) and, for replicas, EPLB
    (`moejax.placement.eplb`, global) at the same slot budget."""
    if {"placement", "replicas"} <= set(names):
        raise ConfigError("param: placement and replicas are alternatives; tune one")
    system, base = ep.from_policy(platform, model, policy.options_table(), num_iterations)
    e, d = model.num_experts, platform.num_devices
    cap = capacity or -(-e // d)
    rep_slots = capacity or slots.slots_per_device(e, d, 1)
    families = {"placement": fam.Placement(e, d, cap, num_layers=num_layers),
                "replicas": fam.ReplicaPlacement(e, d, rep_slots, num_layers=num_layers)}
    default_ids = np.asarray(base.placement).argmax(-1)
    if num_layers:
        default_ids = np.broadcast_to(default_ids, (num_layers, e))
    lead = (num_layers,) if num_layers else ()

    def apply(base, values, tau):
        v = values.get("replicas", values.get("placement", base.placement))
        return base.replace(placement=v["shares"] if isinstance(v, dict) else v,
                            tau=jnp.asarray(tau, jnp.float32))

    def per_layer(load):
        load = np.asarray(load, np.float64)
        return np.broadcast_to(load, (*lead, e)) if load.ndim == 1 else load

    def baselines(load_e):
        load = per_layer(load_e)
        greedy = (np.stack([fam.greedy_balanced_ids(x, d, cap) for x in load]) if num_layers
                  else fam.greedy_balanced_ids(load, d, cap))
        ids = {"contiguous": np.broadcast_to(fam.contiguous_ids(e, d), (*lead, e)),
               "round-robin": np.broadcast_to(fam.round_robin_ids(e, d), (*lead, e)),
               "greedy-balanced": greedy}
        if "replicas" not in names:
            return {k: {"placement": v} for k, v in ids.items()}
        out = {k: {"replicas": np.eye(d)[v]} for k, v in ids.items()}
        w = load.reshape(-1, e)
        phy2log, _, _ = eplb.rebalance(w, rep_slots * d, 1, 1, d, "global")
        out[f"eplb ({rep_slots} slots)"] = {"replicas": np.asarray(
            slots.layout_shares(phy2log, e, d)).reshape(*lead, e, d)}
        return out

    def options(hard):
        if "placement" in hard:
            return {"placement": np.asarray(hard["placement"]).tolist()}
        p = np.asarray(hard["replicas"])

        def lists(q):  # [E, D] -> replica device lists and their shares
            devs = [np.flatnonzero(row > 0).tolist() for row in q]
            return devs, [[float(row[x]) for x in ds] for row, ds in zip(q, devs, strict=True)]

        pairs = [lists(q) for q in p] if num_layers else [lists(p)]
        devs, shares = [x[0] for x in pairs], [x[1] for x in pairs]
        return ({"placement": devs, "replica_shares": shares} if num_layers
                else {"placement": devs[0], "replica_shares": shares[0]})

    opts = {k: v for k, v in dict(policy.options).items()
            if k in ("attention", "tp_size", "context_len")}
    cfg = ep.make_config(platform, model, **opts)
    defaults = {"placement": default_ids, "replicas": np.eye(d)[default_ids]}
    return TuneSetup(system, base, {k: families[k] for k in names}, apply,
                 {k: defaults[k] for k in names}, baselines, options,
                 functools.partial(expected, cfg, base), layer_loads=bool(num_layers))


def expected(cfg, base, values, traces, tau):
    """Mean MoE-layer latency per trace [T] of synchronous EP, the placement [(L,) E, D] read
    as a distribution over devices (each expert on one device; rows are probabilities).

    EP's own relaxed mode reads a fractional placement as replicas that split an expert's
    tokens (each replica pays a weight load), which makes any spread cost more than a move
    and pins a tuned placement to its start. Here device d's expert time is the expectation
    sum_e P[e, d] * w_e, with w_e = EP's hard time of expert e with all its tokens
    (`ep.expert_time_s` on a diagonal), and the dispatch / combine traffic is EP's own
    (`ep.layer_demand`, linear in P); the slowest device and the all-to-all use EP's rules
    at temperature tau. For a one-hot P this equals `ep.moe_layer` in hard mode (tested).

    Replicas (`values["replicas"]`, a `ReplicaPlacement` value): device d runs
    sum_e Y[e, d] max(compute(n_e r[e, d]), positive(n_e r[e, d]) * weight load), each of
    its (relaxed) replicas with its share of the tokens and its own weight load, the
    traffic from the shares P; for a 0/1 occupancy this is `ep.moe_layer` in hard mode.
    """
    rep = values.get("replicas")
    place = rep["shares"] if rep is not None else values["placement"]
    tau = jnp.asarray(tau, jnp.float32)
    tau_s = tau * ep.time_scale_s(cfg)
    m, dev = cfg.model, cfg.platform.device

    def busy_of(counts, p, occ, per):
        if occ is None:
            w_e, _ = ep.expert_time_s(cfg, jnp.diag(counts), 0.0)  # [E] hard, all tokens
            return p.T @ w_e
        tok = counts[:, None] * per  # [E, D] tokens of one replica
        comp = device_compute_s(tok * m.expert_flops_per_token, dev, cfg.dtype, "grouped")
        mem = device_memory_s(relax.positive(tok, tau) * m.expert_weight_bytes, dev)
        return (occ * relax.maximum(comp, mem, tau_s)).sum(0)

    def layer(ids, mask, counts, p, occ, per):
        params = base.replace(placement=p, tau=tau)
        traffic, _ = ep.layer_demand(cfg, params, ids, mask, counts)
        n_tok = counts.sum() / cfg.model.top_k
        t_sh, _ = ep.shared_time_s(cfg, ep.owned_tokens(cfg, mask, n_tok), tau_s)
        busy = busy_of(counts, p, occ, per) + t_sh
        return (collectives.all_to_all_time_s(traffic, cfg.topo, tau_s)
                + relax.max(busy, tau_s)
                + collectives.all_to_all_time_s(traffic.T, cfg.topo, tau_s))

    occ = None if rep is None else rep["occupancy"]
    per = None if rep is None else rep["per_replica"]
    by_layer = place.ndim == 3

    def one_trace(tr):
        def iteration(ids, mask, counts):  # [L, N, K], [N], [L, E]
            if by_layer:
                lat = jax.vmap(lambda i, c, p, o, r: layer(i, mask, c, p, o, r))(
                    ids, counts, place, occ, per) if occ is not None else jax.vmap(
                    lambda i, c, p: layer(i, mask, c, p, None, None))(ids, counts, place)
            else:
                lat = jax.vmap(lambda i, c: layer(i, mask, c, place, occ, per))(ids, counts)
            return lat.mean(), (counts[0].sum() > 0).astype(jnp.float32)

        lat, real = jax.vmap(iteration)(tr.expert_ids, tr.token_mask, tr.counts)
        return (lat * real).sum() / jnp.maximum(real.sum(), 1.0)

    return jax.vmap(one_trace)(traces)


ENTRY = SystemEntry(
    "ep", "synchronous expert parallelism, the barrier-style baseline of every paper",
    ep.from_policy, ep.check_options, ("chiplet", "wafer", "gpu"),
    tuning=Tuning(("placement", "replicas"), setup, per_layer=True,
                  help="placement, or replicas (experts replicated into --capacity slots per "
                  "device, default E/D + 1, with learned token shares)"),
    default_policy="ep")
