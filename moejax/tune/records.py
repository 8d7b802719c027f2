"""What a tuning run's summary and export record of the run: its spec (with the fields a
recording leaves unused set to None) and its provenance (command line, version, seed, data)."""

from __future__ import annotations

from moejax.output import provenance as output_provenance
from moejax.trace import io as trace_io
from moejax.trace import provenance


def data_of(cfg) -> dict:
    """The provenance of a run's routing: the recording's (source, importer, options,
    derivation) and its train / held-out split, or the generator and seed."""
    if cfg.trace:
        return {**provenance.describe(cfg.trace, trace_io.load_meta(cfg.trace)),
                "split": f"train: the first {cfg.train_fraction:g} of the iterations, "
                         "held out: the rest"}
    return provenance.generated(cfg.trace_gen, cfg.seed)


def run_record(cfg) -> dict:
    """The run spec as a summary records it: on a recording, the generator-only fields
    (trace_gen, traces, eval_traces, tokens, iterations) are None, as they were not used."""
    spec = cfg.spec()
    if cfg.trace:
        spec.update({k: None for k in ("trace_gen", "traces", "eval_traces", "tokens",
                                       "iterations")})
    return spec


def run_provenance(cfg) -> dict:
    """Command line, version, seed and data of a run (`moejax.output.provenance`)."""
    return output_provenance.record(cfg.seed, data_of(cfg))
