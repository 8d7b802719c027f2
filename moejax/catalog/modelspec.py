"""One MoE model: `ModelSpec`, its validation, and its reading from a `models/*.toml` file.

Sizes are element counts; bytes per element are separate fields. Attention comes in four
kinds, each with its own projection shapes (Hugging Face module names in brackets):

- MHA / GQA / MQA: q [q_proj] hidden -> heads x head_dim; k, v [k_proj, v_proj] hidden ->
  kv_heads x head_dim (v: v_head_dim); o [o_proj] heads x v_head_dim -> hidden. The KV cache
  holds k and v of every kv head.
- MLA (DeepSeek-V2 §2.1, DeepSeek-V3 §2.1.1): q through a low-rank bottleneck of q_lora_rank
  [q_a_proj, q_b_proj] (or one matrix [q_proj] when q_lora_rank is 0) to heads x
  (qk_nope + qk_rope); keys and values compressed to kv_lora_rank plus one shared rope key
  [kv_a_proj_with_mqa], expanded per head to qk_nope + v_head_dim [kv_b_proj]; o from
  heads x v_head_dim. The KV cache holds only the latent and the rope key.

Sliding-window attention (gpt-oss, Mistral): `sliding_window_layers` of the `num_layers`
blocks attend to at most `sliding_window` previous tokens.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from moejax.catalog.schema import Table, read_toml
from moejax.errors import ConfigError

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
    num_kv_heads: int  # key/value heads (== num_heads for MHA and MLA, 1 for MQA)
    head_dim: int  # per-head q/k dimension (for MLA: qk_nope_head_dim + qk_rope_head_dim)
    attention_kind: str  # MHA | GQA | MQA | MLA
    weight_bytes: float = 2.0  # bytes per weight element (bf16 = 2)
    act_bytes: float = 2.0  # bytes per activation element
    ffn_matrices: int = 3  # 3 for gated FFNs (SwiGLU: gate, up, down), 2 for plain
    kv_lora_rank: int = 0  # MLA compressed KV dimension (0 for non-MLA)
    q_lora_rank: int = 0  # MLA query bottleneck (0: one full q projection)
    qk_rope_head_dim: int = 0  # MLA decoupled rope part of head_dim (0 for non-MLA)
    v_head_dim: int = 0  # per-head value dimension (0: head_dim)
    sliding_window: int = 0  # tokens a windowed block attends to (0: no window)
    sliding_window_layers: int = 0  # blocks with the window (the rest attend to everything)
    vocab_size: int = 0  # token vocabulary (0: unknown; embeddings left out of counts)
    tie_embeddings: bool = False  # input embedding and LM head share one matrix
    total_params: float = 0.0  # parameter count the paper or model card quotes (0: unknown)

    def __post_init__(self):
        validate_model(self)

    # --- experts --------------------------------------------------------------------------

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (elements)."""
        return self.ffn_matrices * self.hidden_size * self.expert_ffn_size

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of one routed expert's weights."""
        return self.expert_params * self.weight_bytes

    @property
    def expert_flops_per_token(self) -> float:
        """FLOPs one token spends in one routed expert (2 per multiply-accumulate)."""
        return 2.0 * self.expert_params

    @property
    def shared_params(self) -> int:
        """Weights of all shared experts of one MoE layer (elements)."""
        return self.ffn_matrices * self.hidden_size * self.shared_ffn_size * (
            self.num_shared_experts)

    @property
    def shared_flops_per_token(self) -> float:
        """FLOPs one token spends in all shared experts of one layer."""
        return 2.0 * self.shared_params

    @property
    def shared_weight_bytes(self) -> float:
        """Bytes of all shared experts of one layer."""
        return self.shared_params * self.weight_bytes

    @property
    def router_params(self) -> int:
        """Weights of one MoE layer's gate (hidden -> routed experts)."""
        return self.hidden_size * self.num_experts

    @property
    def token_bytes(self) -> float:
        """Bytes of one token's hidden state (what all-to-all moves per (token, expert))."""
        return self.hidden_size * self.act_bytes

    # --- attention ------------------------------------------------------------------------

    @property
    def value_head_dim(self) -> int:
        """Per-head value (and attention output) dimension."""
        return self.v_head_dim or self.head_dim

    @property
    def qk_nope_head_dim(self) -> int:
        """MLA: the part of head_dim without rope (0 for non-MLA)."""
        return self.head_dim - self.qk_rope_head_dim if self.attention_kind == "MLA" else 0

    @property
    def attention_params(self) -> int:
        """Projection weights of one attention block (elements), by the kind's shapes."""
        h, nh, qk, v = self.hidden_size, self.num_heads, self.head_dim, self.value_head_dim
        o = nh * v * h
        if self.attention_kind == "MLA":
            r = self.q_lora_rank
            q = h * r + r * nh * qk if r else h * nh * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * nh * (
                self.qk_nope_head_dim + v)
            return q + kv + o
        return h * nh * qk + h * self.num_kv_heads * (qk + v) + o

    @property
    def attention_weight_bytes(self) -> float:
        """Bytes of one attention block's projection weights."""
        return self.attention_params * self.weight_bytes

    @property
    def attention_flops_per_token(self) -> float:
        """Projection FLOPs of one attention block for one token (context term separate):
        each projection weight is one multiply-accumulate per token."""
        return 2.0 * self.attention_params

    @property
    def attention_context_flops(self) -> float:
        """FLOPs one query token spends per context token in one block: q.k over the q/k
        head dim and p.v over the value head dim, every query head (MLA without absorption)."""
        return 2.0 * self.num_heads * (self.head_dim + self.value_head_dim)

    def context_tokens(self, ctx):
        """Mean context tokens one query attends to per block, given `ctx` tokens before it:
        windowed blocks see at most `sliding_window`. Works on floats and arrays."""
        if not (self.sliding_window and self.sliding_window_layers):
            return ctx
        frac = self.sliding_window_layers / self.num_layers
        return ctx - frac * (ctx - self.sliding_window) * (ctx > self.sliding_window)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token adds in one layer (MLA: latent + shared rope key)."""
        if self.attention_kind == "MLA":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.act_bytes
        return self.num_kv_heads * (self.head_dim + self.value_head_dim) * self.act_bytes

    # --- whole model ----------------------------------------------------------------------

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_sparse_layers

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied); 0 when vocab is unknown."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    def param_count(self) -> int:
        """All weight matrices (norms and biases left out: < 0.01% of these models)."""
        dense = self.ffn_matrices * self.hidden_size * self.dense_ffn_size
        moe = self.num_experts * self.expert_params + self.shared_params + self.router_params
        return (self.embedding_params + self.num_layers * self.attention_params
                + self.num_dense_layers * dense + self.num_sparse_layers * moe)

    def active_param_count(self, input_embedding: bool = True) -> int:
        """Weights one token uses: top_k routed experts instead of all. Model cards differ on
        the input embedding (a lookup, no FLOPs): `input_embedding=False` leaves it out."""
        inactive = (self.num_experts - self.top_k) * self.expert_params * self.num_sparse_layers
        skip = self.vocab_size * self.hidden_size if not (input_embedding or
                                                          self.tie_embeddings) else 0
        return self.param_count() - inactive - skip


def validate_model(m: ModelSpec) -> None:
    """Raise ConfigError naming the first bad field of `m`."""
    ints = [
        "hidden_size", "expert_ffn_size", "num_experts", "top_k", "num_sparse_layers",
        "num_layers", "num_heads", "num_kv_heads", "head_dim", "ffn_matrices",
    ]
    for f in ints:
        v = getattr(m, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"model {m.name}: {f} = {v!r} must be an integer >= 1")
    for f in ["num_shared_experts", "shared_ffn_size", "dense_ffn_size", "kv_lora_rank",
              "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "sliding_window",
              "sliding_window_layers", "vocab_size"]:
        v = getattr(m, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
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
    if m.sliding_window_layers > m.num_layers:
        raise ConfigError(f"model {m.name}: sliding_window_layers > num_layers")
    if m.attention_kind not in ATTENTION_KINDS:
        raise ConfigError(
            f"model {m.name}: attention_kind = {m.attention_kind!r}; "
            f"allowed: {', '.join(ATTENTION_KINDS)}"
        )
    if m.num_heads % m.num_kv_heads:
        raise ConfigError(f"model {m.name}: num_heads must be a multiple of num_kv_heads")
    mla = m.attention_kind == "MLA"
    if mla and not (m.kv_lora_rank > 0 and 0 < m.qk_rope_head_dim < m.head_dim):
        raise ConfigError(
            f"model {m.name}: MLA needs kv_lora_rank >= 1 and 1 <= qk_rope_head_dim < "
            f"head_dim (= qk_nope + qk_rope); got kv_lora_rank = {m.kv_lora_rank}, "
            f"qk_rope_head_dim = {m.qk_rope_head_dim}, head_dim = {m.head_dim}"
        )
    if not mla and (m.kv_lora_rank or m.q_lora_rank or m.qk_rope_head_dim):
        raise ConfigError(
            f"model {m.name}: kv_lora_rank, q_lora_rank and qk_rope_head_dim are MLA fields; "
            f"attention_kind is {m.attention_kind}"
        )


def parse_model(data: dict, where: str, name: str) -> ModelSpec:
    """A ModelSpec from one parsed `models/*.toml` table (flat keys, named by the file)."""
    t = Table(data, where)
    ints0 = dict(lo=0)
    spec = ModelSpec(
        name=name,
        source=t.str("source"),
        hidden_size=t.int("hidden_size"),
        expert_ffn_size=t.int("expert_ffn_size"),
        num_experts=t.int("num_experts"),
        top_k=t.int("top_k"),
        num_shared_experts=t.int("num_shared_experts", 0, **ints0),
        shared_ffn_size=t.int("shared_ffn_size", 0, **ints0),
        num_sparse_layers=t.int("num_sparse_layers"),
        num_layers=t.int("num_layers"),
        dense_ffn_size=t.int("dense_ffn_size", 0, **ints0),
        num_heads=t.int("num_heads"),
        num_kv_heads=t.int("num_kv_heads"),
        head_dim=t.int("head_dim"),
        attention_kind=t.str("attention_kind", choices=ATTENTION_KINDS),
        weight_bytes=t.float("weight_bytes", 2.0),
        act_bytes=t.float("act_bytes", 2.0),
        ffn_matrices=t.int("ffn_matrices", 3, lo=2, hi=3),
        kv_lora_rank=t.int("kv_lora_rank", 0, **ints0),
        q_lora_rank=t.int("q_lora_rank", 0, **ints0),
        qk_rope_head_dim=t.int("qk_rope_head_dim", 0, **ints0),
        v_head_dim=t.int("v_head_dim", 0, **ints0),
        sliding_window=t.int("sliding_window", 0, **ints0),
        sliding_window_layers=t.int("sliding_window_layers", 0, **ints0),
        vocab_size=t.int("vocab_size", 0, **ints0),
        tie_embeddings=t.bool("tie_embeddings", False),
        total_params=t.float("total_params", 0.0, positive=False),
    )
    t.close()
    return spec


def load_model_file(path: Path) -> ModelSpec:
    """Read one `models/*.toml` file; the model's name is the file's stem."""
    try:
        return parse_model(read_toml(path), str(path), path.stem)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if str(path) in msg else f"{path}: {msg}") from None
