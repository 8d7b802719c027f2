"""The fits behind `physics.internode.DeepEPProfile`: its constants from the calibration rows
of `measurements.toml` alone (held-out rows never enter), so a test can refit and compare."""

from __future__ import annotations

import dataclasses

import numpy as np

from moejax.catalog.hardware import load_platform
from moejax.physics.internode import DEFAULT_PROFILE, DeepEPProfile
from moejax.validation import predict
from moejax.validation.rows import Measurement

IDEAL = dataclasses.replace(DEFAULT_PROFILE, nvl_efficiency=1.0, rdma_efficiency=1.0)


def _calibration(rows: list[Measurement], kind: str) -> list[Measurement]:
    return [m for m in rows if m.kind == kind and m.role == "calibration"]


def fit_nvl_efficiency(rows: list[Measurement]) -> float:
    """NVLink share from the intranode normal-kernel rows: time = fixed + bytes / (link x eff),
    so eff = (ideal time - fixed) / (measured time - fixed); geometric mean over the rows."""
    effs = []
    for m in _calibration(rows, "deepep_normal"):
        p, kw = load_platform(m.platform), dict(m.params)
        fixed = predict.deepep_normal(p, **kw, profile=dataclasses.replace(
            IDEAL, nvl_efficiency=1e9, rdma_efficiency=1e9))
        ideal = predict.deepep_normal(p, **kw, profile=IDEAL)
        # logical bandwidth = logical bytes / time; compare times through 1 / bandwidth
        t_fixed, t_ideal, t_meas = 1 / fixed, 1 / ideal, 1 / m.measured
        effs.append((t_ideal - t_fixed) / (t_meas - t_fixed))
    return float(np.exp(np.mean(np.log(effs))))


def fit_low_latency(rows: list[Measurement]) -> tuple[float, float]:
    """(rdma_efficiency, ll_fixed_s) from the low-latency rows across nodes, by least squares
    on measured - pack = fixed + (NIC-bound time at line rate) / eff."""
    xs, ys = [], []
    for m in _calibration(rows, "deepep_low_latency"):
        p, kw = load_platform(m.platform), dict(m.params)
        base = dataclasses.replace(IDEAL, ll_fixed_s=0.0)
        pack = predict.deepep_low_latency(p, **kw, profile=dataclasses.replace(
            base, nvl_efficiency=1e9, rdma_efficiency=1e9))
        line = predict.deepep_low_latency(p, **kw, profile=base) - pack
        xs.append(line)
        ys.append(m.measured - pack)
    a = np.stack([np.ones(len(xs)), np.asarray(xs)], axis=1)
    (fixed_us, inv_eff), *_ = np.linalg.lstsq(a, np.asarray(ys), rcond=None)
    return float(1.0 / inv_eff), float(fixed_us * 1e-6)


def fit_profile(rows: list[Measurement]) -> DeepEPProfile:
    """The DeepEP constants fitted to the calibration rows (normal_fixed_s stays as cited)."""
    rdma, fixed = fit_low_latency(rows)
    return dataclasses.replace(DEFAULT_PROFILE, nvl_efficiency=fit_nvl_efficiency(rows),
                               rdma_efficiency=rdma, ll_fixed_s=fixed)
