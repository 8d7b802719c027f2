"""`moejax tune --system epsmoe`: the pipeline degree, the GEMM switch threshold and the SM
split of EPS-MoE (003) by gradient, against the paper's heuristics.

Families (`moejax.tunable`):
- `pn`: `DivisorKnob`, the pipeline degree N over the divisors of the local expert count
  (A3); raw -> a fractional index among the divisors (`relaxed.block` interpolates between
  neighbouring divisors); hard = the divisor.
- `switch_rows`: `LogKnob` in SWITCH_RANGE rows per expert, the load-aware kernel switch
  (003 §3.2 Conclusion 1, §4.4); the policy's kernel must be "threshold".
- `sm_comm`: `IntegerKnob` in SM_COMM_RANGE, the comm kernel's SMs; the GEMM gets the rest
  (003 §3.4, Table 6) when the policy sets sm_gemm > 0.

- `assignment` (beyond 003): `ChunkAssignment`, slot logits [D, E_loc, E_loc] per device;
  relaxed = softmax(logits / tau) over the slots, hard = the argmax slot; slot s is chunk
  s // (E_loc / N) at degree N (`assignment.py`). Export writes `chunk_assignment` (chunk
  ids at the exported pn). Baselines: the paper's contiguous groups, and `balanced_slots`
  (hottest expert first onto the least-loaded chunk, equal sizes).

Baselines (held-out, hard mode): the paper's heuristic (N* = sqrt(C / k) of E12 with C =
min(T_comm, T_comp) of the unpipelined run on the training popularity and k the per-chunk
overhead of the model, best divisor; the fixed 2048-row switch of Conclusion 1; 16 comm SMs
of Table 6), the 4096-row switch (the other end of Conclusion 1's band), and the hard grid
over the divisors.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from moejax import tunable as fam
from moejax.errors import ConfigError
from moejax.system import TuneSetup
from moejax.systems.epsmoe import assignment, relaxed
from moejax.systems.epsmoe import system as esys
from moejax.systems.epsmoe.config import divisors, make_config
from moejax.systems.epsmoe.layer import heuristic_pn
from moejax.trace.popularity import sample_from_popularity

SWITCH_RANGE = (128.0, 32768.0)  # rows per expert: Fig. 5 spans 128 .. 16384 (log box)
SM_COMM_RANGE = (4, 48)  # comm SMs: Fig. 7b saturates at 10-20 of 108 (A100)
PAPER_SWITCH = 2048.0  # 003 §3.2 Conclusion 1 (GroupGemm better below 2048 rows)
PAPER_SM_COMM = 16  # 003 Table 6 footnote
HEURISTIC_TOKENS = 2048  # simulated tokens of the trace the heuristic measures C on


@dataclasses.dataclass(frozen=True)
class DivisorKnob(fam.IntegerKnob):
    """A divisor of a count (the pipeline degree over the local experts): an `IntegerKnob`
    over the index lo .. hi of `divs`; hard values and `as_value` speak divisors."""

    divs: tuple[int, ...] = ()

    def init(self, key, start=None) -> jax.Array:
        idx = None if start is None else self.divs.index(int(start))
        return fam.IntegerKnob.init(self, key, idx)

    def hard(self, raw, tau=0.0) -> int:
        return self.divs[fam.IntegerKnob.hard(self, raw, tau)]

    def as_value(self, divisor) -> jax.Array:
        if int(divisor) not in self.divs:
            raise ConfigError(f"{self.name} = {divisor}; allowed: "
                              f"{', '.join(map(str, self.divs))}")
        return jnp.float32(self.divs.index(int(divisor)))


@dataclasses.dataclass(frozen=True)
class ChunkAssignment:
    """Chunk of each local expert on each device (`assignment.py`): raw slot logits
    [D, E_loc, E_loc]; relaxed = softmax over the slots at temperature tau (rows sum to 1,
    one-hot as tau -> 0); hard = the argmax slot of each (device, expert), int [D, E_loc].
    Slots, not chunks, so one value serves every pipeline degree (slot s is chunk
    s // (E_loc / N)); the identity is the paper's contiguous grouping."""

    num_devices: int
    local_experts: int
    name: str = "assignment"
    init_scale: float = 3.0  # logit margin of a starting assignment

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.num_devices, self.local_experts, self.local_experts)

    def init(self, key, start=None) -> jax.Array:
        """Raw logits: `init_scale` * one-hot(start) (slot ids or their one-hot; None:
        0) + small noise."""
        noise = 0.01 * jax.random.normal(key, self.shape, jnp.float32)
        if start is None:
            return noise
        start = jnp.asarray(start)
        if start.ndim == 2:
            start = self.one_hot(start)
        return self.init_scale * start.astype(jnp.float32) + noise

    def relaxed(self, raw, tau) -> jax.Array:
        return jax.nn.softmax(raw / jnp.maximum(jnp.asarray(tau, jnp.float32), 1e-4), -1)

    def hard(self, raw, tau=0.0) -> np.ndarray:
        return np.asarray(np.argmax(np.asarray(raw), -1), np.int64)

    def one_hot(self, slots) -> jax.Array:
        return jax.nn.one_hot(jnp.asarray(slots), self.local_experts, dtype=jnp.float32)

    def as_value(self, slots) -> jax.Array:
        slots = np.asarray(slots)
        if slots.shape != self.shape[:2] or ((slots < 0) | (slots >= self.local_experts)).any():
            raise ConfigError(f"{self.name}: expected {self.shape[:2]} slot ids in "
                              f"[0, {self.local_experts}), got shape {slots.shape}")
        return self.one_hot(slots)

    def penalty(self, value) -> jax.Array:
        return jnp.float32(0.0)  # the softmax keeps every row a distribution


def heuristic_trace(load_e, top_k: int, tokens: int = HEURISTIC_TOKENS, seed: int = 11):
    """One token-level trace [1, 1, 1, N, K] routed by the popularity load_e (Gumbel-top-k,
    `moejax.trace.popularity`): what the heuristic sees of the training traces."""
    pop = np.asarray(load_e, np.float64)
    pop = np.maximum(pop / max(pop.sum(), 1e-30), 1e-9)[None, None, :]
    return sample_from_popularity(pop, jax.random.key(seed), num_traces=1, tokens=tokens,
                                  top_k=top_k)


def paper_pn(cfg, base, traces, simulate) -> int:
    """E12's N* = sqrt(C / k) (best divisor, `layer.heuristic_pn`): C = min(T_comm, T_comp)
    of the unpipelined block (pn = 1, the hard system of `cfg`) on `traces`, k = the
    model's per-chunk overhead. simulate: the runner's `engine.simulate`."""
    hard = esys.build(dataclasses.replace(cfg, relaxed=()))
    p = base.replace(pn=jnp.float32(1.0), pn_index=jnp.float32(0.0), tau=jnp.float32(0.0))
    out = simulate(hard, p, traces, progress=False)
    c = min(float(np.mean(out["a2a_s"])), float(np.mean(out["gemm_s"])))
    return heuristic_pn(c, max(cfg.chunk_overhead_s, 1e-12), cfg.local_experts)[1]


def setup(platform, model, policy, num_iterations, names, capacity=0, *, simulate):
    """The `moejax.system.TuneSetup` of an EPS-MoE policy (see module); simulate: the
    runner's `engine.simulate`, for the paper's pipeline-degree heuristic."""
    del capacity
    relaxed.check(names)
    opts, switch, auto_pn = esys._read_options(policy.options_table())
    _, base = esys.from_policy(platform, model, policy.options_table(), num_iterations)
    if auto_pn:
        opts["pn"] = int(base.pn)
    cfg = make_config(platform, model, **opts)
    if cfg.mode == "tp-tp":
        raise ConfigError(f"policy {policy.name!r}: mode tp-tp has no expert pipeline, kernel "
                          "switch over chunks or SM split to tune; allowed modes: tp-ep, dp-ep")
    if "switch_rows" in names and opts["gemm"] != "threshold":
        raise ConfigError(f"param switch_rows: policy {policy.name!r} has gemm = "
                          f"{opts['gemm']!r}; allowed: gemm = 'threshold' (the load-aware switch)")
    divs = divisors(cfg.local_experts)
    if "pn" in names and len(divs) < 2:
        raise ConfigError(f"param pn: {cfg.local_experts} local expert(s) has one divisor; "
                          "nothing to tune")
    ident = assignment.identity_slots(cfg.num_devices, cfg.local_experts)
    cfg = dataclasses.replace(cfg, relaxed=tuple(names))
    system = esys.build(cfg, num_iterations)
    if "assignment" in names and cfg.chunk_assignment:
        raise ConfigError(f"param assignment: policy {policy.name!r} fixes chunk_assignment; "
                          "allowed: a policy without it (the tuner starts from contiguous)")
    d, e_loc = cfg.num_devices, cfg.local_experts
    every = {"pn": DivisorKnob("pn", 0, len(divs) - 1, divs),
             "switch_rows": fam.LogKnob("switch_rows", *SWITCH_RANGE),
             "sm_comm": fam.IntegerKnob("sm_comm", *SM_COMM_RANGE),
             "assignment": ChunkAssignment(d, e_loc)}
    families = {k: every[k] for k in names}
    defaults = {"pn": int(base.pn), "switch_rows": float(switch),
                "sm_comm": int(base.sm_comm), "assignment": ident}

    def apply(base, values, tau):
        get = lambda k, d: jnp.asarray(values.get(k, d), jnp.float32)  # noqa: E731
        sm_c = get("sm_comm", base.sm_comm)
        sm_g = jnp.where(base.sm_gemm > 0, cfg.sm_total - sm_c, 0.0)
        return base.replace(pn_index=get("pn", base.pn_index),
                            switch_rows=get("switch_rows", base.switch_rows),
                            sm_comm=sm_c, sm_gemm=sm_g, tau=jnp.asarray(tau, jnp.float32),
                            assign=jnp.asarray(values.get("assignment", base.assign),
                                               jnp.float32))

    heur = {}

    def baselines(load_e):
        key = tuple(np.round(np.asarray(load_e, np.float64), 6))
        if key not in heur:  # one hard run per training popularity
            tr = heuristic_trace(load_e, model.top_k)
            heur[key] = paper_pn(cfg, base, tr, simulate)
        paper = {"pn": heur[key], "switch_rows": PAPER_SWITCH, "sm_comm": PAPER_SM_COMM,
                 "assignment": ident}
        out = {f"paper (N*={paper['pn']}, 2048 rows, 16 comm SMs)": paper,
               "paper, 4096-row switch": {**paper, "switch_rows": 4096.0}}
        if "assignment" in names:  # at the policy's pn (the pn baselines keep contiguous)
            pn0 = int(base.pn)
            out[f"contiguous chunks (pn={pn0})"] = {**paper, "pn": pn0}
            out[f"balanced chunks (pn={pn0})"] = {
                **paper, "pn": pn0, "assignment": assignment.balanced_slots(
                    load_e, cfg.num_devices, pn0)}
        if "pn" in names:
            out.update({f"grid pn={n}": {**paper, "pn": n} for n in divs})
        if "sm_comm" in names:
            out.update({f"grid sm_comm={s}": {**paper, "sm_comm": s} for s in (8, 24, 32)})
        return out

    def options(hard):
        out = {}
        if "pn" in hard:
            out["pn"] = int(hard["pn"])
        if "switch_rows" in hard:
            out["switch_rows"] = float(hard["switch_rows"])
        if "assignment" in hard:  # chunk ids at the exported pn
            pn = int(hard.get("pn", base.pn))
            out["chunk_assignment"] = assignment.slots_to_chunks(
                hard["assignment"], cfg.local_experts, pn).tolist()
        if "sm_comm" in hard:
            out["sm_comm"] = int(hard["sm_comm"])
            if opts["sm_gemm"] > 0:
                out["sm_gemm"] = cfg.sm_total - int(hard["sm_comm"])
        return out

    return TuneSetup(system, base, families, apply, {k: defaults[k] for k in names}, baselines,
                 options)
