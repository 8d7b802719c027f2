"""The model and platform catalogs: every entry loads, paper values match, bad TOML is rejected."""

from __future__ import annotations

import pytest

from moejax.catalog.hardware import load_platform, platform_names
from moejax.catalog.models import MODELS, load_model, model_names, with_overrides
from moejax.errors import ConfigError, UnknownNameError

MODEL_NAMES = [
    # 000 Table I
    "phi-3.5-moe",
    "yuan2.0-m32",
    "deepseek-moe-16b",
    "qwen3-30b-a3b",
    # 001 Table I
    "deepseek-v3",
    "qwen3-235b-a22b",
    "deepseek-v2",
    "dbrx",
    "mixtral-8x22b",
    # 002, 003
    "mixtral-8x7b",
    "snowflake-arctic",
    # 004 Table I
    "dysharp-s",
    "dysharp-m",
    "dysharp-l",
    # 004 §VII-B
    "gpt-oss-120b",
]
PLATFORM_NAMES = [
    # 000
    "chiplet-2x2",
    "chiplet-3x3",
    "chiplet-4x4",
    # 001
    "wsc-4x4",
    "wsc-6x6",
    "wsc-8x8",
    "wsc-4x8x8",
    "dgx-b200-1node",
    "dgx-b200-4node",
    "dgx-b200-8node",
    "nvl72",
    # 002
    "a100x8-nvswitch",
    "a100x16-2node",
    # 003
    "h800x4",
    "h800x8",
    # 004
    "gh200-nvl32",
    "gh200-nvl64",
    "gh200-nvl4",  # Fig. 21 scale points
    "gh200-nvl8",
    "gh200-nvl16",
    "dgx-h100",  # Fig. 29
]


# --- models -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_loads(name):
    m = load_model(name)
    assert m.name == name
    assert m.source
    assert m.expert_weight_bytes > 0 and m.expert_flops_per_token > 0


def test_model_names_are_exactly_the_catalog():
    assert sorted(MODEL_NAMES) == model_names() == sorted(MODELS)


# (name, field, value the paper gives, where)
PAPER_MODEL_VALUES = [
    # 000 Table I: D_model, D_ffn, E, E^act, Head, Para.
    ("phi-3.5-moe", "hidden_size", 4096, "000 Table I"),
    ("phi-3.5-moe", "expert_ffn_size", 3200, "000 Table I"),
    ("phi-3.5-moe", "num_experts", 16, "000 Table I"),
    ("phi-3.5-moe", "top_k", 2, "000 Table I"),
    ("phi-3.5-moe", "num_heads", 32, "000 Table I"),
    ("phi-3.5-moe", "total_params", 41.9e9, "000 Table I"),
    ("yuan2.0-m32", "hidden_size", 2048, "000 Table I"),
    ("yuan2.0-m32", "expert_ffn_size", 4096, "000 Table I"),
    ("yuan2.0-m32", "num_experts", 32, "000 Table I"),
    ("yuan2.0-m32", "top_k", 2, "000 Table I"),
    ("yuan2.0-m32", "num_heads", 16, "000 Table I"),
    ("yuan2.0-m32", "total_params", 40e9, "000 Table I"),
    ("deepseek-moe-16b", "hidden_size", 2048, "000 Table I"),
    ("deepseek-moe-16b", "expert_ffn_size", 1408, "000 Table I"),
    ("deepseek-moe-16b", "num_experts", 64, "000 Table I"),
    ("deepseek-moe-16b", "top_k", 6, "000 Table I (6+2)"),
    ("deepseek-moe-16b", "num_shared_experts", 2, "000 Table I (6+2)"),
    ("deepseek-moe-16b", "num_heads", 16, "000 Table I"),
    ("deepseek-moe-16b", "total_params", 16.4e9, "000 Table I"),
    ("qwen3-30b-a3b", "hidden_size", 2048, "000 Table I"),
    ("qwen3-30b-a3b", "expert_ffn_size", 768, "000 Table I"),
    ("qwen3-30b-a3b", "num_experts", 128, "000 Table I"),
    ("qwen3-30b-a3b", "top_k", 8, "000 Table I"),
    ("qwen3-30b-a3b", "num_heads", 32, "000 Table I"),
    ("qwen3-30b-a3b", "total_params", 30e9, "000 Table I"),
    # 001 Table I: Size, Layers sparse / total, Experts activated / total
    ("deepseek-v3", "total_params", 671e9, "001 Table I"),
    ("deepseek-v3", "num_sparse_layers", 58, "001 Table I"),
    ("deepseek-v3", "num_layers", 61, "001 Table I"),
    ("deepseek-v3", "top_k", 8, "001 Table I"),
    ("deepseek-v3", "num_experts", 256, "001 Table I"),
    ("qwen3-235b-a22b", "total_params", 235e9, "001 Table I"),
    ("qwen3-235b-a22b", "num_sparse_layers", 94, "001 Table I"),
    ("qwen3-235b-a22b", "num_layers", 94, "001 Table I"),
    ("qwen3-235b-a22b", "top_k", 8, "001 Table I"),
    ("qwen3-235b-a22b", "num_experts", 128, "001 Table I"),
    ("deepseek-v2", "total_params", 236e9, "001 Table I"),
    ("deepseek-v2", "num_sparse_layers", 59, "001 Table I"),
    ("deepseek-v2", "num_layers", 60, "001 Table I"),
    ("deepseek-v2", "top_k", 6, "001 Table I"),
    ("deepseek-v2", "num_experts", 160, "001 Table I"),
    ("dbrx", "total_params", 132e9, "001 Table I"),
    ("dbrx", "num_sparse_layers", 40, "001 Table I"),
    ("dbrx", "num_layers", 40, "001 Table I"),
    ("dbrx", "top_k", 4, "001 Table I"),
    ("dbrx", "num_experts", 16, "001 Table I"),
    ("mixtral-8x22b", "total_params", 141e9, "001 Table I"),
    ("mixtral-8x22b", "num_sparse_layers", 56, "001 Table I"),
    ("mixtral-8x22b", "num_layers", 56, "001 Table I"),
    ("mixtral-8x22b", "top_k", 2, "001 Table I"),
    ("mixtral-8x22b", "num_experts", 8, "001 Table I"),
    # 002 Fig. 4: "Mixtral 8x7B has 32 decoding blocks and 8 experts per block"
    ("mixtral-8x7b", "num_layers", 32, "002 Fig. 4"),
    ("mixtral-8x7b", "num_experts", 8, "002 Fig. 4"),
    # 004 Table I: Hidden, MoE hidden, Heads, Experts (top-k 8 of {8, 16, 32})
    ("dysharp-s", "hidden_size", 2048, "004 Table I"),
    ("dysharp-s", "expert_ffn_size", 512, "004 Table I"),
    ("dysharp-s", "num_heads", 32, "004 Table I"),
    ("dysharp-s", "num_experts", 64, "004 Table I"),
    ("dysharp-m", "hidden_size", 4096, "004 Table I"),
    ("dysharp-m", "expert_ffn_size", 1024, "004 Table I"),
    ("dysharp-m", "num_heads", 64, "004 Table I"),
    ("dysharp-m", "num_experts", 128, "004 Table I"),
    ("dysharp-l", "hidden_size", 7168, "004 Table I"),
    ("dysharp-l", "expert_ffn_size", 2048, "004 Table I"),
    ("dysharp-l", "num_heads", 128, "004 Table I"),
    ("dysharp-l", "num_experts", 256, "004 Table I"),
    ("dysharp-l", "top_k", 8, "004 §V-B"),
]


@pytest.mark.parametrize(
    "name,field,value,where",
    PAPER_MODEL_VALUES,
    ids=[f"{n}-{f}" for n, f, _, _ in PAPER_MODEL_VALUES],
)
def test_model_matches_paper(name, field, value, where):
    assert getattr(load_model(name), field) == value, where


# 001 Table I "Single Expert Size" (MB): the INT8 (1 byte) size of one expert, in MiB.
@pytest.mark.parametrize(
    "name,mib",
    [
        ("deepseek-v3", 42),
        ("qwen3-235b-a22b", 18),
        ("deepseek-v2", 23),
        ("dbrx", 189),
        ("mixtral-8x22b", 288),
    ],
)
def test_001_single_expert_size(name, mib):
    assert load_model(name).expert_weight_bytes / 2**20 == pytest.approx(mib, abs=0.51)


@pytest.mark.parametrize("name", ["deepseek-v2", "deepseek-v3", "dysharp-l"])
def test_mla_models(name):
    m = load_model(name)
    assert (m.attention_kind, m.kv_lora_rank, m.head_dim) == ("MLA", 512, 192)
    assert m.num_kv_heads == m.num_heads


def test_dysharp_top_k_candidates_via_overrides():
    for k in (8, 16, 32):  # 004 Table I topk candidates
        assert with_overrides(load_model("dysharp-m"), top_k=k).top_k == k


def test_unknown_model_lists_known_names():
    with pytest.raises(UnknownNameError) as e:
        load_model("qwen3-30b")
    msg = str(e.value)
    assert "qwen3-30b" in msg and "qwen3-30b-a3b" in msg and "mixtral-8x7b" in msg


# --- platforms ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", PLATFORM_NAMES)
def test_every_platform_loads(name):
    p = load_platform(name)
    assert p.name == name
    assert p.source and p.description
    assert p.device.memory_Bps > 0 and p.topology.link_Bps > 0


def test_platform_names_contain_all_21():
    names = platform_names()
    assert len(PLATFORM_NAMES) == 21
    assert set(PLATFORM_NAMES) <= set(names)


@pytest.mark.parametrize("name", PLATFORM_NAMES)
def test_num_devices_matches_topology(name):
    p = load_platform(name)
    t = p.topology
    expected = {
        "ring": p.num_devices,
        "switch": p.num_devices,
        "mesh2d": t.rows * t.cols,
        "multi_wafer_mesh": t.rows * t.cols * t.wafer_rows * t.wafer_cols,
        "hierarchical": t.nodes * t.devices_per_node,
    }[t.kind]
    assert p.num_devices == expected


# (platform, dotted field, value, where): what the papers state, converted to SI per direction.
PAPER_PLATFORM_VALUES = [
    ("chiplet-2x2", "num_devices", 4, "000 §VI-A 2x2"),
    ("chiplet-2x2", "device.memory_Bps", 25.6e9, "000 Table I DDR 4x25.6 GB/s"),
    ("chiplet-2x2", "device.flops:int8", 4.865e12, "000 Table I 4.865 TOPS"),
    ("chiplet-2x2", "device.area_mm2", pytest.approx(2.69 * 4.72), "000 Table I"),
    ("chiplet-2x2", "topology.kind", "mesh2d", "000 Table I 2D mesh"),
    ("chiplet-2x2", "topology.link_Bps", 288e9, "000 Table I UCIe 288 GB/s"),
    ("chiplet-2x2", "topology.hop_latency_s", 4.02e-9, "000 Table I FDI-to-FDI 4.02 ns"),
    ("chiplet-3x3", "num_devices", 9, "000 §VI-E"),
    ("chiplet-4x4", "num_devices", 16, "000 §VI-E"),
    ("chiplet-4x4", "topology.link_Bps", 288e9, "000 Table I"),
    ("wsc-4x4", "num_devices", 16, "001 §VI-A"),
    ("wsc-4x4", "device.flops:fp16", 2250e12, "001 §VI-A 2250 TFLOPS@FP16"),
    ("wsc-4x4", "device.memory_capacity_bytes", 180e9, "001 §VI-A 180GB HBM"),
    ("wsc-4x4", "device.memory_Bps", 8e12, "001 §VI-A 8TB/s"),
    ("wsc-4x4", "topology.bidi_link_Bps", 8e12, "001 §VI-A 8TB/s bidirectional per die"),
    ("wsc-6x6", "num_devices", 36, "001 §VI-B"),
    ("wsc-8x8", "num_devices", 64, "001 §VI-B"),
    ("wsc-4x8x8", "num_devices", 256, "001 §VI-D four 8x8 wafers"),
    ("wsc-4x8x8", "topology.bidi_border_Bps", 9e12, "001 §VI-A 9TB/s per border"),
    ("wsc-4x8x8", "topology.bidi_link_Bps", 8e12, "001 §VI-A"),
    ("dgx-b200-4node", "num_devices", 32, "001 §I 4 nodes (32 GPUs)"),
    ("dgx-b200-4node", "topology.devices_per_node", 8, "001 §VI-B 8 devices per node"),
    ("dgx-b200-8node", "topology.nodes", 8, "001 §VI-B 8-node DGX"),
    ("dgx-b200-8node", "topology.bidi_link_Bps", 1.8e12, "001 §I NVLink 1.8 TB/s"),
    ("nvl72", "num_devices", 72, "001 §VI-D"),
    ("nvl72", "topology.bidi_link_Bps", 1.8e12, "001 §I NVLink 1.8 TB/s"),
    ("a100x8-nvswitch", "num_devices", 8, "002 Table 3"),
    ("a100x8-nvswitch", "device.memory_capacity_bytes", 80e9, "002 Table 3 A100-80GB"),
    ("a100x8-nvswitch", "topology.bidi_link_Bps", 600e9, "002 Table 3 600 GB/s per GPU"),
    ("a100x16-2node", "num_devices", 16, "002 §5.2"),
    ("a100x16-2node", "device.memory_capacity_bytes", 40e9, "002 Table 2 A100-40GB"),
    ("a100x16-2node", "topology.bidi_link_Bps", 600e9, "002 Table 2 600 GB/s per GPU"),
    ("a100x16-2node", "topology.node_inter_bits", 4 * 100e9, "002 Table 2 4 x 100 Gbps EFA"),
    ("h800x4", "num_devices", 4, "003 Table 1 footnote"),
    ("h800x8", "num_devices", 8, "003 Table 1 footnote"),
    ("h800x8", "device.memory_capacity_bytes", 80e9, "003 H800-80GB"),
    ("h800x8", "device.sm_count", 132, "003 Table 6"),
    ("gh200-nvl32", "num_devices", 32, "004 §V-A NVL32"),
    ("gh200-nvl32", "topology.bidi_link_Bps", 900e9, "004 §V-A NVLink 900 GB/s"),
    ("gh200-nvl32", "topology.hop_latency_s", 2 * 250e-9, "004 §V-A 250 ns per NVLink"),
    ("gh200-nvl32", "topology.in_switch_compute", True, "004 §II-C NVLS"),
    ("gh200-nvl32", "packet.flit_bytes", 16, "004 §V-A flit 16B"),
    ("gh200-nvl32", "packet.payload_efficiency", pytest.approx(0.80), "004 §III-A ideal 80%"),
    ("gh200-nvl64", "num_devices", 64, "004 §VI-C1"),
    ("gh200-nvl64", "topology.in_switch_compute", True, "004 §VI-C1"),
]


def _field(p, dotted):
    """One platform value; a few derived ones convert the schema back to the paper's units."""
    t = p.topology
    derived = {
        "topology.bidi_link_Bps": lambda: 2 * t.link_Bps,
        "topology.bidi_border_Bps": lambda: 2 * t.border_Bps,
        "topology.node_inter_bits": lambda: 8 * t.inter_Bps * t.devices_per_node,
        "packet.payload_efficiency": lambda: 1 - p.packet.header_bytes / p.packet.packet_bytes,
    }
    if dotted in derived:
        return derived[dotted]()
    if dotted.startswith("device.flops:"):
        return p.device.flops(dotted.split(":")[1])
    obj = p
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize(
    "name,field,value,where",
    PAPER_PLATFORM_VALUES,
    ids=[f"{n}-{f}" for n, f, _, _ in PAPER_PLATFORM_VALUES],
)
def test_platform_matches_paper(name, field, value, where):
    assert _field(load_platform(name), field) == value, where


def test_chiplet_arrays_share_the_die():
    base = load_platform("chiplet-2x2").device
    for name in ("chiplet-3x3", "chiplet-4x4"):
        assert load_platform(name).device == base


def test_unknown_platform_lists_known_names():
    with pytest.raises(UnknownNameError) as e:
        load_platform("chiplet-5x5")
    msg = str(e.value)
    assert "chiplet-5x5" in msg and "chiplet-2x2" in msg and "gh200-nvl32" in msg


# --- bad TOML -----------------------------------------------------------------------------

GOOD = """\
family = "chiplet"
description = "test"
source = "test"
num_devices = 4

[device]
onchip_buffer_bytes = 8e6
memory_capacity_bytes = 32e9
memory_Bps = 25.6e9

[device.peak_flops]
bf16 = 4.865e12

[topology]
kind = "mesh2d"
link_Bps = 288e9
hop_latency_s = 4.02e-9
rows = 2
cols = 2
"""


def _write(tmp_path, text, name="bad.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_good_temp_toml_loads(tmp_path):
    p = load_platform(str(_write(tmp_path, GOOD, "good.toml")))
    assert p.name == "good" and p.num_devices == 4


@pytest.mark.parametrize(
    "old,new,key,what",
    [
        ("rows = 2\n", "rows = 2\nrow_count = 2\n", "row_count", "unknown key"),
        ("memory_Bps = 25.6e9\n", "memory_Bps = 25.6e9\nddr_Bps = 1.0\n", "ddr_Bps", "unknown key"),
        ("memory_Bps = 25.6e9\n", "", "memory_Bps", "missing key"),
        ('kind = "mesh2d"\n', "", "kind", "missing key"),
        ("cols = 2\n", "", "cols", "missing key"),
        ("num_devices = 4", 'num_devices = "4"', "num_devices", "must be an integer"),
        ("link_Bps = 288e9", 'link_Bps = "288 GB/s"', "link_Bps", "must be a finite number"),
        ("rows = 2", "rows = 2.0", "rows", "must be an integer"),
        ("link_Bps = 288e9", "link_Bps = 0", "link_Bps", "must be > 0"),
        ("link_Bps = 288e9", "link_Bps = -288e9", "link_Bps", "must be > 0"),
        ("memory_Bps = 25.6e9", "memory_Bps = 0.0", "memory_Bps", "must be > 0"),
        ('kind = "mesh2d"', 'kind = "torus"', "kind", "allowed: ring, mesh2d"),
        ("num_devices = 4", "num_devices = 6", "num_devices", "topology has 4 devices"),
    ],
)
def test_bad_toml_names_file_and_key(tmp_path, old, new, key, what):
    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(ConfigError) as e:
        load_platform(str(path))
    msg = str(e.value)
    assert str(path) in msg
    assert key in msg
    assert what in msg


def test_bad_toml_syntax_names_file(tmp_path):
    path = _write(tmp_path, GOOD.replace("rows = 2", "rows = "))
    with pytest.raises(ConfigError, match="not valid TOML") as e:
        load_platform(str(path))
    assert str(path) in str(e.value)
