"""moejax.tune: gradients vs finite differences, relaxed -> hard, rounding, resume, errors,
export -> simulate round trip."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from moejax import api
from moejax import tunable as fam
from moejax.catalog.policies import load_policy
from moejax.cli.main import main
from moejax.errors import CheckpointError, ConfigError, UnknownNameError
from moejax.runner import engine
from moejax.trace.popularity import fixed_popularity, sample_from_popularity
from moejax.tune import TuneConfig, export, restore, tune
from moejax.tune import loop as tl

SMALL = dict(system="ep", hardware="chiplet-2x2", model="phi-3.5-moe", steps=6, traces=8,
             batch=4, eval_traces=8, tokens=16, iterations=2, layers=1, every=2, lr=0.2,
             warmup=2, trace_gen="powerlaw:alpha=1.5")


@pytest.fixture(scope="module")
def prob():
    return tl.build_problem(TuneConfig(**SMALL))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "run"
    return out, tune(TuneConfig(**SMALL), out, progress=False)


# --- gradients -----------------------------------------------------------------------------


def test_placement_gradient_matches_finite_differences(prob):
    objective = tl.make_objective(prob)
    batch = jax.tree_util.tree_map(lambda x: x[:2], prob.train)
    raw0 = tl.initial_raw(prob)["placement"] * 0.3
    with jax.enable_x64(True):
        f = jax.jit(lambda r: objective({"placement": r}, batch, 0.5))
        check_grads(f, (raw0.astype(jnp.float64),), order=1, modes=["rev"], eps=1e-4,
                    atol=2e-3, rtol=2e-3)


def test_integer_knob_gradient_matches_finite_differences():
    knob = fam.IntegerKnob("micro_slices", 1, 16)

    def cost(raw):  # a micro-slice-like trade-off: pipelining gain vs per-slice overhead
        n = knob.relaxed(raw, 0.5)
        return fam.interpolate(lambda k: 8.0 / k + 0.7 * k, n, 0.5)

    check_grads(cost, (jnp.float32(0.3),), order=1, modes=["rev"], eps=1e-3, rtol=2e-2)
    # hard mode: the integer cost at the rounded value
    raw = knob.init(None, 5)
    assert knob.hard(raw) == 5
    assert float(fam.interpolate(lambda k: 8.0 / k + 0.7 * k, knob.relaxed(raw, 0.0), 0.0)) \
        == pytest.approx(8.0 / 5 + 3.5)


def test_threshold_gradient_matches_finite_differences():
    th = fam.Threshold("theta_min", 0.0, 64.0)
    x = jnp.linspace(0.0, 64.0, 17)
    w = jnp.cos(x)

    def cost(raw):  # gated cost of buffering queues above the threshold
        return (fam.gate(x, th.relaxed(raw, 1.0), 4.0) * w).sum()

    check_grads(cost, (jnp.float32(-0.2),), order=1, modes=["rev"], eps=1e-3, rtol=2e-2)
    theta = th.relaxed(th.init(None, 20.0), 0.0)
    np.testing.assert_array_equal(np.asarray(fam.gate(x, theta, 0.0)),
                                  (np.asarray(x) > float(theta)).astype(np.float32))


# --- relaxed -> hard ---------------------------------------------------------------------


def test_relaxed_objective_tends_to_hard_as_tau_goes_to_zero(prob):
    objective = jax.jit(tl.make_objective(prob))
    f = prob.setup.families["placement"]
    ids = fam.greedy_balanced_ids(prob.load_e, f.num_devices, f.capacity)
    raw = {"placement": 2.0 * f.one_hot(ids)}
    hard = tl.evaluate_values(prob, {"placement": ids})["latency_s"].mean() * 1e3
    taus = (1.0, 0.1, 0.01, 1e-3, 1e-4, 1e-5)
    errs = [abs(float(objective(raw, prob.heldout, tau)) - hard) for tau in taus]
    assert errs[0] > 10 * errs[-1]
    assert all(b <= a * 1.0001 + 1e-6 for a, b in zip(errs, errs[1:], strict=False)), errs
    assert errs[-1] < 1e-4 * hard
    assert tl.hard_values(prob, raw)["placement"].tolist() == ids.tolist()


def test_expected_form_equals_the_system_in_hard_mode(prob):
    f = prob.setup.families["placement"]
    expected = jax.jit(lambda p: prob.setup.expected({"placement": p}, prob.heldout, 0.0))
    for ids in (fam.contiguous_ids(16, 4), fam.greedy_balanced_ids(prob.load_e, 4, 4)):
        lat = expected(f.one_hot(ids))
        ref = tl.evaluate_values(prob, {"placement": ids})["latency_s"]
        np.testing.assert_allclose(np.asarray(lat), ref, rtol=1e-6)


def test_relaxed_placement_is_a_plan_within_capacity():
    f = fam.Placement(10, 4, 3)  # slack: 12 slots for 10 experts
    p = f.relaxed(jax.random.normal(jax.random.key(0), (10, 4)), 0.3)
    np.testing.assert_allclose(np.asarray(p.sum(1)), 1.0, atol=1e-4)
    assert float(p.sum(0).max()) <= 3.0 + 1e-3
    assert float(f.penalty(p)) < 1e-3


@pytest.mark.parametrize("e,d,cap", [(16, 4, 4), (10, 4, 3), (7, 2, 6)])
def test_hard_rounding_is_a_valid_placement(e, d, cap):
    f = fam.Placement(e, d, cap)
    for seed in range(3):
        ids = f.hard(3.0 * jax.random.normal(jax.random.key(seed), (e, d)), 0.1)
        f.check(ids)
        assert np.bincount(ids, minlength=d).max() <= cap


def test_placement_errors_name_the_limit():
    with pytest.raises(ConfigError, match="capacity"):
        fam.Placement(16, 4, 3)
    with pytest.raises(ConfigError, match="holds 5 experts"):
        fam.Placement(8, 2, 4).check(np.array([0, 0, 0, 0, 0, 1, 1, 1]))


def test_greedy_balanced_beats_contiguous_on_max_load():
    load = np.array([50.0, 40, 5, 5, 1, 1, 1, 1])
    ids = fam.greedy_balanced_ids(load, 2, 4)
    per = np.bincount(ids, weights=load, minlength=2)
    contig = np.bincount(fam.contiguous_ids(8, 2), weights=load, minlength=2)
    assert per.max() < contig.max()
    assert np.bincount(ids, minlength=2).max() <= 4


def test_train_and_heldout_share_the_popularity():
    pop = fixed_popularity("powerlaw:alpha=2.0", jax.random.key(0), iterations=1, layers=1,
                           num_experts=16)
    a = sample_from_popularity(pop, jax.random.key(1), num_traces=64, tokens=32, top_k=2)
    b = sample_from_popularity(pop, jax.random.key(2), num_traces=64, tokens=32, top_k=2)
    ca, cb = np.asarray(a.counts.sum((0, 1, 2))), np.asarray(b.counts.sum((0, 1, 2)))
    assert np.argmax(ca) == np.argmax(cb) == int(np.argmax(np.asarray(pop[0, 0])))
    assert not np.array_equal(np.asarray(a.expert_ids), np.asarray(b.expert_ids))
    assert (np.asarray(a.expert_ids) >= 0).all() and a.counts.sum() == 64 * 32 * 2


# --- the loop: checkpoints, resume, errors, export ------------------------------------------


def test_tune_lowers_the_loss_and_evaluates_baselines(run):
    out, res = run
    assert res.step == SMALL["steps"] and len(res.history) == SMALL["steps"]
    assert res.history[-1] < res.history[0]
    assert {"tuned", "default", "contiguous", "round-robin", "greedy-balanced"} <= set(
        res.evaluation)
    assert (Path(out) / "summary.json").is_file()
    fam.Placement(16, 4, 4).check(res.hard["placement"])


def test_interrupted_run_resumes_to_the_same_result(run, tmp_path):
    _, full = run
    out = tmp_path / "run"

    def stop(step, loss):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(TuneConfig(**SMALL), out, progress=False, callback=stop, evaluate_heldout=False)
    res = tune(TuneConfig(**SMALL), out, resume=True, progress=False, evaluate_heldout=False)
    np.testing.assert_array_equal(np.asarray(res.raw["placement"]),
                                  np.asarray(full.raw["placement"]))
    assert res.history == full.history
    assert res.hard["placement"].tolist() == full.hard["placement"].tolist()


def test_gumbel_sinkhorn_run_resumes_to_the_same_result(tmp_path):
    cfg = TuneConfig(**{**SMALL, "gumbel": 0.3, "steps": 4})
    full = tune(cfg, tmp_path / "a", progress=False, evaluate_heldout=False)

    def stop(step, loss):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(cfg, tmp_path / "b", progress=False, callback=stop, evaluate_heldout=False)
    res = tune(cfg, tmp_path / "b", resume=True, progress=False, evaluate_heldout=False)
    assert res.history == full.history
    np.testing.assert_array_equal(np.asarray(res.raw["placement"]),
                                  np.asarray(full.raw["placement"]))


def test_existing_or_mismatched_checkpoint_is_refused(run, tmp_path):
    out, _ = run
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        tune(TuneConfig(**SMALL), out, progress=False)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with pytest.raises(CheckpointError, match="seed"):
        tune(TuneConfig(**{**SMALL, "seed": 1}), copy, resume=True, progress=False)


def test_corrupt_checkpoint_gives_a_clear_error(run, tmp_path):
    out, _ = run
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    step_dir = bad / str(SMALL["steps"])
    for f in (step_dir / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt"):
        restore(bad)
    meta_bad = tmp_path / "meta_bad"
    shutil.copytree(out, meta_bad)
    (meta_bad / str(SMALL["steps"]) / "meta" / "metadata").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        restore(meta_bad)
    with pytest.raises(CheckpointError, match="no such"):
        restore(tmp_path / "missing")


def test_export_restore_bit_exact_and_simulate_round_trip(run, tmp_path):
    out, res = run
    prob, back = restore(out)
    assert back.step == res.step
    np.testing.assert_array_equal(np.asarray(back.raw["placement"]),
                                  np.asarray(res.raw["placement"]))
    a = export.write_policy(tmp_path / "a.toml", prob, res.hard, res.step)
    b = export.write_policy(tmp_path / "b.toml", prob, back.hard, back.step)
    assert a.read_bytes() == b.read_bytes()
    pol = load_policy(str(a))
    assert dict(pol.options)["placement"] == [int(x) for x in res.hard["placement"]]
    full = tl.build_problem(TuneConfig(**SMALL))
    sim = api.simulate("chiplet-2x2", "phi-3.5-moe", str(a), full.heldout)
    ev = tl.evaluate_values(full, res.hard)
    np.testing.assert_array_equal(sim["latency_s"], ev["latency_s"])
    assert engine.percentile_summary(ev["latency_s"])["mean"] * 1e3 == pytest.approx(
        res.evaluation["tuned"]["latency_ms"]["mean"])


def test_bad_names_and_values_are_clear():
    with pytest.raises(UnknownNameError, match="placement"):
        tl.build_problem(TuneConfig(**{**SMALL, "params": ("placemnt",)}))
    with pytest.raises(UnknownNameError, match="tunable system 'aep'"):
        tl.build_problem(TuneConfig(**{**SMALL, "system": "aep"}))
    with pytest.raises(ConfigError, match="loss"):
        TuneConfig(**{**SMALL, "loss": "median"})
    with pytest.raises(ConfigError, match="batch"):
        TuneConfig(**{**SMALL, "batch": 100})


def test_cli_tune_and_export(run, tmp_path, capsys):
    out, pol = tmp_path / "ck", tmp_path / "p.toml"
    args = ["tune", "--system", "ep", "--hardware", "chiplet-2x2", "--model", "phi-3.5-moe",
            "--param", "placement", "--steps", "6", "--traces", "8", "--batch", "4",
            "--eval-traces", "8", "--tokens", "16", "--iterations", "2", "--every", "2",
            "--lr", "0.2", "--warmup", "2", "--trace-gen", "powerlaw:alpha=1.5",
            "--out", str(out), "--export", str(pol), "--quiet"]
    assert main(args) == 0  # the same run as SMALL (shares its compiled functions)
    assert pol.is_file() and (out / "6").is_dir()
    assert dict(load_policy(str(pol)).options)["placement"] == [
        int(x) for x in run[1].hard["placement"]]
    assert main(args) == 2  # exists, no --resume
    assert "already holds checkpoints" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 0
    assert main([*args[:7], "--param", "bogus", *args[9:], "--resume"]) == 2


def test_fsedp_microslice_target_exports_a_loadable_policy(tmp_path):
    cfg = TuneConfig(**{**SMALL, "system": "fsedp", "params": ("num_microslices",)})
    prob = tl.build_problem(cfg, traces=False)
    knob = prob.setup.families["num_microslices"]
    assert knob.lo >= 1 and knob.hi > knob.lo
    hard = {"num_microslices": knob.hard(knob.init(None, knob.lo + 1))}
    assert hard["num_microslices"] == knob.lo + 1
    pol = load_policy(str(export.write_policy(tmp_path / "f.toml", prob, hard, 0)))
    assert pol.system == "fsedp"
    assert dict(pol.options)["num_microslices"] == float(knob.lo + 1)
    with pytest.raises(UnknownNameError, match="num_microslices"):
        tl.build_problem(TuneConfig(**{**SMALL, "system": "fsedp"}), traces=False)


def test_wafer_placement_target_exports_a_policy_that_simulates_the_same(tmp_path):
    from moejax.systems.wafer import system as wsys

    cfg = TuneConfig(**{**SMALL, "system": "wafer", "policy": "ep-baseline-map",
                        "hardware": "wsc-4x4", "relaxation": "system"})
    prob = tl.build_problem(cfg, traces=False)
    f = prob.setup.families["placement"]
    assert (f.num_experts, f.num_devices, f.capacity) == (16, 16, 1)
    ids = np.random.default_rng(0).permutation(16)
    pol = load_policy(str(export.write_policy(tmp_path / "w.toml", prob, {"placement": ids},
                                              0)))
    assert dict(pol.options)["placement"] == ids.tolist()
    s = api.resolve("wsc-4x4", "phi-3.5-moe", "ep-baseline-map")
    _, params = wsys.from_policy(s.platform, s.model, pol.options_table(), 2)
    want = prob.setup.apply(prob.setup.base, prob.setup.as_values({"placement": ids}), 0.0)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(want),
                    strict=True):  # the policy runs exactly the evaluated parameters
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("folder,policy", [
    ("ep-placement-qwen3-chiplet-2x2", "ep-tuned-qwen3-30b-a3b-chiplet-2x2.toml"),
    ("fsedp-microslices-qwen3-chiplet-2x2", "fsedp-tuned-qwen3-30b-a3b-chiplet-2x2.toml"),
    ("fsedp-microslices-theta-phi35-chiplet-2x2",
     "fsedp-buffered-tuned-phi-3.5-moe-chiplet-2x2.toml"),
    ("wafer-placement-qwen3-wsc-4x4", "wafer-tuned-qwen3-30b-a3b-wsc-4x4.toml"),
])
def test_shipped_checkpoint_reproduces_the_shipped_policy(folder, policy, tmp_path):
    prob, res = restore(ROOT / "checkpoints" / folder)
    out = export.write_policy(tmp_path / "p.toml", prob, res.hard, res.step)
    shipped = (ROOT / "policies" / policy).read_text()
    # a tuned FSE-DP policy pins the reading its value was tuned under: a trailing block
    # the export (of the base policy, new defaults) does not write
    shipped = shipped.split("# Pinned reading:")[0]
    # byte for byte except exactly the provenance comments (`export.PROVENANCE_COMMENTS`: the
    # command line and moejax version of the process that wrote the file), which name this
    # test's process, not the run that wrote the shipped file
    text = out.read_text()
    prov = [ln for ln in text.splitlines() if ln.startswith(export.PROVENANCE_COMMENTS)]
    assert [ln.split(":")[0] for ln in prov] == ["# command", "# moejax version"]
    assert "".join(ln + "\n" for ln in text.splitlines()
                   if not ln.startswith(export.PROVENANCE_COMMENTS)) == shipped


def test_p99_and_throughput_losses_have_gradients():
    lat = jnp.linspace(1e-3, 2e-3, 200)
    g = jax.grad(lambda x: tl.reduce_loss("p99", {"latency_s": x}))(lat)
    assert float(g[-5:].sum()) > 0 and float(jnp.abs(g[:150]).sum()) == 0.0
    g = jax.grad(lambda x: tl.reduce_loss("throughput", {"tokens_per_s": x}))(lat * 1e6)
    assert np.allclose(np.asarray(g), -1e-3 / 200)


# --- FSE-DP Algorithm 2 knobs: theta_min, slack (soft Algorithm 2 and the lattice form) ----

FSEDP_BUF = dict(system="fsedp", policy="fsedp-buffered", hardware="chiplet-2x2",
                 model="phi-3.5-moe", params=("theta_min", "slack"), steps=4, traces=4,
                 batch=2, eval_traces=4, tokens=16, iterations=6, layers=1, every=2,
                 warmup=1, trace_gen="powerlaw:alpha=1.2", relaxation="system")


def _buffer_run(cfg, tr, theta, slack, tau):
    """Algorithm 2 over the iterations of one trace (lax.scan): per-iteration tokens per
    layer [I, L, D, E], completed tokens [I] and deferrals [I]."""
    from moejax.systems.fsedp import buffering
    from moejax.systems.fsedp.config import FSEDPParams

    params = FSEDPParams(theta_min=theta, slack=slack, tau=tau)

    def body(bs, x):
        ids, mask = x
        tok_r, size_r = buffering.tokens_per_request(cfg, ids, mask)
        tok_l, done, dfr, bs = buffering.plan_iteration(cfg, bs, tok_r, size_r, True, params)
        return bs, (tok_l, done, dfr)

    bs = buffering.init_state(cfg, tr.expert_ids.shape[1])
    return jax.lax.scan(body, bs, (tr.expert_ids, tr.token_mask))[1]


@pytest.fixture(scope="module")
def buf_case():
    from moejax.systems import fsedp

    s = api.resolve("chiplet-2x2", "phi-3.5-moe", "fsedp-buffered")
    cfg = fsedp.make_config(s.platform, s.model, ablation="A5", slack=0.5, theta_min=3.0,
                            num_requests=4)
    pop = fixed_popularity("powerlaw:alpha=1.2", jax.random.key(3), iterations=8, layers=2,
                           num_experts=16)
    tr = sample_from_popularity(pop, jax.random.key(4), num_traces=1, tokens=32, top_k=2)
    return cfg, jax.tree_util.tree_map(lambda x: x[0], tr)


def test_soft_algorithm2_tends_to_hard_as_tau_goes_to_zero(buf_case):
    cfg, tr = buf_case
    run = jax.jit(lambda th, sl, tau: _buffer_run(cfg, tr, th, sl, tau))
    # traced knobs at their config values, hard: the same as the static config
    hard = run(jnp.float32(3.0), jnp.float32(0.5), 0.0)
    static = jax.jit(lambda: _buffer_run(cfg, tr, None, None, 0.0))()
    for a, b in zip(hard, static, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(hard[2].sum()) > 0  # the case defers something
    hard = run(jnp.float32(2.5), jnp.float32(0.45), 0.0)  # off the integer ties
    errs = []
    for tau in (1.0, 0.1, 0.01, 1e-3, 1e-4):
        soft = run(jnp.float32(2.5), jnp.float32(0.45), tau)
        errs.append(max(float(jnp.abs(a - b).max()) for a, b in zip(soft, hard, strict=True)))
    assert errs[0] > 0.1 and errs[-1] < 1e-3, errs
    assert all(b <= a + 1e-6 for a, b in zip(errs, errs[1:], strict=False)), errs


def test_theta_min_and_slack_gradients_match_finite_differences(buf_case):
    cfg, tr = buf_case
    w = jax.random.uniform(jax.random.key(5), (8, 2, 4, 16))

    def cost(theta, slack):  # a smooth read-out of everything Algorithm 2 decides
        tok_l, done, dfr = _buffer_run(cfg, tr, theta, slack, 0.7)
        return (tok_l * w).sum() + 0.3 * done.sum() - 2.0 * dfr.sum()

    with jax.enable_x64(True):
        w = w.astype(jnp.float64)
        f = jax.jit(cost)
        g = jax.grad(f, argnums=(0, 1))(jnp.float64(2.6), jnp.float64(0.45))
        assert abs(float(g[0])) > 1e-3 and abs(float(g[1])) > 1e-3  # both knobs matter
        check_grads(f, (jnp.float64(2.6), jnp.float64(0.45)), order=1, modes=["rev"],
                    eps=1e-4, atol=1e-3, rtol=1e-3)


def test_lattice_form_is_hard_at_integers_and_its_gradient_is_the_hard_difference():
    cfg = TuneConfig(**{**FSEDP_BUF, "params": ("num_microslices", "theta_min"),
                        "relaxation": "lattice", "policy": "fsedp-buffered"})
    prob = tl.build_problem(cfg)
    setup = prob.setup
    objective = tl.make_objective(prob)
    train = jax.tree_util.tree_map(lambda x: x[:2], prob.train)
    vg = jax.jit(jax.value_and_grad(
        lambda m, th: objective({"num_microslices": m, "theta_min": th}, train, 0.1),
        argnums=(0, 1)))  # one compile: the runs are constants, the gradient is cheap

    def f(m, th):
        return vg(m, th)[0]

    m_knob, th_knob = setup.families["num_microslices"], setup.families["theta_min"]
    sim = tl.evaluate_values(prob, {"num_microslices": 40, "theta_min": 5},
                             train)["latency_s"].mean() * 1e3
    assert float(f(m_knob.init(None, 40), th_knob.init(None, 5))) == pytest.approx(sim,
                                                                                   rel=1e-5)
    # inside a cell the loss is multilinear in the values: gradient = finite difference
    m, th = m_knob.init(None, 40.4), th_knob.init(None, 1.5)
    g = vg(m, th)[1]
    assert float(g[1]) < -1e-3  # theta 2 defers (1 does not) and shortens the layers here
    for i, h in ((0, 1e-3), (1, 1e-3)):
        d = [jnp.float32(h) if j == i else jnp.float32(0.0) for j in range(2)]
        fd = (float(f(m + d[0], th + d[1])) - float(f(m - d[0], th - d[1]))) / (2 * h)
        assert float(g[i]) == pytest.approx(fd, rel=2e-2, abs=1e-3), (i, float(g[i]), fd)
    with pytest.raises(ConfigError, match="integer knobs only"):
        tl.make_objective(tl.build_problem(TuneConfig(**{**FSEDP_BUF, "relaxation": "lattice"}),
                                           traces=False))  # refused before any trace is read


def test_theta_min_needs_a_buffering_policy_and_exports_a_loadable_policy(tmp_path):
    with pytest.raises(ConfigError, match="token buffering"):
        tl.build_problem(TuneConfig(**{**FSEDP_BUF, "policy": "fsedp"}), traces=False)
    prob = tl.build_problem(TuneConfig(**FSEDP_BUF))
    hard = {"theta_min": 5, "slack": 0.5}
    pol = export.write_policy(tmp_path / "t.toml", prob, hard, 0)
    opts = dict(load_policy(str(pol)).options)
    assert (opts["theta_min"], opts["slack"], opts["ablation"]) == (5.0, 0.5, "A5")
    sim = api.simulate("chiplet-2x2", "phi-3.5-moe", str(pol), prob.heldout)
    ev = tl.evaluate_values(prob, hard)
    np.testing.assert_array_equal(sim["latency_s"], ev["latency_s"])
    assert ev["latency_s"].mean() != tl.evaluate_values(prob, {"theta_min": 0, "slack": 0.5})[
        "latency_s"].mean()  # the threshold changes the hard result on these traces


# --- knobs without a relaxed path: hard-mode grid search (moejax.tune.zeroth) --------------


def test_grid_search_returns_every_point_and_the_first_minimum():
    from moejax.tune import zeroth

    res = zeroth.grid_search(lambda x: (x - 1.0) ** 2 // 1, (0.0, 0.5, 1.0, 1.5, 3.0))
    assert res.values == (1.0, 0.0, 0.0, 0.0, 4.0) and res.best == 0.5
    with pytest.raises(ConfigError, match="grid"):
        zeroth.grid_search(lambda x: x, ())
    with pytest.raises(ConfigError, match="metric"):
        zeroth.tune_aep_decay(metric="latency")
    with pytest.raises(ConfigError, match="scheduler = 'defrag'"):
        zeroth.tune_aep_decay(policy="aep-mtfs", requests=2)


def test_wafer_alpha_grid_tuner_picks_the_training_optimum():
    from moejax.tune import zeroth

    r = zeroth.tune_wafer_alpha(model="phi-3.5-moe", grid=(0.0, 0.5, 1e6), tokens=32,
                                iterations=4, layers=1, traces=2, eval_traces=2,
                                overrides={"invasive": True, "shadow_slots": 1,
                                           "micro_batches": [1]})
    fwd = r["train_forward_s"]["policy"]
    assert r["tuned"] == r["grid"][int(np.argmin(fwd))]
    assert fwd[0] != fwd[2]  # alpha changes the result
    assert r["heldout"]["never (alpha = 1e9)"]["migrations"] == 0.0
    assert r["heldout"]["default"]["migrations"] > 0  # alpha = 0.5 re-plans


def test_aep_decay_grid_tuner_picks_the_training_optimum():
    from moejax.tune import zeroth

    r = zeroth.tune_aep_decay(requests=2, train_streams=1, eval_streams=1, grid=(0.0, 1.0),
                              baselines=(), rate_per_s=400.0)
    tp = r["train_objective"]
    assert tp[0] != tp[1]  # delta changes which mu-queue is drained first
    assert r["tuned"] == r["grid"][int(np.argmax(tp))]
    assert set(r["heldout"]) == {"tuned", "default"} and r["default"] == 0.5
    assert r["heldout"]["tuned"]["throughput_tok_s"] > 0


def test_eq2_gate_is_the_trigger_at_tau_zero_and_differentiable_in_alpha():
    from moejax.systems.wafer import balancer as bal

    loads = jax.random.uniform(jax.random.key(7), (32, 3, 8)) ** 3 * 100.0  # [cases, L, D]
    imb = np.asarray(jax.vmap(lambda x: bal.layer_imbalance(x).sum())(loads))
    alpha = float(np.median(imb))
    for since in (0.0, 3.0):
        hard = jax.vmap(lambda x, s=since: bal.eq2_trigger(x, s, alpha, 0.0))(loads)
        gate = jax.vmap(lambda x, s=since: bal.eq2_gate(x, s, alpha, 0.0, 0.0))(loads)
        np.testing.assert_array_equal(np.asarray(gate), np.asarray(hard, np.float32))
    errs = [float(jnp.abs(jax.vmap(lambda x, t=t: bal.eq2_gate(x, 3.0, alpha + 0.013, 0.0, t))(
        loads) - (imb > alpha + 0.013)).max()) for t in (1.0, 0.1, 0.01, 1e-4)]
    assert errs[0] > errs[-1] and errs[-1] < 1e-3, errs
    with jax.enable_x64(True):
        f = jax.jit(lambda a: jax.vmap(lambda x: bal.eq2_gate(x, 3.0, a, 0.0, 0.5))(
            loads.astype(jnp.float64)).sum())
        check_grads(f, (jnp.float64(alpha),), order=1, modes=["rev"], eps=1e-4, rtol=1e-3)
