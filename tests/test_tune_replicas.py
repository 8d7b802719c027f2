"""Tuned placement with replicas (moejax.tunable.ReplicaPlacement), per-layer placements,
training on one part of a recording and scoring on the other (`moejax tune --trace`)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from moejax import api
from moejax import tunable as fam
from moejax.errors import ConfigError
from moejax.runner import engine
from moejax.systems import ep
from moejax.trace import from_counts
from moejax.trace import io as trace_io
from moejax.tune import export, restore, tune
from moejax.tune.loop import TuneConfig, build_problem

# an EPLB-like start on 4 devices x 2 slots: expert 0 has 3 replicas, two of them on device 0
START = np.array([[2 / 3, 1 / 3, 0, 0],
                  [0, 0, 1.0, 0],
                  [0, 0, 0, 1.0],
                  [0.5, 0, 0, 0.5],
                  [0, 1.0, 0, 0],
                  [0, 0, 1.0, 0]])


def test_start_round_trips_and_random_raw_rounds_to_valid_placements():
    f = fam.ReplicaPlacement(6, 4, 2, num_layers=3)  # one family: one compiled relaxation
    raw = f.init(jax.random.key(0), START)
    np.testing.assert_allclose(f.hard(raw, 0.005), np.broadcast_to(START, (3, 6, 4)), atol=1e-6)
    v = f.relaxed(raw, 0.005)
    np.testing.assert_allclose(v["shares"][0], START, atol=1e-3)
    occ = np.asarray(v["occupancy"])
    np.testing.assert_allclose(occ, np.round(occ), atol=1e-3)  # capped Sinkhorn: 0/1
    f.check(np.broadcast_to(START, (3, 6, 4)))
    for seed in range(3):
        raw = 2.0 * jax.random.normal(jax.random.key(seed), (3, 7, 2 * 4 + f.extra))
        hard = f.hard(raw, 1.0)
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
    cfg = TuneConfig(system="ep", hardware="h800x8", model="mixtral-8x7b", params=("replicas",),
                     trace=str(rec), per_layer=True, init="eplb", steps=3, batch=2,
                     tau_start=0.1, every=3)
    res = tune(cfg, out, progress=False, evaluate_heldout=False)
    prob = build_problem(cfg)
    assert engine.batch_size(prob.train) == 4 and engine.batch_size(prob.heldout) == 4
    np.testing.assert_array_equal(prob.heldout.counts[:, 0], counts[4:])  # never trained on
    export.write_policy(pol, build_problem(cfg, traces=False), res.hard, res.step)
    text = pol.read_text()
    assert "replica_shares" in text and "placement = [[[" in text
    # the exported policy is the tuned placement (restored from the checkpoint): EP reads
    # the replica device lists and shares back as the same [L, E, D] share matrix
    _, restored = restore(out)
    np.testing.assert_allclose(restored.hard["replicas"], res.hard["replicas"])
    setup = api.resolve("h800x8", "mixtral-8x7b", str(pol))
    _, params = ep.from_policy(setup.platform, setup.model, setup.policy.options_table(), 1)
    np.testing.assert_allclose(np.asarray(params.placement), res.hard["replicas"], atol=1e-12)
    fam.ReplicaPlacement(8, 8, 2, num_layers=1).check(res.hard["replicas"])


def test_train_fraction_leaves_both_parts(tmp_path):
    rec = tmp_path / "rec.npz"
    trace_io.save(rec, from_counts(np.ones((3, 1, 8), np.float32), 2), {"test": 1})
    with pytest.raises(ConfigError, match="train_fraction = 0.9: .* 3 iterations"):
        build_problem(TuneConfig(hardware="h800x8", model="mixtral-8x7b", trace=str(rec),
                                 train_fraction=0.9, batch=1))


def test_cli_flags_reach_the_run_config():
    from moejax.cli.main import build_parser
    from moejax.cli.tune import config_from_args

    args = build_parser().parse_args(["tune", "--param", "replicas", "--trace", "r.npz",
                                      "--train-fraction", "0.25", "--per-layer", "--init",
                                      "eplb", "--out", "x"])
    cfg = config_from_args(TuneConfig, args)
    assert (cfg.params, cfg.trace, cfg.train_fraction, cfg.per_layer, cfg.init) == (
        ("replicas",), "r.npz", 0.25, True, "eplb")
