"""EPS-MoE relaxed mode and `moejax tune --system epsmoe`: the tuning system equals the hard
system at tau = 0, approaches it as tau -> 0, and its gradient matches finite differences."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax import api
from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model
from moejax.errors import ConfigError, UnknownNameError
from moejax.runner import engine
from moejax.systems.epsmoe import layer
from moejax.systems.epsmoe import system as esys
from moejax.systems.epsmoe.config import default_params, make_config
from moejax.trace import gen
from moejax.tune import targets

H8 = load_platform("h800x8")
MODEL = load_model("deepseek-moe-16b")  # 64 experts, top-6: 8 local, divisors 1 2 4 8
NAMES = ("pn", "switch_rows", "sm_comm")


@pytest.fixture(scope="module")
def tuned():
    """(setup, trace, latency(values vector [pn index, sm_comm, log switch], tau), its
    gradient): one jitted value_and_grad."""
    policy = api.resolve("h800x8", "deepseek-moe-16b", "epsmoe-tune").policy
    # data-parallel dense tiles: at these shapes the stream-K dense kernel (the default) and
    # the grouped one nearly tie, so the switch gate whose relaxation these tests check would
    # mix two almost equal times (at pn = 4 the tau = 1 gap, 1e-4 ms, falls below the tau =
    # 0.1 one); with whole waves the two kernels differ and the gate carries the signal
    policy = dataclasses.replace(policy, options=policy.options + (
        ("dense_schedule", "data_parallel"),))
    setup = targets.build_setup(policy, H8, MODEL, 1, NAMES)
    tr = gen.generate("powerlaw:alpha=1.2", jax.random.key(5), num_traces=1, iterations=1,
                      layers=1, tokens=256, num_experts=64, top_k=6)

    def latency_ms(v, tau):
        values = {"pn": v[0], "sm_comm": v[1], "switch_rows": jnp.exp(v[2])}
        p = setup.apply(setup.base, values, tau)
        return engine.run_one(setup.system, p, tr[0], jax.random.key(0))["latency_s"] * 1e3

    vg = jax.jit(jax.value_and_grad(latency_ms))  # one compile serves values and gradients
    return setup, tr, lambda v, t: vg(v, t)[0], lambda v, t: vg(v, t)[1]


def test_relaxed_equals_hard_at_zero_and_converges(tuned):
    setup, tr, f, _ = tuned
    # the rows per expert of this trace scale to ~1536 per chunk at PN=1: a switch at 1400
    # rows sits near them, so the gate matters at tau > 0
    cfg = make_config(H8, MODEL, mode="tp-ep", gemm="threshold", tokens_per_forward=16384,
                      dense_schedule="data_parallel")  # the fixture's reading
    hard_system = esys.build(cfg)  # one compile: pn and the SMs are traced params
    for pn, sm_c in ((1, 16), (4, 20)):
        v = jnp.array([setup.families["pn"].as_value(pn), sm_c, np.log(1400.0)], jnp.float32)
        p = default_params(cfg, pn=pn, sm_gemm=132 - sm_c, sm_comm=sm_c, switch_rows=1400.0)
        hard = engine.simulate(hard_system, p, tr)
        np.testing.assert_allclose(float(f(v, 0.0)), hard["latency_s"][0] * 1e3, rtol=1e-6)
        gaps = [abs(float(f(v, t)) - float(f(v, 0.0))) for t in (1.0, 0.1, 0.01, 1e-4)]
        assert gaps[0] > 0 and gaps[-1] <= 1e-3 * gaps[0] + 1e-7
        assert all(b <= a + 1e-7 for a, b in zip(gaps, gaps[1:], strict=False))


def test_gradient_matches_finite_differences(tuned):
    _, _, f, g = tuned
    v = jnp.array([1.4, 17.3, np.log(1500.0)], jnp.float32)
    tau = 0.3
    grad = np.asarray(g(v, tau))
    for i, eps in enumerate((0.02, 0.02, 0.01)):
        e = jnp.zeros(3).at[i].set(eps)
        fd = (float(f(v + e, tau)) - float(f(v - e, tau))) / (2 * eps)
        assert grad[i] == pytest.approx(fd, rel=0.03, abs=1e-4), i
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0


def test_setup_refuses_and_maps_divisors(tuned):
    setup, *_ = tuned
    knob = setup.families["pn"]
    assert knob.divs == (1, 2, 4, 8) and knob.hard(knob.init(None, 4)) == 4
    assert setup.options({"pn": 4, "sm_comm": 20}) == {"pn": 4, "sm_comm": 20, "sm_gemm": 112}
    base = setup.baselines(np.ones(64))
    paper = next(v for k, v in base.items() if k.startswith("paper (N*="))
    assert paper["pn"] in knob.divs and paper["switch_rows"] == 2048.0
    policy = api.resolve("h800x8", "deepseek-moe-16b", "epsmoe").policy
    with pytest.raises(UnknownNameError, match="chunks"):
        targets.build_setup(policy, H8, MODEL, 1, ("chunks",))
    tp = api.resolve("h800x8", "deepseek-moe-16b", "tp-tp").policy
    with pytest.raises(ConfigError, match="tp-tp"):
        targets.build_setup(tp, H8, MODEL, 1, ("pn",))


# --- chunk assignment (beyond 003; moejax/systems/epsmoe/assignment.py) -------------------

PN = 4  # 8 local experts in 4 chunks


def _skewed(tokens=128, seed=7):
    return gen.generate("powerlaw:alpha=1.4", jax.random.key(seed), num_traces=1,
                        iterations=1, layers=1, tokens=tokens, num_experts=64, top_k=6)


@pytest.fixture(scope="module")
def assigned():
    """(setup of the assignment knob, skewed trace, jitted (latency, gradient)(slot logits,
    tau)): the tuning system at pn = PN, one compile; tau = 0 reads the argmax one-hot."""
    policy = api.resolve("h800x8", "deepseek-moe-16b", "epsmoe-tune").policy
    setup = targets.build_setup(policy, H8, MODEL, 1, ("assignment",))
    fam_a = setup.families["assignment"]
    tr = _skewed()
    base = setup.base.replace(pn=jnp.float32(PN), pn_index=jnp.float32(2.0))

    def latency_ms(raw, tau):
        hard = jax.nn.one_hot(jnp.argmax(raw, -1), raw.shape[-1])
        p = setup.apply(base, {"assignment": jnp.where(tau > 0, fam_a.relaxed(raw, tau),
                                                        hard)}, tau)
        return engine.run_one(setup.system, p, tr[0], jax.random.key(0))["latency_s"] * 1e3

    vg = jax.jit(jax.value_and_grad(latency_ms))
    return setup, tr, lambda r, t: float(vg(r, t)[0]), lambda r, t: vg(r, t)[1]


def _hard_cfg(chunks=(), **kw):
    return make_config(H8, MODEL, mode="tp-ep", pn=PN, gemm="threshold", sm_gemm=116,
                       tokens_per_forward=16384, chunk_assignment=chunks, **kw)


def test_explicit_assignment_equals_reference():
    """Hard mode with an explicit, unequal assignment (chunk 2 empty on device 0, chunk 0
    holding four experts there) == the plain-Python two-stream reference under it; the
    send-once reading of E11 (the literal one: the tuning system below)."""
    from moejax.systems.epsmoe import reference
    from moejax.systems.epsmoe.config import config_of

    tr = _skewed(tokens=96, seed=1)
    ids, mask = tr.expert_ids[0, 0, 0], tr.token_mask[0, 0]
    chunks = np.random.default_rng(1).integers(0, PN, size=(8, 8))
    chunks[0] = [0, 0, 0, 0, 1, 1, 3, 3]
    cfg = _hard_cfg(chunks.tolist(), resend=False)
    p = default_params(cfg, pn=PN, sm_gemm=116, switch_rows=1400.0)
    got = jax.jit(lambda i, m: layer.block(cfg, p, i, m, jnp.float32(16384 / 96)))(ids, mask)
    ref = reference.block(config_of(cfg, p), np.asarray(ids).tolist(),
                          np.asarray(mask).tolist(), 16384 / 96, 1400.0)
    for k in ref:
        np.testing.assert_allclose(float(got[k]), ref[k], rtol=2e-5, err_msg=k)


def test_contiguous_assignment_is_the_default_bit_for_bit(assigned):
    """The tuning system at tau = 0 with the identity (contiguous) assignment, through the
    general path, == the hard system's shipped default path, bit for bit."""
    from moejax.systems.epsmoe import assignment

    setup, tr, f, _ = assigned
    raw = setup.families["assignment"].one_hot(assignment.identity_slots(8, 8))
    cfg = _hard_cfg()
    p = default_params(cfg, pn=PN, sm_gemm=116, sm_comm=16)
    hard = jax.jit(lambda p: engine.run_one(esys.build(cfg), p, tr[0], jax.random.key(0))[
        "latency_s"] * 1e3)(p)
    assert f(raw, 0.0) == float(hard)


def test_assignment_tau_zero_is_hard_and_relaxed_converges(assigned):
    """The tuning system at tau = 0 == the plain-Python reference under the argmax
    assignment (== hard mode, test above); relaxed -> hard as tau -> 0."""
    from moejax.systems.epsmoe import assignment, reference
    from moejax.systems.epsmoe.config import config_of

    setup, tr, f, _ = assigned
    raw = setup.families["assignment"].init(jax.random.key(2), None) * 100.0  # random
    slots = setup.families["assignment"].hard(raw)
    cfg = _hard_cfg(assignment.slots_to_chunks(slots, 8, PN).tolist())
    p = default_params(cfg, pn=PN, sm_gemm=116, sm_comm=16)
    n = int(tr.token_mask[0, 0].sum())
    ref = reference.block(config_of(cfg, p), np.asarray(tr.expert_ids[0, 0, 0]).tolist(),
                          np.asarray(tr.token_mask[0, 0]).tolist(), 16384 / n, 2048.0)
    hard = ref["block_s"] * 1e3
    np.testing.assert_allclose(f(raw, 0.0), hard, rtol=2e-5)
    gaps = [abs(f(raw, t) - f(raw, 0.0)) for t in (1.0, 0.3, 0.03, 1e-3)]
    assert gaps[0] > 0 and gaps[-1] <= 1e-3 * gaps[0] + 1e-7, gaps
    assert gaps[2] < gaps[0], gaps


def test_assignment_gradient_matches_finite_differences(assigned):
    setup, _, f, g = assigned
    raw = jax.random.normal(jax.random.key(4), setup.families["assignment"].shape)
    tau = 0.5
    grad = np.asarray(g(raw, tau))
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0
    u = grad / np.linalg.norm(grad)  # along the gradient: slope = |grad|
    # a step inside one linear piece: the flow shop's max (which chunk / device is slowest)
    # has a corner 0.005 along -u from this point under the default kernels (slopes 0.32 and
    # 0.50 either side), and a central difference across it measures neither
    eps = 0.002
    fd = (f(raw + eps * u, tau) - f(raw - eps * u, tau)) / (2 * eps)
    assert fd == pytest.approx(np.linalg.norm(grad), rel=0.05)
    for i in np.argsort(-np.abs(grad).ravel())[:2]:  # the two steepest coordinates
        e = np.zeros(grad.size, np.float32)
        e[i] = eps
        e = e.reshape(grad.shape)
        fd = (f(raw + e, tau) - f(raw - e, tau)) / (2 * eps)
        assert grad.ravel()[i] == pytest.approx(fd, rel=0.05, abs=1e-4), i


def test_assignment_family_export_and_errors(assigned):
    from moejax.systems.epsmoe import assignment

    setup, *_ = assigned
    fam_a = setup.families["assignment"]
    ident = assignment.identity_slots(8, 8)
    assert np.array_equal(setup.defaults["assignment"], ident)
    raw = fam_a.init(jax.random.key(0), fam_a.one_hot(ident))
    assert np.array_equal(fam_a.hard(raw), ident)
    slots = np.array(ident)
    slots[3] = [7, 7, 7, 7, 0, 1, 2, 3]
    opts = setup.options({"pn": 4, "assignment": slots})
    assert opts["chunk_assignment"][0] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert opts["chunk_assignment"][3] == [3, 3, 3, 3, 0, 0, 1, 1]
    load = np.zeros(64)
    load[8:16] = [8, 7, 6, 5, 4, 3, 2, 1]  # device 1; contiguous chunks: 15, 11, 7, 3
    bal = assignment.balanced_slots(load, 8, 4)
    assert all(sorted(r) == list(range(8)) for r in bal)  # equal chunks, each slot once
    np.testing.assert_array_equal(np.bincount(bal[1] // 2, load[8:16], 4), [9, 9, 9, 9])
    for bad, match in (([[0] * 8] * 7, "shape"), ([[0] * 7 + [4]] * 8, "chunk id 4")):
        with pytest.raises(ConfigError, match=match):
            make_config(H8, MODEL, pn=4, chunk_assignment=bad)
    with pytest.raises(ConfigError, match="tp-tp"):
        make_config(H8, MODEL, mode="tp-tp", chunk_assignment=[[0] * 8] * 8)
