"""Routing traces: the pytree, generators, on-disk format, summaries."""

from moejax.trace.core import (  # noqa: F401
    SCHEMA_VERSION,
    RequestStream,
    Trace,
    counts_from_ids,
    from_counts,
    from_ids,
    stack,
    validate,
)
from moejax.trace.families import FAMILIES  # noqa: F401
from moejax.trace.gen import (  # noqa: F401
    GenSpec,
    counts_only,
    generate,
    generate_one,
    parse_spec,
    popularity,
    spec_to_str,
)
from moejax.trace.io import load, save  # noqa: F401
from moejax.trace.requests import WORKLOADS, request_stream, workload_ranges  # noqa: F401
from moejax.trace.summary import (  # noqa: F401
    activated_experts_expected,
    format_summary,
    summarize,
)
