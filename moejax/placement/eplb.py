"""DeepSeek's Expert Parallelism Load Balancer (EPLB) as a pure, jit / vmap-able function.

Source: deepseek-ai/EPLB `eplb.py` and its README (MIT; read, then written anew here for
JAX). The README: "we adopt a redundant experts strategy that duplicates heavy-loaded
experts. Then, we heuristically pack the duplicated experts to GPUs"; two policies:

- hierarchical ("when the number of server nodes divides the number of expert groups"):
  Step 1 packs expert groups onto nodes (`balanced_packing` of group loads), Step 2
  replicates experts within each node (`replicate_experts`), Step 3 packs the replicas onto
  the node's GPUs (`balanced_packing` of per-replica loads);
- global (otherwise): the same with one group and one node, i.e. replicate globally, then
  pack onto all GPUs (`rebalance_experts_hierarchical(weight, R, 1, 1, G)`, the published
  global branch since its "add gpu-level load balance for global policy" change).

`balanced_packing`: items by decreasing weight, each into the lightest pack that still has
room (every pack takes exactly n / m items); `replicate_experts`: each redundant slot goes
to the expert with the largest load per replica (weight / count). Ties resolve as in the
published code on CPU: sort ties in index order (stable), argmin / argmax to the first.
Arithmetic is float32 like the published code (`weight.float()`).

The greedy loops are `lax.scan`s over items (their order matters), vmapped over layers;
`moejax.placement.eplb_reference` is the plain-Python transcription the tests compare with.
Output: `phy2log [L, S]` (logical expert of each physical slot; slot s lives on device
s // (S / D)), `phyrank [L, S]` (replica index), `logcnt [L, E]` (replicas per expert).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from moejax.errors import ConfigError

MODES = ("auto", "hierarchical", "global")


def _pack_row(w, num_packs: int):
    """balanced_packing of one row w [n]: (pack index [n], rank in pack [n]), int32."""
    n = w.shape[0]
    per_pack = n // num_packs
    if per_pack == 1:
        return jnp.arange(n, dtype=jnp.int32), jnp.zeros(n, jnp.int32)
    order = jnp.argsort(-w, stable=True)

    def place(carry, item):
        pack_w, pack_n = carry
        p = jnp.argmin(jnp.where(pack_n < per_pack, pack_w, jnp.inf))
        return (pack_w.at[p].add(w[item]), pack_n.at[p].add(1)), (p, pack_n[p])

    init = (jnp.zeros(num_packs, w.dtype), jnp.zeros(num_packs, jnp.int32))
    _, (packs, ranks) = jax.lax.scan(place, init, order)
    pack_index = jnp.zeros(n, jnp.int32).at[order].set(packs.astype(jnp.int32))
    rank = jnp.zeros(n, jnp.int32).at[order].set(ranks)
    return pack_index, rank


def balanced_packing(weight, num_packs: int):
    """Pack the n items of each row of weight [X, n] into `num_packs` packs of exactly
    n / num_packs items, as balanced as the greedy allows: (pack_index, rank_in_pack) [X, n]."""
    return jax.vmap(lambda w: _pack_row(w, num_packs))(weight)


def _replicate_row(w, num_phy: int):
    num_log = w.shape[0]

    def add(cnt, _):
        e = jnp.argmax(w / cnt)
        return cnt.at[e].add(1), (e.astype(jnp.int32), cnt[e])

    cnt, (extra, extra_rank) = jax.lax.scan(add, jnp.ones(num_log, jnp.int32), None,
                                            length=num_phy - num_log)
    phy2log = jnp.concatenate([jnp.arange(num_log, dtype=jnp.int32), extra])
    rank = jnp.concatenate([jnp.zeros(num_log, jnp.int32), extra_rank])
    return phy2log, rank, cnt


def replicate_experts(weight, num_phy: int):
    """Replicate the num_log experts of each row of weight [X, num_log] into num_phy slots,
    minimizing the largest load per replica: (phy2log [X, num_phy], rank [X, num_phy],
    logcnt [X, num_log]). Slots 0..num_log-1 hold each expert once, the rest the copies."""
    return jax.vmap(lambda w: _replicate_row(w, num_phy))(weight)


def _inverse(perm):
    """Inverse of each row permutation of perm [X, n]."""
    return jnp.argsort(perm, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def rebalance_hierarchical(weight, num_phy: int, num_groups: int, num_nodes: int,
                           num_devices: int):
    """EPLB's hierarchical policy (Steps 1-3 above) on weight [L, E]: (phy2log [L, num_phy],
    phyrank [L, num_phy], logcnt [L, E]). Global = num_groups = num_nodes = 1."""
    num_layers, num_log = weight.shape
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    per_device = num_phy // num_devices
    log_per_node = num_log // num_nodes
    # Step 1: expert groups onto nodes
    group_w = weight.reshape(num_layers, num_groups, group_size).sum(-1)
    g_pack, g_rank = balanced_packing(group_w, num_nodes)
    log2mlog = (((g_pack * groups_per_node + g_rank) * group_size)[..., None]
                + jnp.arange(group_size, dtype=jnp.int32)).reshape(num_layers, num_log)
    mlog2log = _inverse(log2mlog)  # node-major ("meta-logical") order -> logical expert
    # Step 2: replicas within each node
    w_mlog = jnp.take_along_axis(weight, mlog2log, -1).reshape(-1, log_per_node)
    phy2mlog, phyrank, mlogcnt = replicate_experts(w_mlog, num_phy // num_nodes)
    # Step 3: replicas onto the node's devices
    w_phy = jnp.take_along_axis(w_mlog / mlogcnt, phy2mlog, -1)
    pack, rank = balanced_packing(w_phy, num_devices // num_nodes)
    pphy2phy = _inverse(pack * per_device + rank)
    pphy2mlog = jnp.take_along_axis(phy2mlog, pphy2phy, -1)
    offset = jnp.arange(0, num_log, log_per_node, dtype=jnp.int32)[None, :, None]
    pphy2mlog = (pphy2mlog.reshape(num_layers, num_nodes, -1) + offset).reshape(num_layers, -1)
    pphy2log = jnp.take_along_axis(mlog2log, pphy2mlog, -1)
    pphyrank = jnp.take_along_axis(phyrank, pphy2phy, -1).reshape(num_layers, -1)
    logcnt = jnp.take_along_axis(mlogcnt.reshape(num_layers, -1), log2mlog, -1)
    return pphy2log, pphyrank, logcnt


def resolve_mode(mode: str, num_groups: int, num_nodes: int) -> str:
    """'hierarchical' or 'global' for `mode` (auto: hierarchical iff nodes divide groups,
    the published rule); ConfigError for an unknown mode or a hierarchical one that does
    not fit."""
    if mode not in MODES:
        raise ConfigError(f"eplb_mode = {mode!r}; allowed: {', '.join(MODES)}")
    divides = num_groups % num_nodes == 0
    if mode == "auto":
        return "hierarchical" if divides else "global"
    if mode == "hierarchical" and not divides:
        raise ConfigError(f"eplb_mode = 'hierarchical' needs num_nodes ({num_nodes}) to divide "
                          f"num_groups ({num_groups}); allowed: a multiple of {num_nodes}, or "
                          "eplb_mode = 'global' / 'auto'")
    return mode


def check_shapes(num_experts: int, num_phy: int, num_groups: int, num_nodes: int,
                 num_devices: int, mode: str) -> str:
    """Validate EPLB's divisibility rules (ConfigError naming the value); the resolved mode."""
    mode = resolve_mode(mode, num_groups, num_nodes)
    groups, nodes = (num_groups, num_nodes) if mode == "hierarchical" else (1, 1)
    rules = [
        (num_groups >= 1 and num_experts % num_groups == 0,
         f"num_groups = {num_groups} must divide the {num_experts} experts"),
        (num_devices % nodes == 0, f"{nodes} nodes must divide the {num_devices} devices"),
        (num_phy % num_devices == 0, f"{num_phy} slots must be a multiple of the "
                                     f"{num_devices} devices"),
        (num_phy >= num_experts, f"{num_phy} slots cannot hold the {num_experts} experts"),
        (num_experts % groups == 0 and groups % nodes == 0, f"num_groups = {groups} and "
                                                            f"num_nodes = {nodes} do not nest"),
    ]
    for ok, msg in rules:
        if not ok:
            raise ConfigError(f"eplb: {msg}")
    return mode


def rebalance(weight, num_phy: int, num_groups: int, num_nodes: int, num_devices: int,
              mode: str = "auto"):
    """EPLB's `rebalance_experts`: (phy2log [L, num_phy], phyrank [L, num_phy], logcnt [L, E])
    from load statistics weight [L, E] (tokens per expert, e.g. a moving average).

    Static: the counts and `mode` ('auto' = the published rule, 'hierarchical', 'global');
    traced: `weight` (so a rebalancing system can re-plan inside `lax.scan`).
    """
    w = jnp.asarray(weight, jnp.float32)
    mode = check_shapes(w.shape[-1], num_phy, num_groups, num_nodes, num_devices, mode)
    if mode == "hierarchical":
        return rebalance_hierarchical(w, num_phy, num_groups, num_nodes, num_devices)
    return rebalance_hierarchical(w, num_phy, 1, 1, num_devices)
