"""The `moejax` command line: simulate, catalog, reproduce, trace, tune, sweep, export, validate.

One module per subcommand (`moejax.cli.simulate`, `catalog`, `reproduce`, `trace`, `tune`,
`sweep`, `export`, `validate`), each with `add_parser(sub)` and the function it dispatches to; this
module builds the parser and dispatches. Errors from bad input are one line on stderr and
exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from moejax.errors import MoejaxError


def build_parser() -> argparse.ArgumentParser:
    # the subcommands' modules import jax and the systems: seconds that Ctrl-C may hit, so
    # they are imported here, inside `main`'s guard, not at module level
    from moejax.cli import catalog, export, reproduce, simulate, sweep, trace, tune, validate
    from moejax.cli.help import polish

    p = argparse.ArgumentParser(prog="moejax", description=__doc__.splitlines()[0])
    p.add_argument("--compilation-cache", metavar="PATH|off", default=None, help=CACHE_HELP)
    sub = p.add_subparsers(dest="cmd", required=True)
    for module in (simulate, catalog, reproduce, trace, tune, sweep, export, validate):
        module.add_parser(sub)
    for sp in sub.choices.values():  # also after the subcommand
        sp.add_argument("--compilation-cache", metavar="PATH|off", default=argparse.SUPPRESS,
                        help=CACHE_HELP)
    for name in REPORT_COMPILES:  # the commands whose programs the engine compiles
        sub.choices[name].add_argument("--quick-compile", action="store_true", help=QUICK_HELP)
    return polish(p)  # command, system and study lists, every option's default


CACHE_HELP = ("folder of compiled programs kept between runs (JAX's persistent compilation "
              "cache), or 'off' (default $MOEJAX_COMPILATION_CACHE, else "
              "~/.cache/moejax/jax)")
QUICK_HELP = ("compile the simulator's programs 3.7-5.6x faster (XLA's older CPU emitters at "
              "LLVM -O0): slower code, and float32 sums that may differ from the default "
              "compile's in the last bit; CPU only (default: $MOEJAX_QUICK_COMPILE, else off)")
# Subcommands that say on stderr when a call compiles ("compiling ep for 128 traces x 256
# tokens ...", then its time); the others print their own progress.
REPORT_COMPILES = ("simulate", "sweep")


def main(argv: list[str] | None = None) -> int:
    try:  # the parser imports the subcommands' modules (jax): seconds that Ctrl-C may hit
        from moejax.output import provenance

        provenance.set_command(sys.argv[1:] if argv is None else list(argv))
        args = build_parser().parse_args(argv)
        from moejax.cli.outputs import check_outputs, lock_outputs
        from moejax.runner import distributed, programs

        check_outputs(args)  # before any work: a bad --out is one line, nothing written
        programs.enable_persistent_cache(programs.cache_setting(args.compilation_cache))
        distributed.initialize(distributed.launch_from_args(args))
        # after joining: quick compiles' check runs a JAX computation, and a process may not
        # compute before `jax.distributed.initialize`
        if getattr(args, "quick_compile", None):
            programs.quick_compile(True)
        programs.quick_compiling()  # a bad $MOEJAX_QUICK_COMPILE: one line, nothing run
        programs.report_compiles(args.cmd in REPORT_COMPILES and not getattr(args, "quiet", False))
        try:
            if not distributed.is_writer():  # process 0 alone writes, and locks
                return args.fn(args)
            with lock_outputs(args):  # one run per --out at a time
                return args.fn(args)
        finally:
            programs.report_compiles(None)
    except MoejaxError as e:
        print(f"moejax: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a write refused by the file system, where no layer said more
        from moejax.output.results import write_error_reason

        reason = write_error_reason(e)
        if reason is None:
            raise
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        print(f"moejax: error: cannot write{where}: {reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("moejax: interrupted", file=sys.stderr)
        if argv is None:  # the console command: leave without interpreter teardown, which
            # could race XLA's threads ("pure virtual method called", rc 134)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        return 130


if __name__ == "__main__":
    sys.exit(main())
