"""Trace generators, on-disk format and summaries (moejax.trace.gen / io / summary)."""

from __future__ import annotations

import json
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.errors import ConfigError, MoejaxError, TraceError, UnknownNameError
from moejax.trace import core, families, gen, io, requests, summary

# One shape for every generated trace keeps the number of compilations small.
SHAPE = dict(iterations=24, layers=3, tokens=48, num_experts=16, top_k=2)
T = 3
FAMILY_SPECS = {
    "uniform": "uniform",
    "powerlaw": "powerlaw:alpha=1.5",
    "exponential": "exponential:scale=0.5",
    "normal": "normal:std=0.02",
    "drift": "drift:period=8,scenarios=2",
}


def key(seed=0):
    return jax.random.key(seed)


@pytest.fixture(scope="module")
def traces():
    return {
        name: gen.generate(s, key(1), num_traces=T, **SHAPE) for name, s in FAMILY_SPECS.items()
    }


@pytest.fixture(scope="module")
def masked():
    tpi = np.tile(np.arange(SHAPE["iterations"]) * 2 % (SHAPE["tokens"] + 1), (T, 1))
    tpi[1, 0] = SHAPE["tokens"]
    return tpi, gen.generate("powerlaw", key(2), num_traces=T, tokens_per_iteration=tpi, **SHAPE)


def leaves_equal(a: core.Trace, b: core.Trace) -> bool:
    return (a.num_experts, a.top_k) == (b.num_experts, b.top_k) and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


# ------------------------------------------------------------------------ specs


def test_parse_spec_fills_defaults_and_round_trips():
    s = gen.parse_spec("powerlaw")
    assert s == gen.GenSpec("powerlaw", {"alpha": 1.5})
    assert gen.spec_to_str(s) == "powerlaw:alpha=1.5"
    for text in [*FAMILY_SPECS.values(), "drift:rho=0.9,switches=40/80", "normal:std=0.01"]:
        spec = gen.parse_spec(text)
        assert gen.parse_spec(gen.spec_to_str(spec)) == spec
        hash(spec)
    assert gen.parse_spec("drift:switches=3/5")["switches"] == (3, 5)
    assert gen.parse_spec(" Normal : std = 0.05 ")["std"] == 0.05


@pytest.mark.parametrize(
    "text, words",
    [
        ("powerlaw:alpha=abc", ["powerlaw:alpha", "abc", "> 0"]),
        ("powerlaw:alpha=-1", ["powerlaw:alpha", "> 0"]),
        ("powerlaw:alpha=0", ["powerlaw:alpha", "> 0"]),
        ("powerlaw:alpha=nan", ["powerlaw:alpha"]),
        ("powerlaw:beta=2", ["beta", "alpha"]),
        ("powerlaw:alpha", ["alpha", "name=value"]),
        ("powerlaw:alpha=1,alpha=2", ["alpha", "twice"]),
        ("uniform:alpha=1", ["alpha", "none"]),
        ("normal:std=-0.1", ["normal:std", ">= 0"]),
        ("drift:rho=1", ["drift:rho", "[0, 1)"]),
        ("drift:scenarios=1.5", ["drift:scenarios", "int"]),
        ("drift:switches=5/3", ["drift:switches", "increasing"]),
        ("", ["families", "uniform", "powerlaw"]),
    ],
)
def test_bad_spec_names_the_param(text, words):
    with pytest.raises(ConfigError) as err:
        gen.parse_spec(text)
    for w in words:
        assert w in str(err.value)


def test_unknown_family_lists_known_ones():
    with pytest.raises(UnknownNameError) as err:
        gen.parse_spec("zipff:alpha=1")
    msg = str(err.value)
    assert "zipff" in msg
    for fam in families.FAMILIES:
        assert fam in msg
    assert isinstance(err.value, MoejaxError)


# ------------------------------------------------------------------- generation


def test_same_key_same_trace_different_key_differs(traces):
    again = gen.generate(FAMILY_SPECS["powerlaw"], key(1), num_traces=T, **SHAPE)
    assert leaves_equal(again, traces["powerlaw"])
    other = gen.generate(FAMILY_SPECS["powerlaw"], key(7), num_traces=T, **SHAPE)
    assert not np.array_equal(other.expert_ids, again.expert_ids)
    assert not np.array_equal(traces["powerlaw"][0].expert_ids, traces["powerlaw"][1].expert_ids)


def test_vmapped_generation_equals_per_key_loop():
    batch = gen.generate("drift:period=8", key(3), num_traces=T, **SHAPE)
    for t, k in enumerate(jax.random.split(key(3), T)):
        single = gen.generate_one("drift:period=8", k, **SHAPE)
        np.testing.assert_array_equal(batch.expert_ids[t], single.expert_ids)
        np.testing.assert_array_equal(batch.counts[t], single.counts)
        np.testing.assert_allclose(batch.gate_weights[t], single.gate_weights, rtol=1e-6)


@pytest.mark.parametrize("family", list(FAMILY_SPECS))
def test_trace_is_valid_and_consistent(traces, family):
    tr = traces[family]
    core.validate(tr)
    e, k = SHAPE["num_experts"], SHAPE["top_k"]
    assert tr.batch_shape == (T,)
    assert tr.expert_ids.shape == (T, SHAPE["iterations"], SHAPE["layers"], SHAPE["tokens"], k)
    ids = np.asarray(tr.expert_ids)
    assert ids.min() >= 0 and ids.max() < e
    # counts == sum of one-hot ids
    onehot = (ids[..., None] == np.arange(e)).sum(axis=(-3, -2))
    np.testing.assert_array_equal(np.asarray(tr.counts), onehot)
    # no expert twice in one token
    assert (np.diff(np.sort(ids, -1), axis=-1) != 0).all()
    w = np.asarray(tr.gate_weights)
    assert (w > 0).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    assert (np.asarray(tr.token_request) == -1).all()


def test_token_mask_respected(masked):
    tpi, tr = masked
    core.validate(tr)
    mask = np.asarray(tr.token_mask)
    np.testing.assert_array_equal(mask.sum(-1), tpi)
    np.testing.assert_array_equal(np.asarray(tr.tokens_per_iteration()), tpi)
    pad = ~mask[:, :, None, :, None] & np.ones(tr.expert_ids.shape, bool)
    assert (np.asarray(tr.expert_ids)[pad] == -1).all()
    assert (np.asarray(tr.gate_weights)[pad] == 0).all()
    per_layer = np.asarray(tr.counts).sum(-1)  # [T, I, L]
    np.testing.assert_array_equal(per_layer, np.broadcast_to(tpi[..., None] * 2, per_layer.shape))
    shared = gen.generate("powerlaw", key(2), num_traces=T, tokens_per_iteration=tpi[0], **SHAPE)
    np.testing.assert_array_equal(np.asarray(shared.token_mask).sum(-1)[2], tpi[0])


def load_skew(tr: core.Trace) -> float:
    return summary.summarize(tr)["skew"]


def test_uniform_is_balanced(traces):
    s = summary.summarize(traces["uniform"])
    assert s["skew"] < 1.1
    assert s["entropy"] > 0.999
    assert s["gini"] < 0.03


def test_powerlaw_skew_grows_with_alpha():
    alphas = [0.5, 1.0, 1.5, 2.0, 2.5]
    skews = [
        load_skew(gen.generate(f"powerlaw:alpha={a}", key(4), num_traces=T, **SHAPE))
        for a in alphas
    ]
    assert all(b > a for a, b in zip(skews, skews[1:], strict=False)), skews
    assert skews[0] > 1.1
    # exact popularity: p(rank r) ∝ (r + 1)^-alpha, on a different permutation per layer
    p = np.asarray(
        gen.popularity("powerlaw:alpha=1.5", key(5), iterations=2, layers=4, num_experts=8)
    )
    want = np.arange(1, 9) ** -1.5
    np.testing.assert_allclose(
        np.sort(p, -1)[..., ::-1], np.broadcast_to(want / want.sum(), p.shape), rtol=1e-5
    )
    np.testing.assert_array_equal(p[0], p[1])  # fixed over iterations
    assert len({tuple(np.argsort(p[0, l])) for l in range(4)}) > 1


def test_exponential_ratio_between_ranks():
    e, scale = 16, 0.25
    p = np.asarray(
        gen.popularity(f"exponential:scale={scale}", key(6), iterations=1, layers=3, num_experts=e)
    )
    ranked = np.sort(p, -1)[..., ::-1]
    np.testing.assert_allclose(
        ranked[..., 1:] / ranked[..., :-1], np.exp(-1 / (scale * e)), rtol=1e-4
    )
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("std", [0.01, 0.032, 0.05])
def test_normal_std_of_expert_probabilities(std):
    p = np.asarray(
        gen.popularity(f"normal:std={std}", key(8), iterations=1, layers=400, num_experts=8)
    )
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
    measured = np.sqrt(np.mean(np.var(p, axis=-1)))
    assert abs(measured - std) < 0.08 * std, measured


def test_normal_floor_clips_and_renormalizes():
    p = np.asarray(
        gen.popularity(
            "normal:std=0.3,floor=0.001", key(9), iterations=1, layers=50, num_experts=16
        )
    )
    assert (p > 0).all()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)


def tv(a, b):
    return 0.5 * np.abs(a - b).sum(-1).max()


def test_drift_stabilizes_after_warmup_and_moves_at_a_switch():
    spec = "drift:rho=0.8,noise=0.02,scale=1.0,scenarios=2,switches=60"
    p = np.asarray(gen.popularity(spec, key(10), iterations=120, layers=4, num_experts=8))
    np.testing.assert_array_equal(gen.scenario_of_iteration(spec, 120), np.arange(120) >= 60)
    warm = [tv(p[i], p[i - 10]) for i in range(30, 60)]
    assert max(warm) < 0.06, max(warm)  # stable within scenario 0 after warm-up
    assert tv(p[0], p[40]) > 3 * max(warm)  # warm-up from uniform
    assert tv(p[50], p[110]) > 3 * max(warm)  # the switch moved the ratios
    settled = [tv(p[i], p[i - 10]) for i in range(90, 120)]
    assert max(settled) < 0.06
    # scenarios cycle: a switch back returns to scenario 0's ratios
    spec2 = "drift:rho=0.8,noise=0.0,scenarios=2,period=40"
    q = np.asarray(gen.popularity(spec2, key(10), iterations=120, layers=4, num_experts=8))
    assert tv(q[39], q[119]) < 0.01 < tv(q[39], q[79])


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(top_k=17), "top_k"),
        (dict(top_k=0), "top_k"),
        (dict(tokens=0), "tokens"),
        (dict(num_experts=2.5), "num_experts"),
        (dict(iterations=-1), "iterations"),
        (dict(layers=True), "layers"),
        (dict(num_traces=0), "num_traces"),
        (dict(tokens_per_iteration=[1] * 5), "tokens_per_iteration"),
        (dict(tokens_per_iteration=[49] * 24), "tokens_per_iteration"),
        (dict(tokens_per_iteration=[0.5] * 24), "tokens_per_iteration"),
        (dict(key=123), "key"),
    ],
)
def test_bad_generate_args_name_the_field(kwargs, field):
    args = dict(SHAPE, num_traces=T, key=key(0))
    args.update(kwargs)
    k = args.pop("key")
    with pytest.raises(ConfigError) as err:
        gen.generate("uniform", k, **args)
    assert str(err.value).startswith(field)


def test_counts_only_keeps_counts(traces):
    tr = traces["exponential"]
    c = gen.counts_only(tr)
    core.validate(c)
    assert not c.has_tokens and c.num_tokens == 0
    np.testing.assert_array_equal(c.counts, tr.counts)
    np.testing.assert_allclose(c.tokens_per_iteration(), tr.tokens_per_iteration())


# -------------------------------------------------------------------- requests


def test_request_stream_poisson_and_lengths():
    rate = 50.0
    rs = requests.request_stream(
        key(11),
        num_streams=8,
        num_requests=2000,
        rate_per_s=rate,
        input_range=(30, 70),
        output_range=(70, 130),
    )
    assert rs.arrival_s.shape == (8, 2000) and rs.mask.all()
    gaps = np.diff(np.asarray(rs.arrival_s), axis=-1, prepend=0.0)
    assert (gaps >= 0).all()  # float32 cumsum: nondecreasing
    assert abs(gaps.mean() * rate - 1) < 0.05
    assert abs(gaps.std() * rate - 1) < 0.05  # exponential: std == mean
    for arr, (lo, hi) in [(rs.input_len, (30, 70)), (rs.output_len, (70, 130))]:
        arr = np.asarray(arr)
        assert arr.dtype == np.int32
        assert arr.min() == lo and arr.max() == hi
    again = requests.request_stream(
        key(11), num_streams=8, num_requests=2000, rate_per_s=rate, workload="short"
    )
    np.testing.assert_array_equal(again.input_len, rs.input_len)
    assert not np.array_equal(rs.arrival_s[0], rs.arrival_s[1])


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(rate_per_s=0.0, workload="short"), "rate_per_s"),
        (dict(rate_per_s=1.0, workload="long"), "unknown workload"),
        (dict(rate_per_s=1.0, input_range=(5, 3), output_range=(1, 2)), "input_range"),
        (dict(rate_per_s=1.0, input_range=(1, 3)), "input_range / output_range"),
        (dict(rate_per_s=1.0, workload="short", num_requests=0), "num_requests"),
    ],
)
def test_bad_request_args(kwargs, field):
    args = dict(num_streams=2, num_requests=4)
    args.update(kwargs)
    with pytest.raises(MoejaxError) as err:
        requests.request_stream(key(0), **args)
    assert str(err.value).startswith(field)


# ---------------------------------------------------------------------------- io


def test_save_load_round_trip_bit_exact(tmp_path, masked, traces):
    _, batch = masked
    cases = {
        "batch": batch,
        "single": traces["normal"][1],
        "counts_only": gen.counts_only(traces["drift"])[0],
        "counts_only_batch": gen.counts_only(batch),
    }
    for name, tr in cases.items():
        meta = {"spec": "powerlaw:alpha=1.5", "model": "toy", "case": name}
        path = io.save(tmp_path / f"{name}.npz", tr, meta)
        back, meta_back = io.load(path)
        assert leaves_equal(back, tr), name
        assert meta_back == meta
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.npz" for n in cases)


def test_save_is_atomic_and_rejects_bad_meta(tmp_path, traces):
    path = tmp_path / "t.npz"
    io.save(path, traces["uniform"][0], {"a": 1})
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="meta"):
        io.save(path, traces["uniform"][0], {"a": object()})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]
    assert io.load(path)[1] == {"a": 1}


def rewrite(src, dst, **changes):
    """Copy an npz trace, replacing (or dropping, with None) some arrays."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    for k, v in changes.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    with open(dst, "wb") as f:
        np.savez(f, **arrays)
    return dst


@pytest.fixture(scope="module")
def saved(tmp_path_factory, traces):
    path = tmp_path_factory.mktemp("io") / "good.npz"
    io.save(path, traces["powerlaw"], {"spec": "powerlaw"})
    return path


def test_load_missing_and_not_npz(tmp_path, saved):
    with pytest.raises(TraceError, match="no such file"):
        io.load(tmp_path / "nope.npz")
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(TraceError, match="not a readable .npz"):
        io.load(tmp_path / "text.npz")
    np.save(tmp_path / "arr.npy", np.zeros(3))
    with pytest.raises(TraceError, match="single .npy"):
        io.load(tmp_path / "arr.npy")
    data = saved.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="path"):
        io.load(tmp_path / "trunc.npz")


def test_load_corrupt_member(tmp_path, saved):
    with zipfile.ZipFile(saved) as z:
        info = z.getinfo("expert_ids.npy")
    data = bytearray(saved.read_bytes())
    mid = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
    data[mid : mid + 8] = bytes(8 * [0x5A])
    (tmp_path / "corrupt.npz").write_bytes(bytes(data))
    with pytest.raises(TraceError, match="expert_ids"):
        io.load(tmp_path / "corrupt.npz")


def test_load_wrong_schema_version(tmp_path, saved):
    bad = rewrite(saved, tmp_path / "v.npz", schema_version=np.int64(99))
    with pytest.raises(TraceError) as err:
        io.load(bad)
    msg = str(err.value)
    assert "schema_version" in msg and "99" in msg and f"supported: {core.SCHEMA_VERSION}" in msg


def bad_cases(saved):
    with np.load(saved) as z:
        ids, w, counts = z["expert_ids"], z["gate_weights"], z["counts"]
    ids_oor = ids.copy()
    ids_oor[0, 1, 2, 3, 1] = 16
    w_nan = w.copy()
    w_nan[1, 0, 0, 0, 0] = np.nan
    counts_off = counts.copy()
    counts_off[0, 0, 0, 0] += 1
    return {
        "missing counts": (dict(counts=None), "counts: missing array"),
        "missing meta": (dict(meta=None), "meta: missing array"),
        "ids out of range": (dict(expert_ids=ids_oor), "expert_ids: id 16"),
        "nan weights": (dict(gate_weights=w_nan), "gate_weights: non-finite"),
        "float ids": (dict(expert_ids=ids.astype(np.float32)), "expert_ids: dtype"),
        "int weights": (dict(gate_weights=w.astype(np.int32)), "gate_weights: dtype"),
        "int mask": (
            dict(token_mask=np.ones(ids.shape[:2] + ids.shape[3:4], np.int8)),
            "token_mask: dtype",
        ),
        "weights shape": (dict(gate_weights=w[..., :1]), "gate_weights: expected shape"),
        "counts shape": (dict(counts=counts[..., :3]), "counts: expected shape"),
        "top_k": (dict(top_k=np.int64(3)), "top_k"),
        "top_k > E": (dict(num_experts=np.int64(1)), "top_k"),
        "top_k not scalar": (dict(top_k=np.array([2, 2])), "top_k: expected an integer"),
        "counts mismatch": (dict(counts=counts_off), "counts: do not match"),
        "meta not json": (dict(meta=np.array("{oops")), "meta: not valid JSON"),
    }


def test_load_rejects_bad_arrays_naming_the_field(tmp_path, saved):
    for name, (changes, msg) in bad_cases(saved).items():
        bad = rewrite(saved, tmp_path / "bad.npz", **changes)
        with pytest.raises(TraceError) as err:
            io.load(bad)
        assert str(err.value).startswith(msg), (name, str(err.value))


def test_save_rejects_invalid_trace(tmp_path, traces):
    tr = traces["uniform"][0]
    bad = tr.replace(expert_ids=tr.expert_ids.at[0, 0, 0, 0].set(99))
    with pytest.raises(TraceError, match="expert_ids"):
        io.save(tmp_path / "x.npz", bad)
    stale = tr.replace(counts=tr.counts + 1)
    with pytest.raises(TraceError, match="counts"):
        io.save(tmp_path / "x.npz", stale)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------- summary


def test_activated_experts_match_formula_on_uniform():
    e, k = 16, 2
    tpi = np.tile([1, 2, 4, 8, 16, 48], 4)  # 24 iterations, m from 1 to 48
    tr = gen.generate("uniform", key(12), num_traces=T, tokens_per_iteration=tpi, **SHAPE)
    s = summary.summarize(tr)
    per_m = {}
    active = (np.asarray(tr.counts) > 0).sum(-1)  # [T, I, L]
    for m in (1, 4, 8, 16):
        measured = active[:, tpi == m].mean()
        per_m[m] = measured / summary.activated_experts_expected(m, k, e)
    assert all(abs(r - 1) < 0.05 for r in per_m.values()), per_m
    assert abs(s["activated_experts"] / s["activated_experts_expected"] - 1) < 0.03
    assert summary.activated_experts_expected(1, k, e) == pytest.approx(k)
    assert summary.activated_experts_expected(10**6, k, e) == pytest.approx(e)


def test_summary_closed_forms():
    flat = core.from_counts(np.full((2, 1, 4), 3.0), top_k=1)
    s = summary.summarize(flat)
    assert s["skew"] == 1.0 and s["gini"] == 0.0 and s["entropy"] == pytest.approx(1.0)
    one = core.from_counts(np.array([[[4.0, 0, 0, 0], [1, 1, 1, 1]]]), top_k=1)
    s = summary.summarize(one)
    assert s["skew_per_layer"] == [4.0, 1.0]
    assert s["gini_per_layer"] == [0.75, 0.0]
    assert s["entropy_per_layer"][0] == 0.0
    assert s["activated_experts_per_layer"] == [1.0, 4.0]
    assert s["load"] == [5 / 8, 1 / 8, 1 / 8, 1 / 8]
    json.dumps(s)  # plain Python numbers only
    assert all(isinstance(v, int | float | bool | list) for v in s.values())


def test_summary_of_batch_and_format(traces):
    s = summary.summarize(traces["powerlaw"])
    assert s["num_traces"] == T and s["num_layers"] == SHAPE["layers"]
    assert len(s["load"]) == SHAPE["num_experts"] and sum(s["load"]) == pytest.approx(1.0)
    assert s["skew"] > summary.summarize(traces["uniform"])["skew"]
    text = summary.format_summary(s)
    assert "max/mean" in text and "expected" in text and "layer" in text
    assert len(text.splitlines()) > SHAPE["layers"] + 3
    c = summary.summarize(gen.counts_only(traces["powerlaw"]))
    assert c["load"] == s["load"] and not c["has_tokens"]
    summary.format_summary(c)
    assert summary.summarize(traces["powerlaw"][0])["num_traces"] == 1


def test_exports():
    import moejax.trace as tr

    for name in [
        "generate",
        "parse_spec",
        "GenSpec",
        "save",
        "load",
        "summarize",
        "format_summary",
        "request_stream",
        "WORKLOADS",
        "counts_only",
    ]:
        assert hasattr(tr, name)
    assert tr.WORKLOADS["medium"] == ((50, 150), (50, 250))
    assert jnp.asarray(0).dtype == jnp.int32  # x64 stays off
