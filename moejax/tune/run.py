"""`tune` and `restore`: the entry points of `moejax.tune`, which pick the way a run goes.

A run goes by the single-process gradient loop (`loop.tune_gradient`), by the same loop
data-parallel over processes (`parallel.tune`, when `jax.process_count() > 1`), or by
Gaussian smoothing of a discrete-event simulation (`smoothed.tune_smoothed`, relaxation
'smoothed', for the systems whose `Tuning.smoothed` is set). The three share the problem,
the optimizer, the checkpoints and the evaluation of `loop`.
"""

from __future__ import annotations

from pathlib import Path

import jax

from moejax import systems
from moejax.errors import CheckpointError, ConfigError
from moejax.tune import checkpoint as ck
from moejax.tune import parallel, search, search_aep, smoothed
from moejax.tune.loop import (
    Problem,
    TuneConfig,
    TuneResult,
    build_problem,
    hard_values,
    initial_raw,
    tune_gradient,
)


def tune(cfg: TuneConfig, out: str | Path, *, resume: bool = False, progress: bool = True,
         callback=None, evaluate_heldout: bool = True) -> TuneResult:
    """Run (or resume) a tuning run into checkpoint folder `out` (see `moejax.tune.loop`).

    callback(step, loss) is called after each update (a test may raise from it to
    interrupt the run). Without `resume`, a folder that already holds checkpoints is an
    error (nothing is overwritten). relaxation = 'smoothed' (aep) runs
    `moejax.tune.smoothed.tune_smoothed` (same checkpoints, schedule and optimizer).
    """
    entry = systems.SYSTEMS.get(cfg.system)
    if entry is not None and entry.tuning and entry.tuning.smoothed and (
            cfg.relaxation != "smoothed"):
        raise ConfigError(f"relaxation = {cfg.relaxation!r} with system = {cfg.system!r}: "
                          f"{cfg.system} (a discrete-event simulation, decay acts through an "
                          "argmax) is tuned with relaxation = 'smoothed' (Gaussian smoothing)")
    kw = dict(resume=resume, progress=progress, callback=callback,
              evaluate_heldout=evaluate_heldout)
    if cfg.search != "grad":  # a black-box search of the same problem (moejax.tune.search)
        if jax.process_count() > 1:
            raise ConfigError(f"search = {cfg.search!r} runs in one process; allowed over "
                              "several processes: grad")
        if cfg.relaxation == "smoothed":  # aep decay (moejax.tune.search_aep)
            return search_aep.tune_black_box_aep(cfg, out, **kw)
        return search.tune_black_box(cfg, out, **kw)
    if jax.process_count() > 1:  # data-parallel over processes (moejax.runner.distributed)
        return parallel.tune(cfg, out, **kw)
    if cfg.relaxation == "smoothed":
        observer = search_aep.SmoothedObserver(cfg, out) if evaluate_heldout else None
        return smoothed.tune_smoothed(cfg, out, observer=observer, **kw)
    observer = search.GradientObserver(build_problem(cfg), out, resume) if (
        evaluate_heldout) else None
    return tune_gradient(cfg, out, observer=observer, **kw)


def restore(out: str | Path, step: int | None = None) -> tuple[Problem, TuneResult]:
    """(problem, result without evaluation) from a checkpoint folder, e.g. to export."""
    mgr = ck.Checkpoints(out, read_only=True)
    latest = mgr.latest_step() if step is None else step
    if latest is None:
        raise CheckpointError(f"{out}: holds no checkpoint")
    cfg = TuneConfig.from_spec(mgr.read_meta(latest)["run"])
    if cfg.relaxation == "smoothed":  # aep: an AEPProblem (moejax.tune.smoothed)
        prob = smoothed.aep_problem(cfg)
        raw0 = {"decay": prob.family.init(None)}
    else:
        prob = build_problem(cfg, traces=False)
        raw0 = initial_raw(prob)
    saved, meta, got = mgr.restore(ck.flatten_state(raw0, prob.optimizer.init(raw0)), latest)
    raw, _ = ck.unflatten_state(saved, prob.optimizer.init(raw0))
    mgr.close()
    hard = ({"decay": prob.family.hard(raw["decay"])} if cfg.relaxation == "smoothed"
            else hard_values(prob, raw))
    return prob, TuneResult(raw, hard, list(meta.get("history", [])), {}, got)
