"""`moejax --help` that tells a new user what there is: every command with its one-line
help, the registered systems and the studies that reproduce them (both read from the
registry, `moejax.systems`), and every option's default."""

from __future__ import annotations

import argparse

from moejax import systems


def polish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the command and study lists to the top-level help and a `(default: ...)` to every
    option of every (sub)command whose default says something."""
    commands = _subcommands(parser)
    parser.description = (
        "Simulate MoE inference on multi-device hardware, tune its knobs, and reproduce "
        f"papers' results. Commands: {', '.join(commands)} (`moejax COMMAND --help` for "
        "each).")
    parser.epilog = "\n".join([
        f"systems (a policy's `system`): {', '.join(systems.SYSTEMS)}",
        f"studies (moejax reproduce NAME [--quick] --out DIR): {', '.join(systems.studies())}",
        "catalogs: moejax catalog hardware | models | policies | systems",
        "examples:",
        "  moejax simulate --hardware chiplet-2x2 --model qwen3-30b-a3b --policy ep --out res",
        "  moejax reproduce fsedp --quick --out results/fsedp",
    ])
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for p in _parsers(parser):
        _with_defaults(p)
        _one_line_errors(p)
    return parser


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """A usage error is one line naming the option and what is allowed, exit code 2 (as every
    other bad input), pointing at `--help` instead of printing the whole usage first."""

    def error(message: str):
        parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")

    parser.error = error


def _subcommands(parser) -> list[str]:
    return [name for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for name in a.choices]


def _parsers(parser):
    yield parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                yield from _parsers(sub)


def _with_defaults(parser: argparse.ArgumentParser) -> None:
    for a in parser._actions:
        if not a.option_strings or a.help == argparse.SUPPRESS:
            continue
        if (a.default is None or a.default is False or a.default == argparse.SUPPRESS
                or "default" in (a.help or "")):
            continue
        a.help = f"{a.help} (default: %(default)s)" if a.help else "default: %(default)s"
