"""The balancing study's pieces that need no simulation: disjoint splits of the shipped
recordings, EPLB plans within memory, and the claim rules on hand-made rows."""

from __future__ import annotations

import numpy as np
import pytest

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.errors import ConfigError
from moejax.placement import slots
from moejax.reproduce import balancing as study
from moejax.reproduce import balancing_data as data


def test_shipped_recordings_and_disjoint_splits():
    rec = data.recordings()
    assert rec["esft_intent"]["counts"].shape == (127, 26, 64)
    assert rec["esft_law"]["counts"].shape == (33, 26, 64)
    assert rec["olmoe"]["counts"].shape == (5, 3, 64)
    assert rec["mixtral"]["counts"].shape == (5, 3, 8)
    counts = rec["esft_intent"]["counts"]
    # (token, expert) pairs per layer = 6 x tokens (one iteration per sequence)
    np.testing.assert_array_equal(counts.sum(-1)[:, 0], 6 * rec["esft_intent"]["tokens"])
    train = data._part(rec["esft_intent"], "sequences", "train")
    test = data._part(rec["esft_intent"], "sequences", "test")
    assert train.shape[0] + test.shape[0] == 127
    np.testing.assert_array_equal(test, counts[63:])  # the held-out half, untouched
    dom = list(rec["olmoe"]["domains"])
    assert not set(data.TRAIN_DOMAINS) & set(data.TEST_DOMAINS)
    np.testing.assert_array_equal(data._part(rec["olmoe"], "domains", "test"),
                                  rec["olmoe"]["counts"][[dom.index("book"),
                                                          dom.index("github")]])
    b = data.batches(data.WORKLOADS["esft_law"], "test", 3, 1000, 26, 64, 6)
    assert b.shape == (3, 26, 64) and (b.sum(-1)[:, 0] / 6 >= 1000).all()
    with pytest.raises(ConfigError, match="part = 'valid'; allowed: train, test"):
        data.batches(data.WORKLOADS["esft_law"], "valid", 1, 10, 26, 64, 6)


def test_eplb_shares_fill_the_slots_on_every_platform():
    load = np.random.default_rng(0).random((2, 64))
    m = load_model("deepseek-moe-16b")
    for name in study.PLATFORMS:
        p = load_platform(name)
        s = study.eplb_shares(load, m, p, 1)
        slots.check_capacity(s, slots.slots_per_device(64, p.num_devices, 1))
        np.testing.assert_allclose(s.sum(-1), 1.0)


def _rows(lat):
    """Hand-made rows: lat[(workload, placement)] = held-out latency (ms)."""
    rows = []
    for (w, name), v in lat.items():
        s = {"eplb-0": 0, "eplb-1": 1, "eplb-2": 2, "eplb-4": 4}.get(name, 0)
        rows.append({"workload": w, "platform": "h800x8", "placement": name,
                     "latency_ms_mean": v, "load_ratio_mean": 2.0 if name == "contiguous" else
                     1.1, "fits_memory": True, "redundant_slots": s})
    return rows


def test_claim_rules_on_hand_made_rows():
    lat = {("a", "contiguous"): 2.0, ("a", "eplb-0"): 1.2, ("a", "eplb-1"): 1.0,
           ("a", "eplb-2"): 0.995, ("a", "eplb-4"): 0.99, ("a", "tuned"): 1.19,
           ("a", "tuned+replicas"): 0.98,
           ("b", "contiguous"): 1.5, ("b", "eplb-0"): 1.0, ("b", "eplb-1"): 0.9,
           ("b", "eplb-2"): 0.8, ("b", "eplb-4"): 0.7, ("b", "tuned"): float("nan"),
           ("b", "tuned+replicas"): float("nan")}
    claims = {c.id: c for c in study.placement_claims(_rows(lat), study.QUICK)}
    tuned = claims["balancing.tuned_vs_eplb"]
    assert tuned.holds and tuned.simulated["tuned_replicas_over_eplb1"] == {"a@h800x8": 0.98}
    knee = claims["balancing.redundancy_knee"]
    # a: 0 -> 1 gains 16.7%, 1 -> 2 only 0.5%: knee 1; b: every step gains > 1%: knee 4
    assert knee.simulated["knee_slots"] == {"a@h800x8": 1, "b@h800x8": 4}
    assert knee.holds  # 1 of 2 points at most 1 slot: half
    assert claims["balancing.eplb_vs_contiguous"].holds
