"""`moejax reproduce tuning`: does differentiability pay? The relaxed-gradient loop against
Optuna's TPE and CMA-ES, random search, the hard grid and the papers' heuristics, at equal
simulated layer-traces, on every tuning family the systems expose.

Every run is `moejax.tune.tune` with `search` = grad | tpe | cmaes | random | grid on the
same problem (system, families, training and held-out traces, loss = mean MoE-layer
latency); each writes its budget (simulated layer-traces, hard / relaxed evaluations, wall
and CPU time) and its best-so-far curve (the incumbent's hard held-out latency at
log-spaced budget points) to summary.json, which this study reads. Nothing is fitted to a
claim.

Families (`FAMILIES`), each on a workload chosen where the decision matters, its spread
measured (`SPREAD_SAMPLES` uniformly random decisions of the black-box encoding, hard, on
the held-out traces):

- ep_placement: qwen3-30b-a3b, 128 experts on the 16 dies of chiplet-4x4 (000 Table I
  scaled), 16 tokens per iteration (128 decisions).
- ep_replicas: the same layer, 10 slots per die (32 redundant slots: 128 + 32 decisions).
- wafer_placement: the 001 wafer system on wsc-4x4, expert placement and the Eq. 2
  balancer's alpha (128 + 1 decisions).
- dysharp: DySHARP on gh200-nvl32 (64 experts on 32 GPUs), placement and comm SMs.
- ep_recorded: EP placement per layer on recorded routing: the ESFT intent recording
  (`balancing_data`; deepseek-moe-16b, layers 1 and 13), one sequence (~64 tokens) per
  trace, 16 training sequences from its first half, held out from its second half, on
  dgx-b200-4node (64 experts on 32 GPUs over 4 nodes: 2 x 64 decisions).
- fsedp_knobs: FSE-DP token buffering on chiplet-2x2 (micro-slices, theta_min, slack:
  three knobs, a piecewise-constant objective).
- epsmoe: EPS-MoE on h800x8 (pipeline degree, GEMM switch rows, comm SMs: three knobs;
  the comm SMs are the SM split of 003 §3.4: the GEMM gets the other SMs).
- epsmoe_chunks: the same layer at the policy's pipeline degree (pn = 2), its chunk
  assignment (beyond 003: which chunk each of the 8 local experts of each of the 8 devices
  runs in; 64 discrete decisions, 2^64 assignments at pn = 2), started from the paper's
  contiguous grouping; heuristics: contiguous and load-balanced chunks.
- aep_decay: AEP's defragging decay delta (002 Algorithm 1; mixtral-8x7b on a100x8-nvswitch,
  Poisson 200 req/s, 8 requests per stream; loss = mean inter-token latency, ms): one
  knob, searched by the smoothed gradient, TPE, random search and the grid (CMA-ES needs
  two or more dimensions); its budget unit is a simulated request stream.
- codesign: FSE-DP hardware (weight buffer, DDR and D2D bandwidth) and micro-slices tuned
  jointly under the 000 Eq. (1)-(2) area / power budget (`ChipletBudget` defaults).

Every method of a family gets the same budget B of simulated layer-traces: a black-box
trial simulates every training trace (traces x layers), a gradient step `batch` of them;
the gradient's points are the end results of separate runs of B/4, B/2 and B (a run
anneals over its length, so its rounding mid-run is not a shorter run's result).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from moejax.reproduce import balancing_data as bdata
from moejax.reproduce import tuning_claims as claims
from moejax.reproduce import tuning_figures as figs
from moejax.reproduce.study import Check, Figure, Grid, Rows, Study
from moejax.trace import from_counts
from moejax.trace import io as trace_io
from moejax.tune import TuneConfig, search_aep, smoothed, tune
from moejax.tune import search as srch
from moejax.tune.loop import build_problem

SPREAD_SAMPLES = 12


@dataclasses.dataclass(frozen=True)
class Family:
    """One tuning family of the study: its problem (TuneConfig fields), the gradient's own
    settings, the black-box methods that can search it, and whether it is a placement
    (100+ discrete decisions: the claims of the targets apply)."""

    name: str
    label: str
    kw: tuple  # TuneConfig fields of the problem
    grad: tuple = ()  # TuneConfig fields of the gradient runs
    methods: tuple = ("tpe", "cmaes", "random")
    placement: bool = True
    # recorded routing: (workload of `balancing_data`, layers kept, training sequences);
    # the run reads a recording written from it (`recording`), held out = its second half
    recorded: tuple = ()
    # the full grid's greedy-started gradient runs (placements with a "greedy-balanced"
    # baseline; without one, init greedy would be a random start again)
    greedy: bool = True


FAMILIES = {f.name: f for f in (
    Family("ep_placement", "EP placement: qwen3-30b-a3b, chiplet-4x4, 16 tok, power law 1.2",
           (("system", "ep"), ("hardware", "chiplet-4x4"), ("tokens", 16),
            ("params", ("placement",)), ("traces", 32), ("batch", 16)),
           (("init", "random"), ("lr", 0.1), ("tau_end", 0.005))),
    Family("ep_replicas", "EP replicas: qwen3-30b-a3b, chiplet-4x4, 10 slots / die, 16 tok",
           (("system", "ep"), ("hardware", "chiplet-4x4"), ("tokens", 16),
            ("params", ("replicas",)), ("capacity", 10), ("traces", 32), ("batch", 16)),
           (("init", "random"), ("lr", 0.1), ("tau_end", 0.005))),
    Family("wafer_placement", "wafer placement + alpha: qwen3-30b-a3b, wsc-4x4, 16 tok",
           (("system", "wafer"), ("hardware", "wsc-4x4"), ("tokens", 16),
            ("params", ("placement", "alpha")), ("traces", 16), ("batch", 8)),
           (("init", "random"), ("lr", 0.1), ("relaxation", "system"))),
    Family("dysharp", "DySHARP placement + comm SMs: qwen3-30b-a3b, gh200-nvl32, 64 tok",
           (("system", "dysharp"), ("hardware", "gh200-nvl32"), ("tokens", 64),
            ("iterations", 1), ("params", ("placement", "comm_sms")), ("traces", 16),
            ("batch", 8)),
           (("init", "random"), ("lr", 0.1), ("relaxation", "system"))),
    Family("ep_recorded", "EP placement per layer, recorded routing: ESFT intent "
           "(deepseek-moe-16b, layers 1 and 13, one sequence of ~64 tok per trace), "
           "dgx-b200-4node",
           (("system", "ep"), ("hardware", "dgx-b200-4node"), ("model", "deepseek-moe-16b"),
            ("params", ("placement",)), ("per_layer", True), ("traces", 16), ("batch", 8)),
           (("init", "random"), ("lr", 0.1), ("tau_end", 0.005)),
           recorded=("esft_intent", (1, 13), 16)),
    Family("fsedp_knobs", "FSE-DP buffering: qwen3-30b-a3b, chiplet-2x2, 16 tok; "
           "micro-slices, theta_min, slack",
           (("system", "fsedp"), ("policy", "fsedp-buffered"), ("hardware", "chiplet-2x2"),
            ("tokens", 16), ("params", ("num_microslices", "theta_min", "slack")),
            ("traces", 8), ("batch", 4)),
           (("init", "default"), ("lr", 0.1), ("relaxation", "system")),
           methods=("tpe", "cmaes", "random", "grid"), placement=False),
    Family("epsmoe", "EPS-MoE: deepseek-moe-16b, h800x8, 512 tok; pn, switch rows, "
           "comm SMs",
           (("system", "epsmoe"), ("policy", "epsmoe-tune"), ("hardware", "h800x8"),
            ("model", "deepseek-moe-16b"), ("tokens", 512), ("iterations", 1),
            ("params", ("pn", "switch_rows", "sm_comm")), ("traces", 16), ("batch", 4)),
           (("init", "default"), ("lr", 0.1), ("relaxation", "system")),
           methods=("tpe", "cmaes", "random", "grid"), placement=False),
    Family("epsmoe_chunks", "EPS-MoE chunk assignment: deepseek-moe-16b, h800x8, 512 tok, "
           "pn = 2; 8 devices x 8 local experts",
           (("system", "epsmoe"), ("policy", "epsmoe-tune"), ("hardware", "h800x8"),
            ("model", "deepseek-moe-16b"), ("tokens", 512), ("iterations", 1),
            ("params", ("assignment",)), ("traces", 16), ("batch", 4)),
           # docs/reproduction/epsmoe.md "Chunk assignment": lr 0.1 moves no expert off
           # its start logits' margin of 3; 0.5 does
           (("init", "default"), ("lr", 0.5), ("relaxation", "system")),
           greedy=False),
    Family("aep_decay", "AEP decay delta (002 Algorithm 1): mixtral-8x7b, a100x8-nvswitch, "
           "Poisson 200 req/s, 8 requests / stream; mean ITL (budget in streams)",
           (("system", "aep"), ("policy", "aep-defrag"), ("hardware", "a100x8-nvswitch"),
            ("model", "mixtral-8x7b"), ("params", ("decay",)), ("relaxation", "smoothed"),
            ("requests", 8), ("traces", 2), ("batch", 2), ("samples", 1)),
           (("init", "default"), ("lr", 0.3), ("warmup", 2), ("tau_start", 0.2),
            ("tau_end", 0.05)),
           methods=("tpe", "random", "grid"), placement=False),
    Family("codesign", "co-design: FSE-DP buffer, DDR, D2D + micro-slices under 000 Eq. "
           "(1)-(2) (30 mm^2, 60 W), qwen3-30b-a3b, chiplet-2x2, 16 tok",
           (("system", "fsedp"), ("policy", "fsedp-paired"), ("hardware", "chiplet-2x2"),
            ("tokens", 16), ("params", ("num_microslices", "weight_buffer_bytes", "ddr_Bps",
                                        "link_Bps")), ("traces", 8), ("batch", 4)),
           (("init", "default"), ("lr", 0.1), ("relaxation", "system"), ("tau_start", 0.3),
            ("tau_end", 0.01)),
           placement=False),
)}

# per family: (budget B in simulated layer-traces, seeds, held-out traces)
QUICK = Grid(True, families=(
    ("ep_placement", 3200, (0, 1), 128), ("ep_replicas", 3200, (0, 1), 128),
    ("wafer_placement", 1600, (0,), 64), ("dysharp", 1600, (0,), 64),
    ("ep_recorded", 1600, (0,), 64), ("fsedp_knobs", 240, (0,), 32),
    ("epsmoe", 640, (0,), 16), ("epsmoe_chunks", 640, (0,), 16), ("aep_decay", 48, (0,), 4),
    ("codesign", 400, (0,), 32)),
    grad_fractions=(0.25, 1.0), greedy=False)
FULL = Grid(False, families=(
    ("ep_placement", 12800, (0, 1, 2), 256), ("ep_replicas", 12800, (0, 1, 2), 256),
    ("wafer_placement", 6400, (0, 1, 2), 128), ("dysharp", 6400, (0, 1, 2), 128),
    ("ep_recorded", 12800, (0, 1, 2), 64),
    ("fsedp_knobs", 1920, (0, 1, 2), 64), ("epsmoe", 2560, (0, 1, 2), 32),
    ("epsmoe_chunks", 2560, (0, 1, 2), 32),
    ("aep_decay", 384, (0, 1, 2), 16),
    ("codesign", 1600, (0, 1, 2), 64)),
    grad_fractions=(0.125, 0.25, 0.5, 1.0), greedy=True)


def base_config(fam: Family, seed: int, eval_traces: int) -> TuneConfig:
    kw = dict(fam.kw)
    if fam.recorded:
        path, train, held = recording(*fam.recorded, eval_traces)
        kw.update(trace=path, train_fraction=train / (train + held))
    return TuneConfig(seed=seed, eval_traces=eval_traces, every=10_000, keep=1, **kw)


@functools.cache
def recording(workload: str, layers: tuple, train: int, held: int) -> tuple[str, int, int]:
    """(path, training, held-out sequences) of a recording written once per process: the
    first `train` sequences of the workload's training half (`balancing_data`: ESFT's first
    half of sequences), then up to `held` sequences of its held-out half, `layers` kept.
    One trace per sequence (its counts as recorded: the tokens within a sequence stay
    together)."""
    rec = bdata.recordings()[workload]
    counts = np.asarray(rec["counts"], np.float64)[:, list(layers)]
    half = counts.shape[0] // 2
    test = counts[half:][:held]
    folder = tempfile.mkdtemp(prefix="moejax-tuning-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # removed when the run ends
    path = Path(folder) / f"{workload}.npz"
    trace_io.save(path, from_counts(np.concatenate([counts[:train], test]),
                                    int(rec["top_k"])),
                  {"workload": workload, "layers": list(layers), "train": train})
    return str(path), train, int(test.shape[0])


def run_one(cfg: TuneConfig) -> dict:
    """summary.json of one run (in a temporary folder)."""
    with tempfile.TemporaryDirectory() as d:
        tune(cfg, Path(d) / "run", progress=False)
        return json.loads((Path(d) / "run" / "summary.json").read_text())


def spread(cfg: TuneConfig, samples: int = SPREAD_SAMPLES) -> dict:
    """Held-out mean latency (ms) of uniformly random decisions (the random search's
    encoding of every family, seeded apart from the runs)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=cfg.seed + 100))
    if cfg.relaxation == "smoothed":  # aep decay: u uniform in the searched range
        prob = smoothed.aep_problem(cfg)
        us = [study.ask().suggest_float("decay", srch.U_LO, srch.U_HI) for _ in range(samples)]
        vals = search_aep.objective(prob, [search_aep.decay_of(prob, u) for u in us],
                                    prob.heldout)
    else:
        prob = build_problem(dataclasses.replace(cfg, search="random"))
        vals = np.array([srch.hard_objective(prob, srch.decode(prob, srch.suggest(
            study.ask(), prob, "random")), prob.heldout) for _ in range(samples)])
    return {"random_min": float(vals.min()), "random_median": float(np.median(vals)),
            "random_max": float(vals.max()),
            "spread_pct": float((vals.max() - vals.min()) / vals.min() * 100)}


def _cost(cfg: TuneConfig, search: str) -> int:
    """Simulated layer-traces of one trial (black box) or step (gradient); aep: streams."""
    if cfg.relaxation == "smoothed":
        return search_aep.grad_cost_per_step(cfg) if search == "grad" else cfg.traces
    prob = build_problem(dataclasses.replace(cfg, search=search, steps=1))
    return srch.grad_cost_per_step(prob) if search == "grad" else srch.engine_traces(
        prob.train)


def mean_ms(ev: dict, key: str) -> float:
    """Held-out mean of evaluation row `key`, in ms: MoE-layer latency, or AEP's mean
    inter-token latency."""
    m = ev[key]
    return m["latency_ms"]["mean"] if "latency_ms" in m else m["itl_mean_s"] * 1e3


def _row(fam, seed, method, value, **more):
    row = {"family": fam, "seed": seed, "method": method, "heldout_ms": value,
           "layer_traces": 0, "hard_evaluations": 0, "relaxed_evaluations": 0,
           "wall_s": 0.0, "cpu_s": 0.0, "spread_pct": "", "heuristic": ""}
    row.update(more)
    return row


@functools.lru_cache(maxsize=16)
def family_rows(name: str, grid: Grid) -> Rows:
    """Every method on one family and its seeds: curves, finals, heuristics, spreads."""
    t0 = time.perf_counter()
    fam = FAMILIES[name]
    budget, seeds, eval_traces = next(x[1:] for x in grid.families if x[0] == name)
    curve, final = [], []
    for seed in seeds:
        base = base_config(fam, seed, eval_traces)
        sp = spread(base)
        runs = [("grad", "grad", dict(fam.grad), f) for f in grid.grad_fractions]
        if grid.greedy and fam.placement and fam.greedy:
            runs += [("grad-greedy", "grad", {**dict(fam.grad), "init": "greedy"}, f)
                     for f in grid.grad_fractions]
        runs += [(m, m, {}, 1.0) for m in fam.methods]
        ev = None
        for method, search, over, frac in runs:
            cfg = dataclasses.replace(base, search=search, **over)
            steps = max(1, int(round(frac * budget / _cost(cfg, search))))
            s = run_one(dataclasses.replace(cfg, steps=steps))
            pts = s["curve"][-1:] if search == "grad" else s["curve"]
            for c in pts:
                curve.append({"family": name, "seed": seed, "method": method,
                              "evals": c["evals"], "layer_traces": c["layer_traces"],
                              "wall_s": c["wall_s"], "cpu_s": c["cpu_s"],
                              "train_ms": c["train"], "heldout_ms": c["heldout"]})
            if frac == 1.0:
                ev, b = s["evaluation"], s["budget"]
                final.append(_row(name, seed, method, mean_ms(ev, "tuned"),
                                  layer_traces=b["layer_traces"],
                                  hard_evaluations=b["hard_evaluations"],
                                  relaxed_evaluations=b["relaxed_evaluations"],
                                  wall_s=b["wall_s"], cpu_s=b["cpu_s"]))
        # the heuristics (the same rows in every run's evaluation): the default, and the
        # best of the setup's baselines (heuristics, or its coarse hard grid) by name
        final.append(_row(name, seed, "default", mean_ms(ev, "default")))
        heur = {k: mean_ms(ev, k) for k in ev if k not in ("tuned", "default")}
        if heur:
            h = min(heur, key=heur.get)
            final.append(_row(name, seed, "best-heuristic", heur[h], heuristic=h))
        final.append(_row(name, seed, "random-median", sp["random_median"],
                          spread_pct=sp["spread_pct"]))
    return family_result(name, curve, final, {f"{name}_compute_s": time.perf_counter() - t0})


def family_result(name: str, curve: list, final: list, summary: dict) -> Rows:
    """A family figure's Rows from its curve and final rows (computed, or read back from
    its CSVs by `tuning_assemble`): the budget table and what the claims read."""
    table = claims.budget_table(curve, final)
    return Rows(curve, more={f"{name}_final.csv": final, f"{name}_budget.csv": table},
                summary=summary,
                extra={"curve": curve, "final": final, "table": table,
                       "family": FAMILIES[name]})


def headline(grid: Grid) -> Rows:
    """The headline of every family of the grid (read off the family figures'
    computations, cached)."""
    return headline_of([family_rows(name, grid) for name, *_ in grid.families])


def headline_of(families: list[Rows]) -> Rows:
    """One row per family and method: the budget table of every family; and
    `headline_equal_wall.csv`, the comparison at equal search wall time
    (`tuning_claims.equal_wall`)."""
    rows, curve, final = [], [], []
    for r in families:
        rows += r.extra["table"]
        curve += r.extra["curve"]
        final += r.extra["final"]
    return Rows(rows, more={"headline_equal_wall.csv": claims.equal_wall(curve, final)})


def _figure(name: str) -> Figure:
    return Figure(name, functools.partial(family_rows, name),
                  functools.partial(figs.family_figure, FAMILIES[name].label),
                  more=(f"{name}_final.csv", f"{name}_budget.csv"))


def _checks() -> tuple[Check, ...]:
    return tuple(Check((name,), claims.family_claims) for name in FAMILIES)


STUDY = Study(
    name="tuning",
    # the families first: each writes its files and ticks the progress as it finishes (the
    # headline, read off their cached computations, costs nothing after them)
    figures=(*(_figure(n) for n in FAMILIES),
             Figure("headline", headline, figs.headline_figure)),
    quick=QUICK,
    full=FULL,
    checks=_checks(),
    about=lambda g: {"families": {n: FAMILIES[n].label for n, *_ in g.families},
                     "budget_layer_traces": {n: b for n, b, *_ in g.families},
                     "seeds": {n: list(s) for n, _, s, _ in g.families}},
    timed=True,
)
