"""EPLB (moejax.placement.eplb): the published example, hand-worked steps, the plain
reference, slot capacity, token conservation, memory bound, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.errors import ConfigError
from moejax.placement import eplb, eplb_reference, slots

# deepseek-ai/EPLB README, "Interface and Example": two layers of 12 experts, 4 redundant
# experts per layer, 16 replicas on 2 nodes of 4 GPUs, 4 expert groups.
README_WEIGHT = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                 [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
README_PHY2LOG = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                  [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]


def test_published_example_hierarchical():
    phy2log, rank, logcnt = eplb.rebalance(np.array(README_WEIGHT), 16, 4, 2, 8)
    np.testing.assert_array_equal(np.asarray(phy2log), README_PHY2LOG)
    # replicas per expert, read off the README's output by hand
    np.testing.assert_array_equal(np.asarray(logcnt), [[1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1],
                                                       [1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1]])
    # each replica has a distinct rank 0 .. count - 1
    for l in range(2):
        for e in range(12):
            got = sorted(np.asarray(rank)[l][np.asarray(phy2log)[l] == e].tolist())
            assert got == list(range(int(logcnt[l, e])))


def test_published_example_step1_by_hand():
    # layer 0 group loads (3 experts per group): 262, 330, 116, 325; by decreasing load
    # 330 -> node 0, 325 -> node 1 (lighter), 262 -> node 1 (325 < 330), 116 -> node 0 (full)
    groups = np.array(README_WEIGHT[0]).reshape(4, 3).sum(-1)
    np.testing.assert_array_equal(groups, [262, 330, 116, 325])
    pack, rank = eplb.balanced_packing(groups[None].astype(np.float32), 2)
    np.testing.assert_array_equal(np.asarray(pack), [[1, 0, 0, 1]])
    np.testing.assert_array_equal(np.asarray(rank), [[1, 0, 1, 0]])
    # node 1 then holds groups 3, 0 = experts 9..11, 0..2: the README's last 8 slots
    assert set(README_PHY2LOG[0][8:]) == {9, 10, 11, 0, 1, 2}


def test_replicate_experts_by_hand():
    # loads 10, 6, 3 into 5 slots: 10/1 is largest -> 0 twice; then 6/1 > 10/2 -> 1 twice
    phy2log, rank, cnt = eplb.replicate_experts(np.array([[10.0, 6.0, 3.0]], np.float32), 5)
    np.testing.assert_array_equal(np.asarray(phy2log), [[0, 1, 2, 0, 1]])
    np.testing.assert_array_equal(np.asarray(rank), [[0, 0, 0, 1, 1]])
    np.testing.assert_array_equal(np.asarray(cnt), [[2, 2, 1]])


@pytest.mark.parametrize("mode", ["auto", "global"])
def test_matches_plain_reference_and_respects_slots(mode):
    # the README's shapes (one compiled call per mode), random loads with many ties
    rng = np.random.default_rng(0)
    for _ in range(12):
        w = rng.integers(0, 6, (2, 12)).astype(np.float32)
        got = [np.asarray(x) for x in eplb.rebalance(w, 16, 4, 2, 8, mode)]
        ref = eplb_reference.rebalance(w, 16, 4, 2, 8, mode)
        for g, r in zip(got, ref, strict=True):
            np.testing.assert_array_equal(g, r)
        counts = np.asarray(slots.replica_counts(got[0], 12, 8))  # [L, E, D]
        np.testing.assert_array_equal(counts.sum(-2), 2)  # every slot used once
        np.testing.assert_array_equal(counts.sum(-1), got[2])  # replicas as counted
        shares = np.asarray(slots.even_shares(counts))
        slots.check_capacity(shares, 2)
        tokens = np.einsum("le,led->ld", w, shares)
        np.testing.assert_allclose(tokens.sum(-1), w.sum(-1), rtol=1e-6)  # conserved


def test_global_mode_packs_all_devices():
    phy2log, _, logcnt = eplb.rebalance(np.array(README_WEIGHT), 16, 4, 2, 8, "global")
    ref = eplb_reference.rebalance(np.array(README_WEIGHT), 16, 4, 2, 8, "global")
    np.testing.assert_array_equal(np.asarray(phy2log), ref[0])
    # replicas go to the heaviest per-replica loads regardless of nodes: 10, 5, 1, 4 in layer 0
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(logcnt)[0] == 2), [1, 4, 5, 10])


@pytest.mark.parametrize("kw, msg", [
    (dict(mode="round-robin"), "eplb_mode = 'round-robin'; allowed: auto, hierarchical, global"),
    (dict(mode="hierarchical", groups=3), "needs num_nodes (2) to divide num_groups (3)"),
    (dict(phy=15), "15 slots must be a multiple of the 8 devices"),
    (dict(groups=5), "num_groups = 5 must divide the 12 experts"),
])
def test_bad_shapes_and_modes(kw, msg):
    args = dict(phy=16, groups=4, nodes=2, devices=8, mode="auto") | kw
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        eplb.rebalance(np.array(README_WEIGHT), args["phy"], args["groups"], args["nodes"],
                       args["devices"], args["mode"])


def test_redundant_slot_memory_bound():
    # mixtral-8x7b: 3 x 4096 x 14336 x 2 B = 352 MB per expert, x 32 layers = 11.27 GB per
    # slot; attention 32 x 83.9 MB = 2.68 GB; 80 GB H800 -> 6 slots -> 5 redundant
    m, p = load_model("mixtral-8x7b"), load_platform("h800x8")
    assert slots.slot_bytes(m) == pytest.approx(3 * 4096 * 14336 * 2 * 32)
    assert slots.max_redundant_slots(m, p) == 5
    assert slots.check_redundant_slots(5, m, p) == 5
    with pytest.raises(ConfigError, match=r"redundant_slots = 6: .* allowed: 0 \.\. 5"):
        slots.check_redundant_slots(6, m, p)
    with pytest.raises(ConfigError, match="redundant_slots = -1"):
        slots.slots_per_device(8, 8, -1)


def test_capacity_check_names_the_device():
    shares = np.zeros((4, 2))
    shares[:, 1] = 1.0
    with pytest.raises(ConfigError, match="device 1 holds 4 experts; allowed: at most 3"):
        slots.check_capacity(shares, 3)


def test_eplb_plan_as_wafer_params():
    from conftest import make_model, make_platform

    from moejax.systems.wafer import config as wconfig
    from moejax.systems.wafer import traffic as wtraffic
    from moejax.systems.wafer.placement import wafer_params

    cfg = wconfig.make_config(make_platform("mesh2d"), make_model(num_experts=12), tp_size=1,
                              shadow_slots=2)
    # the README's layer 0 on one node of 4 devices: 16 slots, 4 per device
    phy2log, _, _ = eplb_reference.rebalance(np.array(README_WEIGHT[:1]), 16, 1, 1, 4)
    shares = np.asarray(slots.layout_shares(phy2log, 12, 4))[0]
    params = wafer_params(cfg, shares)
    host = np.clip(np.asarray(params.placement) + np.asarray(params.shadow), 0, 1)
    np.testing.assert_allclose(np.asarray(wtraffic.served_share(host)), shares, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(params.placement).sum(-1), 1.0)  # one native each
    small = wconfig.make_config(make_platform("mesh2d"), make_model(num_experts=12), tp_size=1,
                                shadow_slots=0)
    with pytest.raises(ConfigError, match="shadow_slots = 0"):
        wafer_params(small, shares)
