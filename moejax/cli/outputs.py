"""Every command's output paths, checked before any work (a bad `--out` found after the
simulation would cost the run and print a traceback): one `ConfigError` line naming the
option, nothing written. Then the output folder is locked for the run (`lock_outputs`), so
a second run writing it at the same time is refused instead of silently overwriting."""

from __future__ import annotations

import contextlib
from pathlib import Path

from moejax.output.lock import folder_lock
from moejax.output.outpaths import check_dir, check_file

# (command, subcommand) -> {argparse dest: "dir" | "file" | "file-in-folder"}; "file-in-folder":
# a file whose folder must exist already (the trace writer's rule, `moejax.trace.io.save`).
OUTPUTS: dict[tuple[str, ...], dict[str, str]] = {
    ("simulate",): {"out": "dir"},
    ("reproduce",): {"out": "dir"},
    ("sweep",): {"out": "dir"},
    ("tune",): {"out": "dir", "export": "file", "export_hardware": "file"},
    ("trace", "gen"): {"out": "file-in-folder"},
    ("trace", "import"): {"out": "file-in-folder"},
    ("trace", "slice"): {"out": "file-in-folder"},
    ("trace", "concat"): {"out": "file-in-folder"},
    ("trace", "split"): {"train": "file-in-folder", "heldout": "file-in-folder"},
    ("trace", "fit"): {"out": "file", "report": "file"},
    ("trace", "inspect"): {"plot": "file", "json": "file"},
    ("export", "latency-table"): {"out": "file"},
    ("validate",): {"out": "dir"},
}


def check_outputs(args) -> None:
    """Check the output paths of the parsed command `args` (see `OUTPUTS`)."""
    cmd = _command(args)
    for dest, kind in OUTPUTS.get(cmd, OUTPUTS.get(cmd[:1], {})).items():
        value = getattr(args, dest, None)
        if value:
            option = "--" + dest.replace("_", "-")
            if kind == "dir":
                check_dir(value, option)
            else:
                check_file(value, option, folder_must_exist=kind == "file-in-folder")


def _command(args) -> tuple:
    return (args.cmd, getattr(args, "trace_cmd", None) or getattr(args, "export_cmd", None))


def written_folders(args) -> list[tuple[str, str]]:
    """(option, folder) of each folder the parsed command `args` writes into."""
    found = [("--" + dest.replace("_", "-"), getattr(args, dest, None))
             for dest, kind in OUTPUTS.get(_command(args), OUTPUTS.get(_command(args)[:1], {}))
             .items() if kind == "dir"]
    if args.cmd == "reproduce" and getattr(args, "replot", None) and not args.out:
        found.append(("--replot", args.replot))  # the figures are redrawn into DIR itself
    return [(option, value) for option, value in found if value]


def lock_outputs(args) -> contextlib.ExitStack:
    """Hold the lock of every folder the command writes (`moejax.output.lock`) until the
    returned stack is closed; OutputError when another run holds one."""
    stack = contextlib.ExitStack()
    try:
        for option, folder in written_folders(args):
            if getattr(args, "resume", False) and not Path(folder).is_dir():
                continue  # nothing to resume there: the command says so, and makes nothing
            stack.enter_context(folder_lock(folder, option))
    except BaseException:
        stack.close()
        raise
    return stack
