"""`moejax catalog hardware | models | policies | systems`: the catalogs, and the registry of
systems (`moejax.systems.SYSTEMS`), as tables. `moejax catalog models NAME --json` prints one
model (a catalog name or a Hugging Face config.json path) with its per-layer parameter counts."""

from __future__ import annotations

import dataclasses
import json
import sys

from rich.console import Console
from rich.table import Table

from moejax import systems
from moejax.catalog.hardware import load_platform, platform_names
from moejax.catalog.models import MODELS, ModelSpec, load_model
from moejax.catalog.policies import policy_names
from moejax.catalog.shapes import attention_shapes
from moejax.errors import ConfigError


def add_parser(sub):
    c = sub.add_parser("catalog", help="list hardware, models, policies or systems")
    c.add_argument("what", choices=["hardware", "models", "policies", "systems"])
    c.add_argument("name", nargs="?", default=None,
                   help="models only: one model (catalog name or path to a config.json)")
    c.add_argument("--json", action="store_true",
                   help="models only: print the spec(s) as JSON, with per-layer counts")
    c.set_defaults(fn=run)
    return c


def model_json(m: ModelSpec) -> dict:
    """A model's fields plus its per-layer and whole-model parameter counts (elements)."""
    return {
        **dataclasses.asdict(m),
        "per_layer": {
            "attention_params": m.attention_params,
            "attention_shapes": {k: list(v) for k, v in attention_shapes(m).items()},
            "expert_params": m.expert_params,
            "routed_experts_params": m.num_experts * m.expert_params,
            "shared_experts_params": m.shared_params,
            "router_params": m.router_params,
            "dense_ffn_params": m.ffn_matrices * m.hidden_size * m.dense_ffn_size,
            "kv_cache_bytes_per_token": m.kv_bytes_per_token,
            "attention_flops_per_token": m.attention_flops_per_token,
            "attention_context_flops": m.attention_context_flops,
        },
        "embedding_params": m.embedding_params,
        "param_count": m.param_count(),
        "active_param_count": m.active_param_count(),
    }


def run(args) -> int:
    if (args.name or args.json) and args.what != "models":
        raise ConfigError(f"catalog {args.what}: NAME and --json apply to 'catalog models' only")
    if args.what == "models":
        specs = [load_model(args.name)] if args.name else list(MODELS.values())
        if args.json:
            out = model_json(specs[0]) if args.name else {m.name: model_json(m) for m in specs}
            sys.stdout.write(json.dumps(out, indent=2) + "\n")
            return 0
        t = Table(title="models")
        for c in ("name", "d_model", "d_ffn", "E", "top-k", "shared", "MoE/all layers",
                  "attention", "attn M/layer", "params B (active)", "source"):
            t.add_column(c)
        for m in specs:
            t.add_row(m.name, str(m.hidden_size), str(m.expert_ffn_size), str(m.num_experts),
                      str(m.top_k), str(m.num_shared_experts),
                      f"{m.num_sparse_layers}/{m.num_layers}", m.attention_kind,
                      f"{m.attention_params / 1e6:.1f}",
                      f"{m.param_count() / 1e9:.1f} ({m.active_param_count() / 1e9:.1f})",
                      m.source)
    elif args.what == "hardware":
        t = Table(title="hardware")
        for c in ("name", "family", "devices", "topology", "link GB/s/dir", "TFLOP/s bf16",
                  "mem GB/s", "source"):
            t.add_column(c)
        for name in platform_names():
            p = load_platform(name)
            topo = p.topology
            shape = {"mesh2d": f"mesh {topo.rows}x{topo.cols}",
                     "multi_wafer_mesh": f"{topo.wafer_rows}x{topo.wafer_cols} wafers of "
                                         f"{topo.rows}x{topo.cols}",
                     "hierarchical": f"{topo.nodes} nodes x {topo.devices_per_node}"}.get(
                         topo.kind, topo.kind)
            t.add_row(name, p.family, str(p.num_devices), shape, f"{topo.link_Bps / 1e9:g}",
                      f"{p.device.flops('bf16') / 1e12:.4g}", f"{p.device.memory_Bps / 1e9:g}",
                      p.source)
    elif args.what == "systems":
        t = Table(title="systems")
        for c in ("name", "input", "platforms", "tunable", "study", "default policy",
                  "description"):
            t.add_column(c)
        for e in systems.SYSTEMS.values():
            t.add_row(e.name, e.input_kind, ", ".join(e.platforms),
                      ", ".join(e.tuning.params) if e.tuning else "", e.study or "",
                      e.default_policy, e.description)
    else:
        t = Table(title="policies")
        for c in ("name", "system", "description", "source"):
            t.add_column(c)
        for name in policy_names():
            p = systems.checked_policy(name)
            t.add_row(name, p.system, p.description, p.source)
    Console(width=max(Console().width, 200)).print(t)
    return 0
