"""Tuned placement with replicas (moejax.tune.params.ReplicaPlacement), per-layer placements,
training on one part of a recording and scoring on the other (`moejax tune --trace`)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from moejax import api, cli
from moejax.errors import ConfigError
from moejax.systems import ep
from moejax.trace import from_counts
from moejax.trace import io as trace_io
from moejax.tune import params as fam

# an EPLB-like start on 4 devices x 2 slots: expert 0 has 3 replicas, two of them on device 0
START = np.array([[2 / 3, 1 / 3, 0, 0],
                  [0, 0, 1.0, 0],
                  [0, 0, 0, 1.0],
                  [0.5, 0, 0, 0.5],
                  [0, 1.0, 0, 0],
                  [0, 0, 1.0, 0]])


def test_start_round_trips_and_relaxed_is_integral():
    f = fam.ReplicaPlacement(6, 4, 2)
    raw = f.init(jax.random.key(0), START)
    np.testing.assert_allclose(f.hard(raw, 0.005), START, atol=1e-6)
    v = f.relaxed(raw, 0.005)
    np.testing.assert_allclose(v["shares"], START, atol=1e-3)
    occ = np.asarray(v["occupancy"])
    np.testing.assert_allclose(occ, np.round(occ), atol=1e-3)  # capped Sinkhorn: 0/1
    f.check(START)


def test_random_raw_rounds_to_valid_placements():
    f = fam.ReplicaPlacement(6, 4, 2, num_layers=3)
    for seed in range(4):
        raw = 2.0 * jax.random.normal(jax.random.key(seed), (3, 7, 2 * 4 + f.extra))
        hard = f.hard(raw, 0.05)
        f.check(hard)  # slots respected, rows sum to 1 (tokens conserved)
        assert ((hard > 0).sum(-1) <= 4).all()
        relaxed = f.relaxed(raw, 1.0)
        np.testing.assert_allclose(relaxed["shares"].sum(-1), 1.0, rtol=1e-4)
        assert float(f.penalty(relaxed)) < 1e-3  # columns within the slots


def test_bad_slots():
    with pytest.raises(ConfigError, match="slots = 1 per device for 6 experts on 4 devices; "
                                          "allowed: 2 .. 6"):
        fam.ReplicaPlacement(6, 4, 1)


def test_per_layer_placement_family():
    f = fam.Placement(8, 4, 2, num_layers=3)
    raw = f.init(jax.random.key(1), f.one_hot(np.tile(np.arange(8) % 4, (3, 1))))
    ids = f.hard(raw, 0.01)
    assert ids.shape == (3, 8)
    f.check(ids)
    np.testing.assert_array_equal(ids, np.tile(np.arange(8) % 4, (3, 1)))


def test_tune_on_a_recording_exports_the_tuned_replicas(tmp_path):
    # Mixtral layout (8 experts, top-2) on h800x8: 2 slots per device, 8 redundant slots
    rng = np.random.default_rng(0)
    shares = rng.dirichlet(np.full(8, 0.5), size=1)  # one hot-expert profile, 1 layer
    counts = np.stack([[rng.multinomial(512 * 2, shares[0])] for _ in range(8)])  # [8, 1, 8]
    rec = tmp_path / "rec.npz"
    trace_io.save(rec, from_counts(counts.astype(np.float32), 2), {"test": 1})
    out, pol = tmp_path / "ck", tmp_path / "tuned.toml"
    rc = cli.main(["tune", "--system", "ep", "--hardware", "h800x8", "--model", "mixtral-8x7b",
                   "--param", "replicas", "--trace", str(rec), "--per-layer", "--init", "eplb",
                   "--steps", "3", "--batch", "2", "--tau-start", "0.1", "--every", "3",
                   "--out", str(out), "--export", str(pol), "--quiet"])
    assert rc == 0
    import json

    summary = json.loads((out / "summary.json").read_text())
    ev = summary["evaluation"]
    assert any(k.startswith("eplb") for k in ev) and "tuned" in ev
    text = pol.read_text()
    assert "replica_shares" in text and "placement = [[[" in text
    # the exported policy is the tuned placement (restored from the checkpoint): EP reads
    # the replica device lists and shares back as the same [L, E, D] share matrix
    from moejax.tune.loop import restore

    _, res = restore(out)
    setup = api.resolve("h800x8", "mixtral-8x7b", str(pol))
    _, params = ep.from_policy(setup.platform, setup.model, setup.policy.options_table(), 1)
    np.testing.assert_allclose(np.asarray(params.placement), res.hard["replicas"], atol=1e-12)
    fam.ReplicaPlacement(8, 8, 2, num_layers=1).check(res.hard["replicas"])


def test_train_fraction_leaves_both_parts(tmp_path):
    from moejax.tune.loop import TuneConfig, build_problem

    rec = tmp_path / "rec.npz"
    trace_io.save(rec, from_counts(np.ones((3, 1, 8), np.float32), 2), {"test": 1})
    with pytest.raises(ConfigError, match="train_fraction = 0.9: .* 3 iterations"):
        build_problem(TuneConfig(hardware="h800x8", model="mixtral-8x7b", trace=str(rec),
                                 train_fraction=0.9, batch=1))
