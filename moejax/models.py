"""MoE model specs: the models of the five papers' tables, typed and immutable.

Values the papers give (their Table I / text) are used as given; values they leave out come
from each model's public configuration (Hugging Face `config.json`), marked `# public cfg`.
"""

from __future__ import annotations

import dataclasses

from moejax.errors import ConfigError, UnknownNameError

ATTENTION_KINDS = ("MHA", "GQA", "MQA", "MLA")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One MoE model. Sizes are element counts; bytes per element are separate fields."""

    name: str
    source: str  # where the numbers come from (paper table, public config)
    hidden_size: int  # d_model
    expert_ffn_size: int  # intermediate size of one routed expert
    num_experts: int  # routed experts per MoE layer (E)
    top_k: int  # routed experts per token (K)
    num_shared_experts: int  # always-on experts per MoE layer
    shared_ffn_size: int  # intermediate size of one shared expert (0 if none)
    num_sparse_layers: int  # MoE layers
    num_layers: int  # all transformer blocks
    dense_ffn_size: int  # FFN size of the dense (non-MoE) blocks (0 if every block is MoE)
    num_heads: int  # attention query heads
    num_kv_heads: int  # key/value heads (== num_heads for MHA, 1 for MQA)
    head_dim: int  # per-head dimension (for MLA: the q/k head dim incl. rope part)
    attention_kind: str  # MHA | GQA | MQA | MLA
    weight_bytes: float = 2.0  # bytes per weight element (bf16 = 2)
    act_bytes: float = 2.0  # bytes per activation element
    ffn_matrices: int = 3  # 3 for gated FFNs (SwiGLU: gate, up, down), 2 for plain
    kv_lora_rank: int = 0  # MLA compressed KV dimension (0 for non-MLA)
    total_params: float = 0.0  # parameter count the paper quotes, for display (0: unknown)

    def __post_init__(self):
        validate_model(self)

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of one routed expert's weights."""
        return self.ffn_matrices * self.hidden_size * self.expert_ffn_size * self.weight_bytes

    @property
    def expert_flops_per_token(self) -> float:
        """FLOPs one token spends in one routed expert (2 per multiply-accumulate)."""
        return 2.0 * self.ffn_matrices * self.hidden_size * self.expert_ffn_size

    @property
    def shared_flops_per_token(self) -> float:
        """FLOPs one token spends in all shared experts of one layer."""
        return 2.0 * self.ffn_matrices * self.hidden_size * self.shared_ffn_size * (
            self.num_shared_experts
        )

    @property
    def shared_weight_bytes(self) -> float:
        """Bytes of all shared experts of one layer."""
        return (
            self.ffn_matrices * self.hidden_size * self.shared_ffn_size
            * self.num_shared_experts * self.weight_bytes
        )

    @property
    def token_bytes(self) -> float:
        """Bytes of one token's hidden state (what all-to-all moves per (token, expert))."""
        return self.hidden_size * self.act_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token adds in one layer."""
        if self.attention_kind == "MLA":
            return (self.kv_lora_rank + 64) * self.act_bytes  # latent + rope key (64)
        return 2 * self.num_kv_heads * self.head_dim * self.act_bytes

    @property
    def attention_weight_bytes(self) -> float:
        """Bytes of one attention block's projection weights (Q, K, V, O)."""
        q_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return (q_o + kv) * self.weight_bytes

    @property
    def attention_flops_per_token(self) -> float:
        """Projection FLOPs of one attention block for one token (context term separate)."""
        return 2.0 * self.attention_weight_bytes / self.weight_bytes

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_sparse_layers


def validate_model(m: ModelSpec) -> None:
    """Raise ConfigError naming the first bad field of `m`."""
    ints = [
        "hidden_size", "expert_ffn_size", "num_experts", "top_k", "num_sparse_layers",
        "num_layers", "num_heads", "num_kv_heads", "head_dim", "ffn_matrices",
    ]
    for f in ints:
        v = getattr(m, f)
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"model {m.name}: {f} = {v!r} must be an integer >= 1")
    for f in ["num_shared_experts", "shared_ffn_size", "dense_ffn_size", "kv_lora_rank"]:
        v = getattr(m, f)
        if not isinstance(v, int) or v < 0:
            raise ConfigError(f"model {m.name}: {f} = {v!r} must be an integer >= 0")
    for f in ["weight_bytes", "act_bytes"]:
        if not getattr(m, f) > 0:
            raise ConfigError(f"model {m.name}: {f} must be > 0")
    if m.top_k > m.num_experts:
        raise ConfigError(
            f"model {m.name}: top_k = {m.top_k} > num_experts = {m.num_experts}"
        )
    if m.num_sparse_layers > m.num_layers:
        raise ConfigError(f"model {m.name}: num_sparse_layers > num_layers")
    if m.attention_kind not in ATTENTION_KINDS:
        raise ConfigError(
            f"model {m.name}: attention_kind = {m.attention_kind!r}; "
            f"allowed: {', '.join(ATTENTION_KINDS)}"
        )
    if m.num_heads % m.num_kv_heads:
        raise ConfigError(f"model {m.name}: num_heads must be a multiple of num_kv_heads")


# The catalog. Filled from the papers' tables; see each entry's `source`.
MODELS: dict[str, ModelSpec] = {}


def _add(**kw) -> None:
    MODELS[kw["name"]] = ModelSpec(**kw)


def load_model(name: str) -> ModelSpec:
    """A model spec by catalog name."""
    if name not in MODELS:
        raise UnknownNameError("model", name, MODELS)
    return MODELS[name]


def model_names() -> list[str]:
    return sorted(MODELS)


def with_overrides(m: ModelSpec, **changes) -> ModelSpec:
    """A validated copy of `m` with some fields changed (e.g. top_k for a sweep)."""
    return dataclasses.replace(m, **changes)
