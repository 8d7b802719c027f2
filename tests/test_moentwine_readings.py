"""The network readings of the MoEntwine (001) reproduction: each reading reaches the wafer
config, and the Eq. 1 variants the reproduction computes beside the primary reading order as
their definitions say (no serialization <= latency once per port <= every transfer's latency
serialized), on a 4x4 wafer."""

from __future__ import annotations

import pytest

from moejax.reproduce import moentwine as mw


@pytest.mark.parametrize("reading,network,ports", [("eq1", "eq1", "link"),
                                                    ("eq1_device_ports", "eq1", "device"),
                                                    ("cut_through", "link_load", "link")])
def test_each_reading_reaches_the_wafer_config(reading, network, ports):
    cfg = mw.wafer_config("wsc-4x4", mw.model_of("qwen3-235b-a22b"), reading, tp_size=4)
    assert cfg.network == network and cfg.eq1_ports == ports
    assert float(cfg.topo.link_Bps[0]) == pytest.approx(mw.PER_DIE_LINK_BPS)


@pytest.mark.parametrize("mapping", ["baseline", "er"])
def test_eq1_variants_bound_the_primary_all_to_all(mapping):
    var = mw.eq1_variant_all_to_all_s("wsc-4x4", "qwen3-235b-a22b", mapping, 4)
    primary = mw.comm_point("wsc-4x4", "qwen3-235b-a22b", mapping, 4)["all_to_all_s"]
    assert 0 < var["unserialized"] < var["latency_once"] < primary
    # the busiest port carries at least two transfers in dispatch and in combine: the primary
    # reading pays at least one more 100 ns hop latency in each phase
    assert primary - var["latency_once"] >= 2 * 100e-9 - 1e-12
