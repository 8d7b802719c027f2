"""An EPLB plan as the wafer system's placement Params (001 MoEntwine's wafer-scale EP).

The wafer system (`moejax.systems.wafer.system`) places each expert natively on one device
(`WaferParams.placement [E, D]`, one-hot) and replicas in shadow slots (`WaferParams.shadow`,
0/1, `WaferConfig.shadow_slots` per device), and splits an expert's tokens evenly over its
hosts, which is EPLB's even split. This builds those params from an `[E, D]` share matrix
through the wafer's `config.default_params`: the native device of an expert is its first
host (lowest device id), the other hosts are shadows.
One plan serves every layer (the wafer's native placement is per expert, not per layer):
plan EPLB on the layer-summed loads.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from moejax.errors import ConfigError
from moejax.systems.wafer.config import default_params


def wafer_params(cfg, shares, **default_kw):
    """`WaferParams` of a wafer `cfg` whose native placement and shadows are the hosts of
    shares [E, D]; ConfigError if a device would need more shadow slots than the config
    has."""
    hosts = np.asarray(shares) > 0
    e, d = hosts.shape
    if (e, d) != (cfg.model.num_experts, cfg.num_devices):
        raise ConfigError(f"wafer placement: shares of shape {(e, d)}; allowed: "
                          f"{(cfg.model.num_experts, cfg.num_devices)}")
    native = np.zeros((e, d), np.float32)
    native[np.arange(e), hosts.argmax(-1)] = 1.0
    shadow = hosts.astype(np.float32) - native
    need = int(shadow.sum(0).max())
    if need > cfg.shadow_slots:
        raise ConfigError(f"wafer placement: a device holds {need} replicas besides its "
                          f"native experts; the config has shadow_slots = {cfg.shadow_slots} "
                          f"(allowed: >= {need})")
    base = default_params(cfg, **default_kw)
    return base.replace(placement=jnp.asarray(native), shadow=jnp.asarray(shadow))
