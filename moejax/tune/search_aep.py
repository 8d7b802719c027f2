"""Black-box search of AEP's defragging decay delta (002 §3.4 Algorithm 1), and the budget
accounting of its smoothed-gradient run.

The decay is one real knob in [0, 1] (`tunable.SmoothedKnob`) acting only through the
discrete-event simulation's argmax (`moejax.tune.smoothed`). `moejax tune --system aep
--relaxation smoothed --search tpe|random|grid` searches it with the hard simulator only:
a trial is the family's sigmoid position u in [0.001, 0.999] (decay = u, the range the
gradient's sigmoid reaches; `search.U_LO`, `search.U_HI`), drawn by Optuna's TPE
(`TPESampler`) or uniformly (`RandomSampler`), or taken from `--steps` evenly spaced u
(`grid`). CMA-ES is refused for it (one line, exit 2, in `loop.TuneConfig`): Optuna's
`CmaEsSampler` needs a search space of two or more dimensions and would fall back to random
sampling. A trial runs every training stream (`--traces` streams of `--requests` Poisson
requests, the same streams and simulation key as the gradient) and scores the run's loss
(`--loss mean`: mean inter-token latency in ms; `throughput`: -k tok/s).

Outputs as every black-box search (`moejax.tune.search`): `trials.jsonl` (resume),
an orbax checkpoint whose raw parameter rounds to exactly the chosen decay (so `restore`
and `--export` work), and `summary.json` with the smoothed run's fields (`tuned`,
`default`, the held-out `evaluation`) plus `budget` and `curve`. The budget unit of AEP is a
simulated request stream (every layer of every request, one discrete-event run), recorded
in the budget's `layer_traces` field with `unit` = "streams": a trial costs `--traces`
streams, a gradient step 2 x `--samples` x `--traces` (its antithetic pairs).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from moejax.output.results import atomic_write_json
from moejax.tune import records, search, smoothed
from moejax.tune.loop import TuneResult, progress_bar

UNIT = "streams"


def decay_of(prob: smoothed.AEPProblem, u: float) -> float:
    """The decay the family's rounding gives at sigmoid position u (as the gradient's)."""
    return prob.family.hard(raw_of(u))


def raw_of(u: float):
    return jnp.float32(np.log(u / (1.0 - u)))


def objective(prob: smoothed.AEPProblem, decays, streams) -> np.ndarray:
    """The run's loss [P] of hard decays [P] on `streams`: one decay per vmapped call (a
    trial's shape, so every count of decays reuses the one compiled loop; a decay listed
    twice runs once)."""
    d = np.asarray(decays, np.float64).reshape(-1)
    uniq, back = np.unique(d, return_inverse=True)  # an incumbent repeats along a curve
    m = smoothed.run_decays(prob.system, prob.base, uniq, streams, prob.sim_key, group=1)
    if prob.cfg.loss == "throughput":
        return (-m["throughput_tok_s"].mean(1) / 1e3)[back]
    return (m["itl_mean_s"].mean(1) * 1e3)[back]


def streams_of(streams) -> int:
    return int(np.shape(streams.arrival_s)[0])


def grad_cost_per_step(cfg) -> int:
    """Simulated streams of one smoothed-gradient update: 2 x samples decays x traces."""
    return 2 * cfg.samples * cfg.traces


def tune_black_box_aep(cfg, out: str | Path, *, resume: bool = False, progress: bool = True,
                       callback=None, evaluate_heldout: bool = True) -> TuneResult:
    """`cfg.steps` hard trials of `cfg.search` (tpe, random, grid) over the decay."""
    prob = smoothed.aep_problem(cfg)
    out = Path(out)
    study, log = search._study(out, cfg.search, prob, resume)
    out.mkdir(parents=True, exist_ok=True)
    cost = streams_of(prob.train)
    grid = np.linspace(search.U_LO, search.U_HI, cfg.steps) if cfg.search == "grid" else None
    done = len(study.trials)
    with progress_bar(progress, cfg.steps, done) as advance:
        while done < cfg.steps:
            w0, c0 = time.perf_counter(), time.process_time()
            if grid is not None:
                study.enqueue_trial({"decay": float(grid[done])})
            trial = study.ask()
            u = trial.suggest_float("decay", search.U_LO, search.U_HI)
            value = float(objective(prob, [decay_of(prob, u)], prob.train)[0])
            trial.set_user_attr("wall_s", time.perf_counter() - w0)
            trial.set_user_attr("cpu_s", time.process_time() - c0)
            study.tell(trial, value)
            search._log(log, study.get_trials(deepcopy=False)[-1], value, cfg.spec())
            done += 1
            advance(value, 0.0, 0.0)
            if callback is not None:
                callback(done, value)
    trials = [t for t in study.trials if t.state.name == "COMPLETE"][:cfg.steps]
    vals = np.array([t.value for t in trials])
    best_so_far = np.minimum.accumulate(vals)
    us = [t.params["decay"] for t in trials]
    raw = {"decay": raw_of(us[int(np.argmin(vals))])}
    hard = {"decay": prob.family.hard(raw["decay"])}
    budget = search.save_best(out, cfg, prob, raw, trials, best_so_far, cost, unit=UNIT)
    walls, cpus = search.cumulative_times(trials)
    evaluation = {}
    if evaluate_heldout:
        pts = search.curve_points(len(trials))
        inc = [decay_of(prob, us[int(np.argmin(vals[:n]))]) for n in pts]
        held = objective(prob, inc, prob.heldout)
        curve = [{"evals": n, "layer_traces": int(cost * n), "wall_s": float(walls[n - 1]),
                  "cpu_s": float(cpus[n - 1]), "train": float(best_so_far[n - 1]),
                  "heldout": float(h), "decay": d}
                 for n, d, h in zip(pts, inc, held, strict=True)]
        evaluation = write_summary(prob, out, len(trials), float(best_so_far[-1]),
                                   hard["decay"], budget, curve)
    return TuneResult(raw, hard, best_so_far.tolist(), evaluation, len(trials), budget)


def write_summary(prob, out: Path, step: int, final_loss: float, decay: float, budget: dict,
                  curve: list) -> dict:
    """summary.json of an AEP run (the smoothed run's fields, budget, curve); returns the
    held-out evaluation (tuned and default decay)."""
    default = float(prob.base.decay)
    evaluation = smoothed.evaluate_aep(prob, decay, default)
    atomic_write_json(out / "summary.json",
                      {"run": records.run_record(prob.cfg),
                       "provenance": records.run_provenance(prob.cfg), "step": step,
                       "final_loss": final_loss, "tuned": decay, "default": default,
                       "evaluation": evaluation, "budget": budget, "curve": curve})
    return evaluation


class SmoothedObserver:
    """Budget and curve of a smoothed-gradient run (`smoothed.tune_smoothed`): `observe(step,
    decay)` after each update records the rounded decay at the curve points; `finish` scores
    them (hard, training and held-out streams, after the search's clock stopped) into
    summary.json. A
    resumed run's curve holds the points of its own process only."""

    def __init__(self, cfg, out: str | Path):
        self.cfg, self.out, self.prob = cfg, Path(out), None
        self.points = set(search.curve_points(cfg.steps))
        self.rows = []
        self.clock = search.Clock()

    def start(self, prob: smoothed.AEPProblem) -> None:
        """The run's problem (its streams score the curve); the search clock starts."""
        self.prob, self.clock = prob, search.Clock()

    def __call__(self, step: int, decay: float) -> None:
        if step in self.points or step == self.cfg.steps:
            wall, cpu = self.clock.now()
            self.rows.append({"evals": step, "wall_s": wall, "cpu_s": cpu, "decay": decay})

    def finish(self, step: int) -> dict:
        """The run's budget; adds it and the curve to the summary.json just written."""
        wall, cpu = self.clock.now()
        cost = grad_cost_per_step(self.prob.cfg)
        budget = {"search": "grad", "unit": UNIT, "layer_traces": int(cost * step),
                  "hard_evaluations": 0, "relaxed_evaluations": step, "wall_s": wall,
                  "cpu_s": cpu}
        ds = [r["decay"] for r in self.rows]
        train = objective(self.prob, ds, self.prob.train) if ds else []
        held = objective(self.prob, ds, self.prob.heldout) if ds else []
        curve = [{**r, "layer_traces": int(cost * r["evals"]), "train": float(a),
                  "heldout": float(b)} for r, a, b in zip(self.rows, train, held, strict=True)]
        path = self.out / "summary.json"
        atomic_write_json(path, {**json.loads(path.read_text()), "budget": budget,
                                 "curve": curve})
        return budget
