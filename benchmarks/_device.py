"""The `--device cpu|gpu` flag every benchmark takes, and the environment line it prints.

    ap = argparse.ArgumentParser(...)
    _device.add_argument(ap)
    args = ap.parse_args()
    _device.select(args.device)     # before any JAX array is made; prints backend, device, jax
"""

from __future__ import annotations

import os
import platform
import sys

CHOICES = ("cpu", "gpu")


def add_argument(ap) -> None:
    ap.add_argument("--device", choices=CHOICES, default="cpu",
                    help="run the vectorized side on this backend (default cpu; gpu needs a "
                         "CUDA jaxlib and a visible GPU)")


def select(device: str) -> str:
    """Make `device` JAX's default backend; print backend, device name, jax version, cores.

    Exits with one line and code 2 when the backend is not available."""
    import jax

    if device not in CHOICES:
        sys.exit(f"error: --device {device!r}: allowed values are {', '.join(CHOICES)}")
    try:
        devices = jax.devices(device)
    except RuntimeError as e:
        print(f"error: --device {device}: no such backend here ({str(e).splitlines()[0]})",
              file=sys.stderr)
        sys.exit(2)
    jax.config.update("jax_default_device", devices[0])
    print(f"backend {devices[0].platform}, device {devices[0].device_kind} x{len(devices)}, "
          f"jax {jax.__version__}, {os.cpu_count()} CPU cores, python {platform.python_version()}")
    return devices[0].platform
