"""Slot layouts: expert replicas on devices, the share of tokens each serves, their memory.

A device has `slots_per_device` expert slots per MoE layer: ceil(E / D) for the experts it
hosts anyway plus `redundant` extra ones (DeepSeek-V3's prefill deployment: "each GPU ...
will also host one additional redundant expert", EPLB README: "redundant experts"). A slot
layout `phy2log [L, S]` (S = D * slots_per_device, EPLB's output) names the logical expert
of each slot; slot s lives on device s // slots_per_device.

Replica-share rule (how a token's pair is split among an expert's replicas): evenly, share
1 / r of expert e's tokens to each of its r replicas. This is the expectation of vLLM's EPLB
dispatch (`eplb_map_to_physical_and_record`: replica = (position of the (token, choice)
pair) mod r, "to deterministically choose a replica") and of SGLang's random dispatch, and
exact for counts-only traces; two replicas on one device serve 2 / r there. A tuned
placement may instead carry learned shares (a weighted replica choice, vLLM's pluggable
`replica_prob` hook); systems read either as an `[..., E, D]` share matrix whose rows sum
to 1 (`moejax.systems.ep.EPParams.placement`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from moejax.catalog.hardware import Platform
from moejax.catalog.models import ModelSpec
from moejax.errors import ConfigError


def base_slots(num_experts: int, num_devices: int) -> int:
    """Slots a device needs without redundancy: ceil(E / D)."""
    return -(-num_experts // num_devices)


def slots_per_device(num_experts: int, num_devices: int, redundant: int) -> int:
    """ceil(E / D) + redundant slots per device and MoE layer."""
    if isinstance(redundant, bool) or not isinstance(redundant, int) or redundant < 0:
        raise ConfigError(f"redundant_slots = {redundant!r}; allowed: an integer >= 0")
    return base_slots(num_experts, num_devices) + redundant


def replica_counts(phy2log, num_experts: int, num_devices: int):
    """Replicas of expert e on device d, float32 [..., E, D], from a layout phy2log [..., S]."""
    phy2log = jnp.asarray(phy2log)
    s = phy2log.shape[-1]
    per = s // num_devices
    hot = jax.nn.one_hot(phy2log, num_experts, dtype=jnp.float32)  # [..., S, E]
    hot = hot.reshape(*phy2log.shape[:-1], num_devices, per, num_experts).sum(-2)
    return jnp.swapaxes(hot, -1, -2)


def even_shares(counts):
    """Token share [..., E, D] of each device under the even split: counts / replicas."""
    return counts / jnp.maximum(counts.sum(-1, keepdims=True), 1e-30)


def layout_shares(phy2log, num_experts: int, num_devices: int):
    """The [..., E, D] share matrix of a slot layout under the even split."""
    return even_shares(replica_counts(phy2log, num_experts, num_devices))


def hosts(shares):
    """1 where a device serves any of an expert's tokens, [..., E, D] float32."""
    return (jnp.asarray(shares) > 0).astype(jnp.float32)


def check_capacity(shares, slots: int) -> None:
    """ConfigError unless every device holds at most `slots` experts (per layer) and every
    expert's shares are >= 0 and sum to 1 (tokens are conserved)."""
    p = np.asarray(shares, np.float64)
    if (p < 0).any() or not np.allclose(p.sum(-1), 1.0, atol=1e-5):
        raise ConfigError("placement: shares must be >= 0 and each expert's sum to 1")
    used = (p > 0).sum(-2)  # [..., D]
    if used.max() > slots:
        where = np.unravel_index(int(used.argmax()), used.shape)
        raise ConfigError(f"placement: device {where[-1]} holds {int(used.max())} experts; "
                          f"allowed: at most {slots} slots per device")


# --- memory --------------------------------------------------------------------------------


def fixed_weight_bytes(model: ModelSpec) -> float:
    """Weights every device holds besides its routed-expert slots, for all layers: attention
    (data parallel: a full copy), shared experts and dense FFN blocks. Embeddings, the KV
    cache and activations are not counted (not every catalog model lists its vocabulary), so
    the slot bound below is an upper bound."""
    m = model
    dense = m.ffn_matrices * m.hidden_size * m.dense_ffn_size * m.weight_bytes
    return (m.num_layers * m.attention_weight_bytes + m.num_sparse_layers * m.shared_weight_bytes
            + m.num_dense_layers * dense)


def slot_bytes(model: ModelSpec) -> float:
    """Weight bytes of one slot per device: one routed expert in every MoE layer."""
    return model.expert_weight_bytes * model.num_sparse_layers


def device_weight_bytes(model: ModelSpec, num_devices: int, redundant: int) -> float:
    """Weight bytes per device with `redundant` extra slots (weights per slot x slots + the
    fixed weights)."""
    slots = slots_per_device(model.num_experts, num_devices, redundant)
    return fixed_weight_bytes(model) + slots * slot_bytes(model)


def max_redundant_slots(model: ModelSpec, platform: Platform) -> int:
    """The most redundant slots whose weights fit in the device memory (-1: not even the
    experts without redundancy fit)."""
    free = platform.device.memory_capacity_bytes - fixed_weight_bytes(model)
    fit = math.floor(free / slot_bytes(model))
    return fit - base_slots(model.num_experts, platform.num_devices)


def check_redundant_slots(redundant: int, model: ModelSpec, platform: Platform) -> int:
    """`redundant` if its weights fit the device memory, else a ConfigError naming it."""
    slots_per_device(model.num_experts, platform.num_devices, redundant)  # type / sign
    most = max_redundant_slots(model, platform)
    if redundant > most:
        need = device_weight_bytes(model, platform.num_devices, redundant)
        cap = platform.device.memory_capacity_bytes
        allowed = f"0 .. {most}" if most >= 0 else "none (the model does not fit)"
        raise ConfigError(
            f"redundant_slots = {redundant}: {model.name} on {platform.name} then needs "
            f"{need / 1e9:.1f} GB of weights per device ({slot_bytes(model) / 1e9:.2f} GB per "
            f"slot), the device has {cap / 1e9:.1f} GB; allowed: {allowed}")
    return redundant
