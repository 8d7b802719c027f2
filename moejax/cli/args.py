"""Argument types and defaults shared by the subcommands' parsers."""

from __future__ import annotations

import argparse

from moejax.errors import ConfigError
from moejax.runner import distributed
from moejax.trace import gen

DEFAULT_GEN = "powerlaw:alpha=1.2"
# Generator versions a user may name (`--generator`): "1", Gumbel-top-k from threefry
# (`moejax.trace.gen`, the stream of every committed result), or "fast", version 3
# (`moejax.trace.gen_fast`: the same law, another stream, a compiled CPU sampler).
GENERATORS = {"1": 1, "fast": 3, "3": 3}
DEFAULT_GENERATOR = "1"


class DefaultInt(int):
    """An option's default value, told apart from the same value given on the command line
    (`simulate --trace` refuses --tokens / --traces / --iterations given explicitly)."""


def given(args, *dests: str) -> list[str]:
    """The options among `dests` (argparse dests) given on the command line, as `--name`:
    a default is a `DefaultInt`, None or False, so any other value was given."""
    return [f"--{d.replace('_', '-')}" for d in dests
            if not isinstance(v := getattr(args, d, None), DefaultInt)
            and v is not None and v is not False]


def add_generator_argument(parser) -> None:
    """`--generator VERSION` on a subcommand that generates traces."""
    parser.add_argument("--generator", default=DEFAULT_GENERATOR,
                        help="generator version: 1 (default; Gumbel-top-k, the stream of the "
                        "committed results) or fast (version 3: the same law from another "
                        "random stream, several times faster; docs/performance.md)")


def generator_version(name) -> int:
    """The version number `--generator NAME` names; ConfigError (one line) if none."""
    key = str(name).strip().lower()
    if key not in GENERATORS:
        raise ConfigError(f"--generator: {name!r} is not a generator version; allowed: "
                          "1 (default), fast (version 3)")
    return GENERATORS[key]


def generate_chunked(version: int, spec, key, **kw):
    """`moejax.trace.gen.generate_chunked` (version 1) or `gen_fast`'s (version 3), with
    `gen`'s arguments; version 3 is imported here, on demand (numba loads its kernels)."""
    if version == 1:
        return gen.generate_chunked(spec, key, **kw)
    from moejax.trace import gen_fast

    return gen_fast.generate_chunked(spec, key, **kw)


def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s!r} must be >= 1")
    return v


def int_list(s: str) -> list[int]:
    """Comma-separated integers >= 1 (e.g. batch sizes)."""
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: comma-separated integers expected") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: integers >= 1 expected")
    return out


def add_distributed_arguments(parser) -> None:
    """The multi-process flags, on a subcommand's parser (simulate, reproduce, tune, sweep)."""
    g = parser.add_argument_group("multi-process (jax.distributed; see docs/scaling.md)")
    g.add_argument("--coordinator", default=None,
                   help="HOST:PORT of process 0 (default $JAX_COORDINATOR_ADDRESS)")
    g.add_argument("--num-processes", type=int, default=None,
                   help="processes in the run (default $JAX_NUM_PROCESSES)")
    g.add_argument("--process-id", type=int, default=None,
                   help="this process's rank, 0..N-1 (default $JAX_PROCESS_ID)")
    g.add_argument("--distributed", action="store_true",
                   help="join a run whose layout jax detects (SLURM, Open MPI) when no "
                        "coordinator is given")
    g.add_argument("--distributed-timeout", type=int, default=distributed.DEFAULT_TIMEOUT_S,
                   help=f"seconds to wait for the coordinator and peers "
                        f"(default {distributed.DEFAULT_TIMEOUT_S})")
