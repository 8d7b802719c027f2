"""Shadow-slot expert balancers (001 §V-B, §V-C): none, greedy EPLB, topology-aware Alg. 1.

Devices reserve `slots` shadow slots beyond their native experts (001 §III-C, Fig. 7(a));
a balancer fills them with replicas of popular experts, and a replicated expert's tokens
split evenly over its hosts (`Load_e / Num_e`). Each planning starts from the native
placement (Algorithm 1 line 1: Num <- {1}) and adds one replica per step until it stops:

- greedy (EPLB [6], 001 §V-C "prior works"): copy the globally hottest expert (largest
  `Load_e / Num_e`) to the coldest device that has a free slot;
- topology (001 Algorithm 1): take the most popular expert on the highest-Heat device;
  the cold set is every device with a free slot "whose Heat_d would not exceed the current
  maximum after hosting this expert" (§V-C prose), i.e. `Heat_d + Load_src / (Num_src + 1)
  < Heat_hottest`; copy to the topologically nearest of them (line 6), measured from the
  expert's native device, which is where the weights are copied from. (Line 4 read
  literally, `Heat_d < Heat_hottest - Load_src / Num_src`, never replicates the expert of a
  device that hosts only that expert, i.e. never balances at E/D = 1; we follow the prose.)

Both stop when the cold set is empty (line 5). The JAX version is a fixed-length
`lax.scan` with a done flag (one step per shadow slot in the system), vmappable over
layers and traces; `plan_reference` is the same rules in plain Python for tests.

Eq. 2 (`eq2_trigger`): balance when the summed layer imbalance exceeds alpha and the time
since the last migration exceeds beta (beta = 0 for the non-invasive balancer).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from moejax import relax

BALANCERS = ("none", "greedy", "topology")


def plan(load, native, slots: int, hops, kind: str):
    """Host matrix [E, D] (native + replicas, 0/1) planned from expert loads `load` [E].

    native [E, D] one-hot native placement; slots: shadow slots per device (static int);
    hops [D, D] distance used by the topology-aware rule; kind: "greedy" or "topology".
    """
    e, d = native.shape
    native = native.astype(jnp.float32)
    load = load.astype(jnp.float32)
    home = jnp.argmax(native, axis=1)  # [E] native device of each expert
    dist = jnp.asarray(hops, jnp.float32)[home]  # [E, D] hops from e's native device
    idx_d = jnp.arange(d)

    def step(carry, _):
        host, free, done = carry
        num = host.sum(1)
        per_copy = load / num  # Load_e / Num_e
        heat = per_copy @ host  # [D] Heat_d
        if kind == "greedy":
            src = jnp.argmax(per_copy)
            top = jnp.max(heat)
        else:
            hottest = jnp.argmax(heat)  # Alg. 1 line 3
            src = jnp.argmax(jnp.where(host[:, hottest] > 0, per_copy, -jnp.inf))
            top = heat[hottest]
        share = load[src] / (num[src] + 1.0)  # per-copy load once the replica is added
        cold = (heat + share < top) & (free > 0) & (host[src] == 0)  # line 4 (see module doc)
        stop = done | ~jnp.any(cold)  # line 5
        if kind == "greedy":
            des = jnp.argmin(jnp.where(cold, heat, jnp.inf))  # coldest device
        else:
            des = jnp.argmin(jnp.where(cold, dist[src], jnp.inf))  # line 6: nearest
        add = jnp.where(stop, 0.0, 1.0)
        host = host.at[src, des].add(add)  # line 7, 8: copy, Num_src += 1
        free = free - add * (idx_d == des)
        return (host, free, stop), None

    carry = (native, jnp.full((d,), float(slots)), jnp.asarray(False))
    if slots == 0:
        return native
    (host, _, _), _ = jax.lax.scan(step, carry, None, length=d * slots)
    return host


def plan_reference(load, native, slots: int, hops, kind: str) -> np.ndarray:
    """Plain-Python Algorithm 1 / greedy (same rules as `plan`), float32 arithmetic."""
    load = np.asarray(load, np.float32)
    native = np.asarray(native, np.float32)
    hops = np.asarray(hops)
    e, d = native.shape
    home = [int(np.argmax(native[i])) for i in range(e)]
    host = [[native[i, j] > 0 for j in range(d)] for i in range(e)]
    free = [slots] * d
    while True:
        num = [sum(host[i]) for i in range(e)]
        per_copy = [np.float32(load[i] / np.float32(num[i])) for i in range(e)]
        heat = [np.float32(sum(per_copy[i] for i in range(e) if host[i][j])) for j in range(d)]
        if kind == "greedy":
            src = max(range(e), key=lambda i: (per_copy[i], -i))
            top = max(heat)
        else:
            hottest = max(range(d), key=lambda j: (heat[j], -j))
            src = max((i for i in range(e) if host[i][hottest]),
                      key=lambda i: (per_copy[i], -i))
            top = heat[hottest]
        share = np.float32(load[src] / np.float32(num[src] + 1))
        cold = [j for j in range(d)
                if heat[j] + share < top and free[j] > 0 and not host[src][j]]
        if not cold:
            break
        if kind == "greedy":
            des = min(cold, key=lambda j: (heat[j], j))
        else:
            des = min(cold, key=lambda j: (hops[home[src], j], j))
        host[src][des] = True
        free[des] -= 1
    return np.array(host, np.float32)


def layer_imbalance(device_load):
    """001 Eq. 2 layer term: (max(load) - mean(load)) / mean(load), over the last axis [D]."""
    mean = jnp.maximum(device_load.mean(-1), 1e-30)
    return (device_load.max(-1) - mean) / mean


def eq2_trigger(device_load, since_migration, alpha, beta):
    """001 Eq. 2: sum_i imbalance_i > alpha and dt_mig > beta. device_load [L, D]."""
    return (layer_imbalance(device_load).sum() > alpha) & (since_migration > beta)


def eq2_gate(device_load, since_migration, alpha, beta, tau=0.0, tau_since=None):
    """001 Eq. 2 as a gate in [0, 1] for tuning alpha (moejax.tune): relax.step of both
    comparisons, multiplied; equals `eq2_trigger` (as float) at tau = 0.

    tau_since: temperature of the dt_mig > beta comparison (None: tau). The wafer step
    passes 0: dt_mig counts iterations, and a sigmoid at dt_mig = beta (0 right after a
    migration, beta = 0 when non-invasive) stays 1/2 for every tau, so relaxed would not
    tend to hard as tau -> 0."""
    tau_since = tau if tau_since is None else tau_since
    return (relax.step(layer_imbalance(device_load).sum() - alpha, tau)
            * relax.step(jnp.asarray(since_migration) - beta, tau_since))
