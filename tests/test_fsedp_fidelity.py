"""FSE-DP readings of issue 14: any-die DDR loading (000 Rule 4 / Algorithm 1 line 12) and
per-link D2D accounting, against the plain reference, conservation and the incidence matrix."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import make_model, make_platform, random_trace

from moejax.errors import ConfigError
from moejax.systems import fsedp
from moejax.systems.fsedp import layer, reference

BUF = 4e5  # as tests/test_fsedp.py: 8 micro-slices of the tiny model's experts at M = 4


def _cfg(rows=2, cols=2, ablation="A3", **kw):
    return fsedp.make_config(make_platform("mesh2d", rows=rows, cols=cols),
                             make_model(num_experts=8, top_k=2), ablation=ablation,
                             weight_buffer_bytes=BUF, **kw)


def _tok(cfg, seed, n=12):
    tr = random_trace(jax.random.key(seed), 1, 1, 1, n, cfg.model.num_experts, cfg.model.top_k)
    return layer.tokens_per_die(cfg, tr.expert_ids[0, 0, 0], tr.token_mask[0, 0],
                                tr.counts[0, 0, 0])


CASES = [
    dict(ddr_loading="any", d2d="sender"),
    dict(ddr_loading="trajectory", d2d="link"),
    dict(ddr_loading="any", d2d="link"),
    dict(ddr_loading="any", d2d="link", ablation="A4"),
    dict(ddr_loading="any", d2d="link", rows=3, cols=3),
]


@pytest.mark.parametrize("case", CASES)
def test_new_readings_match_plain_reference(case):
    cfg = _cfg(**case)
    tok = _tok(cfg, 1, n=9 if case.get("rows") == 3 else 12)
    got = jax.jit(lambda t: layer.simulate_layer(cfg, 4.0, t, t.sum(0)))(tok)
    ref = reference.simulate_layer(cfg, 4.0, np.asarray(tok))
    assert bool(got["finished"]) and ref["finished"]
    np.testing.assert_allclose(float(got["latency_s"]), ref["latency_s"], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got["busy_s"]), ref["busy_s"], rtol=1e-4, atol=1e-10)
    np.testing.assert_allclose(np.asarray(got["peak_weight_bytes"]), ref["peak_weight_bytes"],
                               rtol=1e-5)


@pytest.mark.parametrize("d2d", ["sender", "link"])
def test_any_die_loading_conserves_ddr_bytes_and_spreads_them(d2d):
    any_, traj = _cfg(ddr_loading="any", d2d=d2d), _cfg(d2d=d2d)
    tok = _tok(any_, 3, n=6)  # few tokens: small trajectories
    active = np.asarray(tok.sum(0) > 0)
    w = any_.model.expert_weight_bytes
    outs = {}
    for name, cfg in (("any", any_), ("traj", traj)):
        out = layer.simulate_layer(cfg, 4.0, tok, tok.sum(0))
        busy = np.asarray(out["busy_s"])
        np.testing.assert_allclose(busy[:, 1].sum() * cfg.ddr_Bps, active.sum() * w, rtol=1e-4)
        outs[name] = busy[:, 1]
    # any-die loading balances the channels at least as well as trajectory-only loading
    assert outs["any"].max() <= outs["traj"].max() * (1 + 1e-5)


def test_per_link_d2d_loads_equal_the_incidence_matrix():
    for kw in (dict(), dict(ddr_loading="any"), dict(rows=3, cols=3, ddr_loading="any")):
        cfg = _cfg(d2d="link", **kw)
        snd = _cfg(d2d="sender", **kw)
        tok = _tok(cfg, 4, n=9)
        member = np.asarray(tok.T > 0)
        w = cfg.model.expert_weight_bytes
        flows = np.asarray(layer.d2d_flows(cfg, member, w))  # [E, D, D]
        inc = cfg.topo.incidence()
        send = np.asarray(layer.expert_demands(cfg, 4.0, tok)[3]) * cfg.link_Bps  # [E, Lk]
        np.testing.assert_allclose(send, np.einsum("esd,sdl->el", flows, inc), rtol=1e-5,
                                   atol=1e-3)
        # the same bytes x hops as the sender accounting, spread over the route's links
        send_s = np.asarray(layer.expert_demands(snd, 4.0, tok)[3]) * snd.link_Bps
        np.testing.assert_allclose(send.sum(-1), send_s.sum(-1), rtol=1e-5)
        # ring flows: every trajectory die sends W (|T_e| - 1) / |T_e| to its successor
        n_t = member.sum(-1)
        ring = flows.sum(-1)[member]
        np.testing.assert_allclose(ring, np.repeat(w * (n_t - 1) / np.maximum(n_t, 1), n_t),
                                   rtol=1e-5)


def test_bad_readings_name_the_field():
    with pytest.raises(ConfigError, match="ddr_loading"):
        _cfg(ddr_loading="nearest")
    with pytest.raises(ConfigError, match="d2d"):
        _cfg(d2d="bus")
