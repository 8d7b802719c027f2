"""Policy options of the AEP (`aep-*.toml`) and synchronous-EP serving (`ep-sync.toml`) systems.

Both run on request streams rather than routing traces: `from_policy`'s fourth argument is
the number of requests per stream (the padded size R of a `RequestStream`).
"""

from __future__ import annotations

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.systems.amoe import aep, paths, sync
from moejax.systems.amoe.config import SCHEDULERS, Overheads, mqa


def _common(t):
    return dict(
        kv_fraction=t.float("kv_fraction", 0.9, hi=1.0),
        skew_scale=t.float("skew_scale", 0.5),
        skew_seed=t.int("skew_seed", 0, lo=0),
        bin_s=t.float("bin_s", 1.0),
        num_bins=t.int("num_bins", 64),
    ), t.bool("mqa", True), t.int("top_k", 0, lo=0)


def _aep_options(t):
    common, use_mqa, top_k = _common(t)
    opts = dict(
        scheduler=t.str("scheduler", "defrag", choices=SCHEDULERS),
        path=t.str("path", "rounds", choices=aep.PATHS),
        lookahead=t.int("lookahead", 2),
        attention_per_node=t.int("attention_per_node", 0, lo=0) or None,
        overheads=Overheads(
            schedule_s=t.float("schedule_s", 10e-6, positive=False),
            attention_fixed_s=t.float("attention_fixed_s", 100e-6, positive=False),
            page_table_s_per_token=t.float("page_table_s_per_token", 2e-6, positive=False),
            expert_fixed_s=t.float("expert_fixed_s", 30e-6, positive=False),
            expert_efficiency=t.float("expert_efficiency", 1.0, hi=1.0),
            attention_kv_reads=t.float("attention_kv_reads", 1.0),
            message_s=t.float("message_s", 0.0, positive=False),
        ),
        **common,
    )
    decay = t.float("decay", 0.5, hi=1.0)
    t.close()
    return opts, decay, use_mqa, top_k


def _sync_options(t):
    common, use_mqa, top_k = _common(t)
    opts = dict(
        max_running=t.int("max_running", 0, lo=0),
        admit_per_iteration=t.int("admit_per_iteration", 64),
        overheads=sync.SyncOverheads(
            iteration_fixed_s=t.float("iteration_fixed_s", 1e-3, positive=False),
            page_table_s_per_token=t.float("page_table_s_per_token", 2e-6, positive=False),
            layer_fixed_s=t.float("layer_fixed_s", 20e-6, positive=False),
            comm=t.str("comm", "all_to_all", choices=sync.COMM_MODES),
            expert_efficiency=t.float("expert_efficiency", 1.0, hi=1.0),
            attention_kv_reads=t.float("attention_kv_reads", 1.0),
        ),
        **common,
    )
    t.close()
    return opts, use_mqa, top_k


def _model(model: ModelSpec, use_mqa: bool, top_k: int) -> ModelSpec:
    import dataclasses

    m = mqa(model) if use_mqa else model
    return dataclasses.replace(m, top_k=top_k) if top_k else m


def check_aep_options(t) -> None:
    """Validate an AEP policy's [options]."""
    _aep_options(t)


def check_sync_options(t) -> None:
    """Validate a synchronous-EP serving policy's [options]."""
    _sync_options(t)


def aep_from_policy(platform: Platform, model: ModelSpec, t, num_requests: int):
    """(System, AEPParams) from an AEP policy's options Table, on the path its `path`
    option names (`paths.build`)."""
    opts, decay, use_mqa, top_k = _aep_options(t)
    cfg = aep.make_config(platform, _model(model, use_mqa, top_k), num_requests=num_requests,
                          **opts)
    return paths.build(cfg), paths.params(cfg, decay)


def sync_from_policy(platform: Platform, model: ModelSpec, t, num_requests: int):
    """(System, SyncParams) from a synchronous-EP serving policy's options Table."""
    opts, use_mqa, top_k = _sync_options(t)
    cfg = sync.make_config(platform, _model(model, use_mqa, top_k), num_requests=num_requests,
                           **opts)
    return sync.build(cfg), sync.SyncParams()
