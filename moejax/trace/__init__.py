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
from moejax.trace.gen import (  # noqa: F401
    FAMILIES,
    WORKLOADS,
    GenSpec,
    counts_only,
    generate,
    generate_one,
    parse_spec,
    popularity,
    request_stream,
    spec_to_str,
    workload_ranges,
)
from moejax.trace.io import load, save  # noqa: F401
from moejax.trace.summary import (  # noqa: F401
    activated_experts_expected,
    format_summary,
    summarize,
)
