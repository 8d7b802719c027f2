"""`moejax catalog hardware | models | policies | systems`: the catalogs, and the registry of
systems (`moejax.systems.SYSTEMS`), as tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from moejax import systems
from moejax.catalog.hardware import load_platform, platform_names
from moejax.catalog.models import MODELS
from moejax.catalog.policies import policy_names


def add_parser(sub):
    c = sub.add_parser("catalog", help="list hardware, models, policies or systems")
    c.add_argument("what", choices=["hardware", "models", "policies", "systems"])
    c.set_defaults(fn=run)
    return c


def run(args) -> int:
    if args.what == "models":
        t = Table(title="models")
        for c in ("name", "d_model", "d_ffn", "E", "top-k", "shared", "MoE/all layers",
                  "attention", "source"):
            t.add_column(c)
        for m in MODELS.values():
            t.add_row(m.name, str(m.hidden_size), str(m.expert_ffn_size), str(m.num_experts),
                      str(m.top_k), str(m.num_shared_experts),
                      f"{m.num_sparse_layers}/{m.num_layers}", m.attention_kind, m.source)
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
