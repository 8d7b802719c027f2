"""Models from their real configs: the TOML catalog, Hugging Face config.json files, attention
cost per kind (MHA, GQA, MLA, sliding windows), and parameter counts against model cards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from moejax.catalog.hardware import load_platform
from moejax.catalog.hf_config import read_hf_config
from moejax.catalog.models import MODELS, load_model, with_overrides
from moejax.catalog.shapes import attention_shapes, context_macs, count, kv_cache_width
from moejax.cli.main import main
from moejax.errors import ConfigError
from moejax.systems import ep

HF = Path(__file__).parent / "data" / "hf"
ROOT = Path(__file__).resolve().parents[1]


def hf(name: str):
    return load_model(str(HF / name / "config.json"))


# --- published parameter counts ------------------------------------------------------------
# (fixture, total, active, active counts the input embedding?, source). Cards round to two or
# three significant digits and leave norms and biases in; the tolerance below is 3 %.
# DeepSeek and OpenAI count active parameters without the input embedding (a lookup): DeepSeek's
# README_WEIGHTS.md "Activation parameters: 36.6B (including 0.9B for the output Head)", and
# the gpt-oss model card Table 1 (active 5.13B = MLP 3.58 + attention 0.96 + unembedding 0.58).
PUBLISHED = [
    ("deepseek-v3", 671e9, 37e9, False,
     "huggingface.co/deepseek-ai/DeepSeek-V3 model card: 671B total, 37B activated"),
    ("deepseek-v2", 236e9, 21e9, False,
     "huggingface.co/deepseek-ai/DeepSeek-V2 model card: 236B total, 21B activated"),
    ("deepseek-v2-lite", 15.7e9, 2.4e9, False,
     "huggingface.co/deepseek-ai/DeepSeek-V2-Lite model card: 15.7B total, 2.4B activated"),
    ("mixtral-8x7b", 46.7e9, 12.9e9, True,
     "mistral.ai/news/mixtral-of-experts: 46.7B total, 12.9B per token"),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, True,
     "huggingface.co/Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
    ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, True,
     "huggingface.co/Qwen/Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated"),
    ("olmoe-1b-7b", 6.9e9, 1.3e9, True,
     "OLMoE paper (arXiv 2409.02060) Table 1: 6.9B total, 1.3B active"),
    ("dbrx", 132e9, 36e9, True,
     "huggingface.co/databricks/dbrx-instruct model card: 132B total, 36B active"),
    ("gpt-oss-120b", 116.83e9, 5.13e9, False,
     "gpt-oss model card (OpenAI, Aug 2025) Table 1: 116.83B total, 5.13B active"),
    ("phi-3.5-moe", 41.9e9, 6.6e9, True,
     "huggingface.co/microsoft/Phi-3.5-MoE-instruct model card: 42B total, 6.6B active"),
]
TOL = 0.03


@pytest.mark.parametrize("name,total,active,embed,source", PUBLISHED,
                         ids=[p[0] for p in PUBLISHED])
def test_param_counts_match_model_cards(name, total, active, embed, source):
    m = hf(name)
    assert m.param_count() == pytest.approx(total, rel=TOL), source
    assert m.active_param_count(input_embedding=embed) == pytest.approx(active, rel=TOL), source


def test_deepseek_v3_active_count_matches_its_weights_readme_closely():
    # DeepSeek-V3 README_WEIGHTS.md: main model 671B total, 36.6B activated (output head in)
    assert hf("deepseek-v3").active_param_count(input_embedding=False) == pytest.approx(
        36.6e9, rel=0.005)


# Catalog entries that use the public configuration unchanged: same published totals.
CATALOG_PUBLISHED = [
    ("deepseek-v3", 671e9), ("dysharp-l", 671e9), ("deepseek-v2", 236e9),
    ("qwen3-30b-a3b", 30.5e9), ("qwen3-235b-a22b", 235e9), ("mixtral-8x7b", 46.7e9),
    ("mixtral-8x22b", 141e9), ("dbrx", 132e9), ("deepseek-moe-16b", 16.4e9),
]


@pytest.mark.parametrize("name,total", CATALOG_PUBLISHED, ids=[c[0] for c in CATALOG_PUBLISHED])
def test_catalog_param_counts_match_published_totals(name, total):
    assert load_model(name).param_count() == pytest.approx(total, rel=TOL)


# --- attention per kind ---------------------------------------------------------------------


def test_mla_attention_is_its_low_rank_projections():
    # DeepSeek-V2 §2.1 / V3 §2.1.1 shapes: ~149 M (V2) and ~187 M (V3) weights per block,
    # not the 503 M / 705 M of full multi-head attention with 192-wide heads
    for name, expect in (("deepseek-v2", 149.2e6), ("deepseek-v3", 187.1e6),
                         ("dysharp-l", 187.1e6)):
        m = load_model(name)
        assert m.attention_params == pytest.approx(expect, rel=1e-3)
        assert m.attention_weight_bytes == m.attention_params * m.weight_bytes
        assert m.attention_flops_per_token == 2 * m.attention_params
    v3 = hf("deepseek-v3")
    assert attention_shapes(v3) == {
        "q_a_proj": (1536, 7168), "q_b_proj": (128 * 192, 1536),
        "kv_a_proj_with_mqa": (512 + 64, 7168), "kv_b_proj": (128 * (128 + 128), 512),
        "o_proj": (7168, 128 * 128)}
    assert v3.kv_bytes_per_token == (512 + 64) * 2  # latent + shared rope key, bf16


def test_mla_without_q_bottleneck():
    lite = hf("deepseek-v2-lite")  # q_lora_rank null: one q projection
    assert lite.q_lora_rank == 0 and "q_proj" in attention_shapes(lite)
    assert lite.attention_params == count(attention_shapes(lite))


def test_gqa_and_mha_shapes():
    q3 = hf("qwen3-30b-a3b")  # GQA, head_dim 128 with 32 heads > hidden 2048
    assert attention_shapes(q3) == {"q_proj": (4096, 2048), "k_proj": (512, 2048),
                                    "v_proj": (512, 2048), "o_proj": (2048, 4096)}
    assert q3.kv_bytes_per_token == 2 * 4 * 128 * 2
    olmoe = hf("olmoe-1b-7b")
    assert olmoe.attention_kind == "MHA" and olmoe.attention_params == 4 * 2048 * 2048


@pytest.mark.parametrize("name", sorted(MODELS))
def test_closed_forms_equal_the_weight_shapes(name):
    m = load_model(name)
    assert m.attention_params == count(attention_shapes(m))
    assert m.attention_context_flops == 2 * context_macs(m)
    assert m.kv_bytes_per_token == kv_cache_width(m) * m.act_bytes


def test_sliding_window_caps_the_context():
    g = hf("gpt-oss-120b")  # 18 of 36 blocks see 128 tokens
    assert (g.sliding_window, g.sliding_window_layers) == (128, 18)
    assert g.context_tokens(100.0) == 100.0
    assert g.context_tokens(4096.0) == pytest.approx((4096 + 128) / 2)
    assert hf("mixtral-8x7b").context_tokens(4096.0) == 4096.0  # sliding_window null
    assert load_model("gpt-oss-120b").sliding_window_layers == 18


def test_mla_correction_reaches_the_systems():
    """EP's attention time (DySHARP's attention) falls when MLA is counted as MLA."""
    pf, m = load_platform("h800x8"), load_model("deepseek-v3")
    full_mha = with_overrides(m, attention_kind="MHA", q_lora_rank=0, kv_lora_rank=0,
                              qk_rope_head_dim=0, v_head_dim=192)
    t_mla, _ = ep.attention_time_s(ep.make_config(pf, m, attention="dp"), 64.0, 0.0)
    t_mha, _ = ep.attention_time_s(ep.make_config(pf, full_mha, attention="dp"), 64.0, 0.0)
    assert float(t_mla) < 0.5 * float(t_mha)


# --- config.json reading ----------------------------------------------------------------------


@pytest.mark.parametrize("name,family", [
    ("mixtral-8x7b", "mixtral"), ("qwen3-30b-a3b", "qwen3_moe"),
    ("qwen1.5-moe-a2.7b", "qwen2_moe"), ("deepseek-v2", "deepseek_v2"),
    ("deepseek-v3", "deepseek_v3"), ("olmoe-1b-7b", "olmoe"), ("dbrx", "dbrx"),
    ("gpt-oss-120b", "gpt_oss"), ("phi-3.5-moe", "phimoe")])
def test_every_family_reads(name, family):
    m = hf(name)
    assert m.name == name and family in m.source


def test_config_json_agrees_with_the_catalog():
    for cat, fix in (("deepseek-v3", "deepseek-v3"), ("deepseek-v2", "deepseek-v2"),
                     ("qwen3-30b-a3b", "qwen3-30b-a3b"), ("mixtral-8x7b", "mixtral-8x7b"),
                     ("dbrx", "dbrx")):
        a, b = load_model(cat), hf(fix)
        for f in ("hidden_size", "expert_ffn_size", "num_experts", "top_k", "num_shared_experts",
                  "shared_ffn_size", "num_sparse_layers", "num_layers", "dense_ffn_size",
                  "num_heads", "num_kv_heads", "head_dim", "attention_kind", "kv_lora_rank",
                  "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "vocab_size"):
            assert getattr(a, f) == getattr(b, f), (cat, f)


def _write(tmp_path, data) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    return p


def test_missing_field_names_it(tmp_path):
    data = json.loads((HF / "deepseek-v3" / "config.json").read_text())
    del data["kv_lora_rank"]
    with pytest.raises(ConfigError, match="missing field 'kv_lora_rank'"):
        read_hf_config(_write(tmp_path, data))


def test_unknown_architecture_names_it(tmp_path):
    p = _write(tmp_path, {"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    with pytest.raises(ConfigError, match="unknown architecture.*'llama'.*supported"):
        read_hf_config(p)


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d.pop("n_routed_experts"), "n_routed_experts"),
    (lambda d: d.update(model_type="jamba", architectures=["JambaForCausalLM"]), "jamba"),
    (lambda d: d.update(num_experts_per_tok=999), "top_k"),
])
def test_bad_config_json_on_the_command_line_is_one_line_exit_2(edit, needle, tmp_path,
                                                                 capsys):
    data = json.loads((HF / "deepseek-v3" / "config.json").read_text())
    edit(data)
    p = _write(tmp_path, data)
    out = tmp_path / "run"
    rc = main(["simulate", "--hardware", "h800x8", "--model", str(p), "--policy", "ep",
               "--tokens", "64", "--traces", "2", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err
    assert not out.exists()


def test_simulate_takes_a_config_json(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", "--hardware", "chiplet-2x2", "--model",
               str(HF / "qwen3-30b-a3b" / "config.json"), "--policy", "ep", "--tokens", "64",
               "--traces", "2", "--out", str(out), "--quiet"])
    assert rc == 0 and (out / "summary.json").exists()


# --- the catalog as data ----------------------------------------------------------------------


def test_catalog_is_one_toml_per_model():
    files = sorted(p.stem for p in (ROOT / "models").glob("*.toml"))
    assert files == sorted(MODELS)
    assert 'force-include' in (ROOT / "pyproject.toml").read_text()
    assert '"models" = "moejax/_catalog/models"' in (ROOT / "pyproject.toml").read_text()


def test_every_catalog_key_cites_its_source():
    for p in (ROOT / "models").glob("*.toml"):
        for line in p.read_text().splitlines():
            if "=" in line and not line.startswith(("#", "source")):
                assert "#" in line, f"{p.name}: {line!r} cites no source"


def test_user_model_folder(tmp_path, monkeypatch):
    shutil.copy(ROOT / "models" / "deepseek-v3.toml", tmp_path / "my-v3.toml")
    monkeypatch.setenv("MOEJAX_MODELS_PATH", str(tmp_path))
    assert load_model("my-v3").attention_params == load_model("deepseek-v3").attention_params


def test_bad_model_toml_names_the_key(tmp_path):
    text = (ROOT / "models" / "deepseek-v3.toml").read_text()
    p = tmp_path / "bad.toml"
    p.write_text(text.replace("kv_lora_rank = 512", "kv_lora_rank = 0"))
    with pytest.raises(ConfigError, match="bad.toml.*kv_lora_rank"):
        load_model(str(p))
    p.write_text(text + "\nexperts = 3\n")
    with pytest.raises(ConfigError, match="unknown key.*'experts'"):
        load_model(str(p))


# --- `moejax catalog models NAME --json` --------------------------------------------------------


@pytest.mark.parametrize("name", ["deepseek-v2", str(HF / "deepseek-v2" / "config.json")])
def test_catalog_models_json(name, capsys):
    assert main(["catalog", "models", name, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    layer = d["per_layer"]
    assert layer["attention_params"] == pytest.approx(149.2e6, rel=1e-3)
    assert layer["expert_params"] == 3 * 5120 * 1536
    assert layer["routed_experts_params"] == 160 * layer["expert_params"]
    assert d["param_count"] == pytest.approx(236e9, rel=TOL)


def test_catalog_models_unknown_name_exit_2(capsys):
    assert main(["catalog", "models", "deepseek-v9", "--json"]) == 2
    assert "deepseek-v3" in capsys.readouterr().err
