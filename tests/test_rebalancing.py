"""Rebalancing EP (moejax.systems.rebalancing): plain reference, schedule, window, migration
modes, params sweep == runs, replicas in EP, bad input through the CLI."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_model, make_platform, random_trace

from moejax.catalog.schema import Table
from moejax.cli import main as cli
from moejax.errors import ConfigError
from moejax.placement import migration, slots
from moejax.runner import engine
from moejax.systems import ep, rebalancing, rebalancing_reference
from moejax.tune import rebalancing as rebalancing_tuning

ITERS = 6


def _cfg(mode="blocking", window=2):
    return rebalancing.make_config(make_platform("hierarchical"), make_model(num_experts=8),
                                   redundant_slots=1, migration=mode, max_window=window,
                                   num_groups=0)  # one group per node: hierarchical


def _trace():
    return random_trace(jax.random.key(4), 1, ITERS, 2, 16, 8, 2)


GRID = ((2, 2), (1, 3), (0, 2), (3, 1))


@functools.cache
def _system():
    """One system for the sweep and the tuning tests (one compiled call: 4 params)."""
    cfg = _cfg(window=3)
    return cfg, rebalancing.build(cfg, ITERS), _trace()


def test_params_sweep_matches_plain_reference():
    # one vmapped sweep over (interval, window), each point against the plain reference
    cfg, system, tr = _system()
    params = engine.stack_params([rebalancing.default_params(cfg, r, w) for r, w in GRID])
    out = jax.tree_util.tree_map(np.asarray, engine.simulate(system, params, tr, sweep=True))
    initial = np.asarray(ep.contiguous_placement(8, 4))
    for i, (r, w) in enumerate(GRID):
        ref = rebalancing_reference.run(cfg, r, w, initial, tr[0])
        np.testing.assert_allclose(out["layer_latency_per_iter_s"][i, 0], ref["latency"],
                                   rtol=2e-5)
        assert out["replans"][i, 0] == ref["replans"] == (2, 3, 1, 2)[i]
        np.testing.assert_allclose(out["migration_bytes"][i, 0], ref["moved_bytes"], rtol=1e-5)
        np.testing.assert_allclose(out["migration_s"][i, 0], ref["move_s"], rtol=2e-5)
        np.testing.assert_allclose(out["stall_s"][i, 0] * ITERS, ref["stall_s"], rtol=2e-5)
        assert ref["moved_bytes"] > 0
        for p in ref["placements"]:  # slot capacity and token conservation
            slots.check_capacity(p, cfg.slots_per_device)


def test_grid_and_smoothed_tuning_of_interval_and_window():
    cfg, system, tr = _system()
    base = rebalancing.default_params(cfg)
    g = rebalancing_tuning.grid(system, base, tr, (2, 1), (2, 3))  # 4 points: same compile
    f = g["forward_ms"]
    i, j = np.unravel_index(int(np.argmin(f)), f.shape)
    assert g["best"] == {"interval": (2, 1)[i], "window": (2, 3)[j],
                         "forward_ms": float(f[i, j])}
    run = rebalancing_tuning.SmoothedRun(interval_range=(1.0, 3.0), window_range=(1.0, 3.0),
                                         steps=2, pairs=2)
    res = rebalancing_tuning.tune_smoothed(system, base, tr, run)
    assert len(res["history"]) == 2 and res["history"][1]["sigma"] < res["history"][0]["sigma"]
    assert 1 <= res["final"]["interval"] <= 3 and 1 <= res["final"]["window"] <= 3
    assert np.isfinite(res["final_ms"]) and res["final_ms"] > 0


def test_migration_modes_order_the_stalls():
    move, fwd, comm = jnp.float32(3.0), jnp.float32(2.5), jnp.float32(0.5)
    assert float(rebalancing.stall_s("blocking", move, fwd, comm)) == 3.0
    assert float(rebalancing.stall_s("overlapped", move, fwd, comm)) == 1.0  # 3 - (2.5 - 0.5)
    assert float(rebalancing.stall_s("overlapped", move, 9.0, comm)) == 0.0
    assert float(rebalancing.stall_s("free", move, fwd, comm)) == 0.0


def test_schedule_and_window():
    t = jnp.arange(12, dtype=jnp.float32)
    np.testing.assert_array_equal(np.flatnonzero(rebalancing.replan_now(t, 3.0, 2.0)),
                                  [2, 5, 8, 11])
    np.testing.assert_array_equal(np.flatnonzero(rebalancing.replan_now(t, 0.0, 4.0)), [4])
    ring = jnp.zeros((4, 1)).at[jnp.arange(4) % 4].set(jnp.arange(4.0)[:, None] + 10)
    # at t = 6 (steps 0..5 written mod 4: entries hold steps 4, 5, 2, 3) the last 3 are 5, 4, 3
    ring = ring.at[0].set(14.0).at[1].set(15.0)
    np.testing.assert_allclose(rebalancing.window_mean(ring, 6, 3.0), [(15 + 14 + 13) / 3])


def test_nearest_holder_copies_stay_in_the_node():
    topo = _cfg().ep.topo  # 2 nodes x 2 devices
    old = jnp.array([[1.0, 0, 1.0, 0]])  # the expert on device 0 (node 0) and 2 (node 1)
    new = jnp.array([[1.0, 1.0, 1.0, 1.0]])
    t = np.asarray(migration.traffic_bytes(old, new, topo.path_latency_s, 1.0))
    np.testing.assert_allclose(t[0, 1], 1.0)  # device 1 copies from 0, its node
    np.testing.assert_allclose(t[2, 3], 1.0)  # device 3 from 2
    assert t.sum() == 2.0


def test_policy_replica_lists():
    t = Table({"placement": [[0, 1], [1], [2], [3]], "replica_shares": [[0.25, 0.75], [1.0],
                                                                           [1.0], [1.0]]}, "p")
    _, params = ep.from_policy(make_platform("switch"), make_model(num_experts=4), t, 1)
    np.testing.assert_allclose(params.placement[0], [0.25, 0.75, 0, 0])
    bad = Table({"placement": [[0, 1], [1], [2], [3]], "replica_shares": [[0.5, 0.6], [1.0],
                                                                          [1.0], [1.0]]}, "p")
    with pytest.raises(ConfigError, match="expert 0: 2 shares that are >= 0 and sum to 1"):
        ep.from_policy(make_platform("switch"), make_model(num_experts=4), bad, 1)


@pytest.mark.parametrize("options, msg", [
    ("window = 8", "key 'window' = 8 iterations leaves no iteration for the plan to serve in "
                   "a trace of 2 iterations"),
    ("window = 2", "key 'window' = 2 iterations leaves no iteration"),  # as long as the trace
    ("window = 1", "(overlapped migration: the plan serves from iteration 2); allowed: none"),
    ('eplb_mode = "greedy"', "key 'eplb_mode' = 'greedy' is not allowed; allowed: auto, "
                             "hierarchical, global"),
    ("redundant_slots = 64", "redundant_slots = 64: mixtral-8x7b on h800x8 then needs"),
])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys, options, msg):
    pol = tmp_path / "bad.toml"
    pol.write_text('system = "rebalancing"\ndescription = "x"\nsource = "x"\n'
                   f"[options]\n{options}\n")
    out = tmp_path / "out"
    rc = cli.main(["simulate", "--hardware", "h800x8", "--model", "mixtral-8x7b", "--policy",
                   str(pol), "--iterations", "2", "--traces", "2", "--tokens", "8",
                   "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and msg in err, err
    assert not out.exists()
