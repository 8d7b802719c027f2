"""Every command's output paths, checked before any work (a bad `--out` found after the
simulation would cost the run and print a traceback): one `ConfigError` line naming the
option, nothing written."""

from __future__ import annotations

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
    cmd = (args.cmd, getattr(args, "trace_cmd", None) or getattr(args, "export_cmd", None))
    for dest, kind in OUTPUTS.get(cmd, OUTPUTS.get(cmd[:1], {})).items():
        value = getattr(args, dest, None)
        if value:
            option = "--" + dest.replace("_", "-")
            if kind == "dir":
                check_dir(value, option)
            else:
                check_file(value, option, folder_must_exist=kind == "file-in-folder")
