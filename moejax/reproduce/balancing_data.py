"""The balancing study's routing: the shipped recordings and the generators, as disjoint
training and held-out per-expert loads at a chosen batch size.

Recordings (`data/balancing_recordings.npz`, made by `experiments/balancing_recordings.py`
from real routing recordings, docs/traces.md): ESFT intent and law (DeepSeek-V2-Lite layout:
64 experts, top-6, 26 MoE layers; one iteration per sequence) and OLMoE-1B-7B / Mixtral-8x7B
(64 / 8 experts, top-8 / top-2, layers 0, 7, 15; one iteration per domain).

Splits never mix: ESFT trains on its first half of sequences and is scored on the second
half; OLMoE and Mixtral train on the domains arxiv, c4, wikipedia and are scored on book and
github (docs/traces.md's halves: a domain shift, their hot experts move with the domain);
the generators draw one popularity and sample training and held-out batches with separate
keys (powerlaw), or train on the first half of a drifting sequence and are scored on the
second (drift).

A batch of B tokens: ESFT sums the counts of whole sequences drawn (with replacement) from
its part until B tokens (so the coherence of tokens within a sequence is kept); the others
draw B x k (token, expert) pairs from the part's per-layer shares (a multinomial: counts
only, ignoring that one token's k choices are distinct).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import numpy as np

from moejax.errors import ConfigError
from moejax.trace import gen

DATA = Path(__file__).resolve().parent / "data" / "balancing_recordings.npz"
TRAIN_DOMAINS = ("arxiv", "c4", "wikipedia")
TEST_DOMAINS = ("book", "github")


@dataclasses.dataclass(frozen=True)
class Workload:
    """One routing source of the study and the catalog model whose layout it has."""

    name: str
    model: str
    label: str  # for tables and plots
    kind: str  # "sequences" (ESFT), "domains" (OLMoE, Mixtral), "generator"
    spec: str = ""  # generator spec


WORKLOADS = {
    "esft_intent": Workload("esft_intent", "deepseek-moe-16b", "ESFT intent", "sequences"),
    "esft_law": Workload("esft_law", "deepseek-moe-16b", "ESFT law", "sequences"),
    # dysharp-s: 64 experts, top-8, the catalog model with OLMoE-1B-7B's routing layout
    "olmoe": Workload("olmoe", "dysharp-s", "OLMoE-1B-7B", "domains"),
    "mixtral": Workload("mixtral", "mixtral-8x7b", "Mixtral-8x7B", "domains"),
    # docs/traces.md: the recordings fit power-law alpha 0.46 - 0.71 at 64 experts
    "powerlaw": Workload("powerlaw", "deepseek-moe-16b", "power law (alpha 0.6)", "generator",
                         "powerlaw:alpha=0.6"),
    "drift": Workload("drift", "deepseek-moe-16b", "drift (4 scenarios)", "generator",
                      "drift:rho=0.9,scale=0.7,noise=0.2,quantile=1,scenarios=4,period=32"),
}


@functools.cache
def recordings() -> dict:
    """name -> {counts [I, L, E], tokens [I], top_k, source, domains?} of the shipped file."""
    with np.load(DATA) as z:
        out: dict = {}
        for key in z.files:
            name, field = key.split("/")
            out.setdefault(name, {})[field] = z[key]
    return out


def _part(rec: dict, kind: str, part: str) -> np.ndarray:
    """Counts [I', L, E] of the training or held-out part of a recording."""
    counts = rec["counts"].astype(np.float64)
    if kind == "sequences":
        half = counts.shape[0] // 2
        return counts[:half] if part == "train" else counts[half:]
    names = list(rec["domains"])
    pick = TRAIN_DOMAINS if part == "train" else TEST_DOMAINS
    return counts[[names.index(d) for d in pick]]


def batches(w: Workload, part: str, num_traces: int, tokens: int, num_layers: int,
            num_experts: int, top_k: int, seed: int = 0) -> np.ndarray:
    """Per-expert loads [T, L, E] of `num_traces` batches of about `tokens` tokens from the
    `part` ('train' or 'test') of workload `w`."""
    if part not in ("train", "test"):
        raise ConfigError(f"part = {part!r}; allowed: train, test")
    rng = np.random.default_rng([seed, 0 if part == "train" else 1])
    if w.kind == "generator":
        return _generated(w, part, num_traces, tokens, num_layers, num_experts, top_k, seed)
    rec = recordings()[w.name]
    counts = _part(rec, w.kind, part)
    if w.kind == "sequences":
        per_seq = counts[:, 0].sum(-1) / top_k  # tokens of each sequence
        out = np.zeros((num_traces, *counts.shape[1:]))
        for t in range(num_traces):  # host side, once per study step
            total = 0.0
            while total < tokens:
                i = rng.integers(counts.shape[0])
                out[t] += counts[i]
                total += per_seq[i]
        return out
    shares = counts / counts.sum(-1, keepdims=True)  # [domains, L, E]
    dom = rng.integers(shares.shape[0], size=num_traces)
    return np.stack([[rng.multinomial(tokens * top_k, shares[d, l])
                      for l in range(shares.shape[1])] for d in dom]).astype(np.float64)


def _generated(w, part, num_traces, tokens, num_layers, num_experts, top_k, seed):
    rng = np.random.default_rng([seed, 7, 0 if part == "train" else 1])
    if w.spec.startswith("drift"):
        # one drifting sequence of 2 T iterations: train on the first half, test on the second
        pop = np.asarray(gen.popularity(w.spec, jax.random.key(seed), iterations=2 * num_traces,
                                        layers=num_layers, num_experts=num_experts), np.float64)
        pop = pop[:num_traces] if part == "train" else pop[num_traces:]
    else:
        pop = np.asarray(gen.popularity(w.spec, jax.random.key(seed), iterations=1,
                                        layers=num_layers, num_experts=num_experts), np.float64)
        pop = np.broadcast_to(pop, (num_traces, num_layers, num_experts))
    pop = pop / pop.sum(-1, keepdims=True)
    return np.stack([[rng.multinomial(tokens * top_k, p) for p in it] for it in pop]).astype(
        np.float64)


def drifting_sequence(w: Workload, iterations: int, tokens: int, num_layers: int,
                      num_experts: int, top_k: int, seed: int = 0) -> np.ndarray:
    """Per-expert loads [I, L, E] of one long sequence of batches in time order: the drift
    generator's iterations, or the recording's domains / sequence halves in turn."""
    rng = np.random.default_rng([seed, 11])
    if w.kind == "generator":
        pop = np.asarray(gen.popularity(w.spec, jax.random.key(seed + 1), iterations=iterations,
                                        layers=num_layers, num_experts=num_experts), np.float64)
    else:
        rec = recordings()[w.name]
        counts = rec["counts"].astype(np.float64)
        shares = counts / counts.sum(-1, keepdims=True)
        phase = np.arange(iterations) * shares.shape[0] // iterations  # each domain in turn
        pop = shares[phase]
    pop = pop / pop.sum(-1, keepdims=True)
    return np.stack([[rng.multinomial(tokens * top_k, p) for p in it] for it in pop]).astype(
        np.float64)
