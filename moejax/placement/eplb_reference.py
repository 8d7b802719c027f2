"""Plain-Python EPLB (loops over layers, items, slots), written from the published
algorithm's description (deepseek-ai/EPLB README and `eplb.py`), for tests of
`moejax.placement.eplb`. float32 arithmetic, as the published code (`weight.float()`).
"""

from __future__ import annotations

import numpy as np


def balanced_packing(weight, num_packs: int):
    """(pack_index, rank_in_pack) [X, n]: items by decreasing weight (ties by index) into the
    lightest pack (lowest index on ties) that holds fewer than n / num_packs items."""
    weight = np.asarray(weight, np.float32)
    rows, n = weight.shape
    per_pack = n // num_packs
    pack_index = np.zeros((rows, n), np.int64)
    rank = np.zeros((rows, n), np.int64)
    if per_pack == 1:
        pack_index[:] = np.arange(n)
        return pack_index, rank
    for i in range(rows):
        loads = [np.float32(0.0)] * num_packs
        items = [0] * num_packs
        for item in sorted(range(n), key=lambda j, i=i: -weight[i, j]):  # stable
            open_packs = [p for p in range(num_packs) if items[p] < per_pack]
            p = min(open_packs, key=lambda q: loads[q])
            pack_index[i, item] = p
            rank[i, item] = items[p]
            loads[p] = np.float32(loads[p] + weight[i, item])
            items[p] += 1
    return pack_index, rank


def replicate_experts(weight, num_phy: int):
    """(phy2log, rank [X, num_phy], logcnt [X, num_log]): each extra slot to the expert with
    the largest weight per replica (lowest index on ties)."""
    weight = np.asarray(weight, np.float32)
    rows, num_log = weight.shape
    phy2log = np.tile(np.arange(num_phy), (rows, 1))
    rank = np.zeros((rows, num_phy), np.int64)
    logcnt = np.ones((rows, num_log), np.int64)
    for i in range(rows):
        for slot in range(num_log, num_phy):
            per_replica = [np.float32(weight[i, e] / np.float32(logcnt[i, e]))
                           for e in range(num_log)]
            e = max(range(num_log), key=lambda x: (per_replica[x], -x))
            phy2log[i, slot] = e
            rank[i, slot] = logcnt[i, e]
            logcnt[i, e] += 1
    return phy2log, rank, logcnt


def rebalance(weight, num_phy: int, num_groups: int, num_nodes: int, num_devices: int,
              mode: str = "auto"):
    """(phy2log, phyrank, logcnt) of EPLB, hierarchical when `mode` says so (auto: when the
    nodes divide the groups), else global (one group, one node)."""
    weight = np.asarray(weight, np.float32)
    hierarchical = mode == "hierarchical" or (mode == "auto" and num_groups % num_nodes == 0)
    if not hierarchical:
        num_groups = num_nodes = 1
    layers, num_log = weight.shape
    group_size = num_log // num_groups
    per_node_groups = num_groups // num_nodes
    per_node_log = num_log // num_nodes
    per_node_phy = num_phy // num_nodes
    per_device = num_phy // num_devices
    devices_per_node = num_devices // num_nodes
    phy2log = np.zeros((layers, num_phy), np.int64)
    phyrank = np.zeros((layers, num_phy), np.int64)
    logcnt = np.zeros((layers, num_log), np.int64)
    for layer in range(layers):
        w = weight[layer]
        # Step 1: groups onto nodes; node n's experts, in (rank of group, index in group) order
        group_w = w.reshape(num_groups, group_size).sum(-1, dtype=np.float32)[None]
        g_pack, g_rank = balanced_packing(group_w, num_nodes)
        node_experts = [[] for _ in range(num_nodes)]
        for g in sorted(range(num_groups), key=lambda g: (g_pack[0, g], g_rank[0, g])):
            node_experts[g_pack[0, g]] += list(range(g * group_size, (g + 1) * group_size))
        for node in range(num_nodes):
            experts = node_experts[node]
            assert len(experts) == per_node_groups * group_size == per_node_log
            # Step 2: replicas within the node
            local = np.array([w[e] for e in experts], np.float32)[None]
            p2l, rank, cnt = replicate_experts(local, per_node_phy)
            # Step 3: replicas onto the node's devices
            per_replica = np.array([local[0, p2l[0, s]] / np.float32(cnt[0, p2l[0, s]])
                                    for s in range(per_node_phy)], np.float32)[None]
            pack, pos = balanced_packing(per_replica, devices_per_node)
            for s in range(per_node_phy):
                slot = node * per_node_phy + pack[0, s] * per_device + pos[0, s]
                phy2log[layer, slot] = experts[p2l[0, s]]
                phyrank[layer, slot] = rank[0, s]
            for j, e in enumerate(experts):
                logcnt[layer, e] = cnt[0, j]
    return phy2log, phyrank, logcnt
