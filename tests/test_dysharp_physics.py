"""004 DySHARP physics: MLA attention counted from the block's weight shapes, memory-bound
GEMMs not slowed by the comm SMs, fill / drain for the tokens a tile holds, one comm-SM rule
for every schedule that runs comm kernels beside compute (coarse, fine, fused, DualPipe)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moejax.catalog.hardware import load_platform
from moejax.catalog.models import load_model, with_overrides
from moejax.catalog.shapes import attention_shapes, count
from moejax.systems import ep
from moejax.systems.dysharp import reference
from moejax.systems.dysharp import system as dys
from moejax.systems.dysharp.config import DyParams, contiguous_placement, make_config
from moejax.trace import gen


@pytest.mark.parametrize("name", ["dysharp-s", "dysharp-m", "dysharp-l", "gpt-oss-120b"])
def test_reference_attention_from_shapes(name):
    """The reference sums the block's HF weight matrices; the system uses ModelSpec's closed
    form: they agree (MLA: q / kv LoRA, rope, not full multi-head attention)."""
    platform = load_platform("gh200-nvl32")
    model = load_model(name)
    cfg = make_config(platform, model)
    for n_tok in (16 * 32, 8192 * 32):
        want = reference.attention_s(cfg, n_tok)
        got, _ = ep.attention_time_s(ep.make_config(platform, model, attention="dp"),
                                     jnp.float32(n_tok), 0.0)
        assert float(got) == pytest.approx(want, rel=1e-5), (name, n_tok)
    if name == "dysharp-l":  # DeepSeek-V3's MLA block: 187 M weights, not 705 M (full MHA)
        assert count(attention_shapes(model)) == pytest.approx(187.1e6, rel=1e-3)


def test_memory_bound_gemm_ignores_sm_share():
    """A weight-streaming expert GEMM runs at the HBM rate on fewer SMs; a compute-bound one
    slows by the SM share."""
    cfg = make_config(load_platform("gh200-nvl32"),
                      with_overrides(load_model("dysharp-l"), top_k=8), tile_tokens=64)
    g, e = cfg.num_devices, cfg.model.num_experts
    few = jnp.full((g, e), 16.0)  # decode: one 64-row tile per expert, weights dominate
    many = jnp.full((g, e), 65536.0)  # prefill-sized: FLOPs dominate
    share = 112 / 132
    for x_full, x_share in zip(dys.gemm_times_s(cfg, few, 0.0),
                               dys.gemm_times_s(cfg, few, 0.0, share=share), strict=True):
        np.testing.assert_allclose(np.asarray(x_share), np.asarray(x_full), rtol=1e-6)
    for x_full, x_share in zip(dys.gemm_times_s(cfg, many, 0.0),
                               dys.gemm_times_s(cfg, many, 0.0, share=share), strict=True):
        np.testing.assert_allclose(np.asarray(x_share), np.asarray(x_full) / share, rtol=1e-5)


@pytest.fixture(scope="module")
def l8_decode():
    platform = load_platform("gh200-nvl32")
    model = with_overrides(load_model("dysharp-l"), top_k=8)
    tr = gen.generate("normal:std=0.032", jax.random.key(0), num_traces=1, iterations=1,
                      layers=1, tokens=1024, num_experts=model.num_experts, top_k=8)
    args = (tr.expert_ids[0, 0, 0], tr.token_mask[0, 0], tr.counts[0, 0, 0])
    place = jnp.asarray(contiguous_placement(model.num_experts, platform.num_devices))
    return platform, model, args, DyParams(placement=place)


def test_fused_decode_charged_once(l8_decode):
    """Decode at L-8 (16 tokens per GPU): the fused layer is the memory-bound GEMM time at
    full HBM rate (or the port bound) plus one fill / drain of the 16 tokens an expert's tile
    holds, not the GEMMs divided by the SM share plus a full 128-token tile."""
    platform, model, args, params = l8_decode
    cfg = make_config(platform, model, tokens_per_gpu=16)
    out = dys.moe_layer(cfg, params, *args)
    eta = dys.efficiency(cfg)
    occ = 16 * 32 * 8 / 256  # tokens per expert
    fill = dys.tile_terms(cfg, eta, occupancy=occ).fill_drain_s
    port = max(float(out["port_up_bytes"].max()), float(out["port_down_bytes"].max())) / (
        eta * platform.topology.link_Bps)
    ids, mask, counts = args
    n_real = float((mask & (ids >= 0).any(-1)).sum())
    tokens_de = (counts[:, None] * params.placement).T * (16 * 32 / n_real)
    x1, x2 = dys.gemm_times_s(cfg, tokens_de, 0.0, share=cfg.gemm_share)
    want = max(float((x1 + x2).max()), port) + float(fill)
    assert float(out["latency_s"]) == pytest.approx(want, rel=1e-5)
    full_tile = float(dys.tile_terms(cfg, eta).fill_drain_s)
    assert float(out["latency_s"]) < float(out["gemm_s"]) / cfg.gemm_share + full_tile - 1e-6


def test_comm_sms_one_rule(l8_decode):
    """Every schedule whose comm kernels run beside compute pays its comm SMs: a coarse
    pipeline of 2 chunks and DualPipe's block slow down on a compute-bound layer when the comm
    kernels take more SMs; a serial layer and a 1-chunk coarse layer (no overlap) do not."""
    platform, model, args, params = l8_decode
    # tau a Python 0.0: the exact layer without its `lax.cond`, which an eager call compiles anew
    # (both branches) every time
    params = params.replace(tau=0.0)
    big = dict(tokens_per_gpu=65536)  # compute-bound GEMMs

    def lat(key="latency_s", **kw):
        return float(dys.moe_layer(make_config(platform, model, **{**big, **kw}), params,
                                   *args)[key])

    coarse = dict(primitive="unicast_pair", schedule="coarse", chunks=(2,))
    assert lat(**coarse, comm_sms=40) > lat(**coarse, comm_sms=20) * 1.05
    one = dict(primitive="unicast_pair", schedule="coarse", chunks=(1,))
    assert lat(**one, comm_sms=40) == lat(**one, comm_sms=20)
    serial = dict(primitive="unicast_rank", schedule="serial")
    assert lat(**serial, comm_sms=40) == lat(**serial, comm_sms=20)
    assert lat(**one, comm_sms=20) == pytest.approx(lat(**dict(serial, primitive="unicast_pair"),
                                                        comm_sms=20), rel=1e-6)
    out = dys.moe_layer(make_config(platform, model, **big, **serial), params, *args)
    share = (132 - 20) / 132
    # compute-bound block: experts and attention on 112 of 132 SMs beside the comm kernels
    assert float(out["block_dualpipe_s"]) > (float(out["gemm_s"]) + float(out["attention_s"])
                                             ) / share * (1 - 1e-3)


def test_normal_ref_experts_keeps_cv_and_default_stream():
    """`normal:...,ref_experts=E0` keeps the coefficient of variation std x E0 at every E;
    without it (the default) the stream and the spec string are what they were."""
    from moejax.trace import families

    key = jax.random.key(3)
    for e in (64, 256):
        lp = families.log_popularity(("normal", (("ref_experts", 64),)),
                                     {"std": 0.002, "floor": 1e-6}, key, 1, 32, e)
        p = np.exp(np.asarray(lp))[0]
        cv = (p.std(-1) / p.mean(-1)).mean()
        assert cv == pytest.approx(0.002 * 64, rel=0.05), e
    assert gen.spec_to_str(gen.parse_spec("normal:std=0.032")) == "normal:std=0.032,floor=0.0001"
    same = [gen.generate(s, jax.random.key(0), num_traces=1, iterations=1, layers=2, tokens=256,
                         num_experts=256, top_k=8).expert_ids
            for s in ("normal:std=0.032", "normal:std=0.032,ref_experts=256")]
    assert np.array_equal(np.asarray(same[0]), np.asarray(same[1]))


def test_study_ships_routing_sensitivity():
    """Spec §7.7: the study re-judges its time claims under a CV-preserving routing reading
    and uniform routing beside the catalog's absolute one."""
    from moejax.reproduce import dysharp as study

    assert "routing_sensitivity" in [f.name for f in study.STUDY.figures]
    specs = dict(study.READINGS)
    assert specs["absolute"] == study.ROUTING and specs["uniform"] == "uniform"
    assert any("ref_experts=" in s for s in specs.values())
