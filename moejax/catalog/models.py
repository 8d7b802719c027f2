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


# --- 000 FSE-DP (chiplets), Table I: D_model, D_ffn, E, E^act, Head, Para. ----------------
# Weight / activation precision is not stated in 000; bf16 defaults are kept.

_add(
    name="phi-3.5-moe",
    source="000 Table I (Phi-3.5); rest: microsoft/Phi-3.5-MoE-instruct config.json",
    hidden_size=4096,
    expert_ffn_size=3200,  # 000 Table I; public cfg has intermediate_size 6400 (paper wins)
    num_experts=16,
    top_k=2,
    num_shared_experts=0,  # public cfg
    shared_ffn_size=0,  # public cfg
    num_sparse_layers=32,  # public cfg
    num_layers=32,  # public cfg
    dense_ffn_size=0,  # public cfg (every block is MoE)
    num_heads=32,
    num_kv_heads=8,  # public cfg
    head_dim=128,  # public cfg
    attention_kind="GQA",  # public cfg
    total_params=41.9e9,
)
_add(
    name="yuan2.0-m32",
    source="000 Table I (Yuan2.0-M32); rest: IEITYuan/Yuan2-M32 config.json",
    hidden_size=2048,
    expert_ffn_size=4096,  # 000 Table I; public cfg has ffn_hidden_size 8192 (paper wins)
    num_experts=32,
    top_k=2,
    num_shared_experts=0,  # public cfg
    shared_ffn_size=0,  # public cfg
    num_sparse_layers=24,  # public cfg
    num_layers=24,  # public cfg
    dense_ffn_size=0,  # public cfg (every block is MoE)
    num_heads=16,
    num_kv_heads=16,  # public cfg (localized-filtering attention, MHA projections)
    head_dim=128,  # public cfg
    attention_kind="MHA",  # public cfg
    total_params=40e9,
)
_add(
    name="deepseek-moe-16b",
    source="000 Table I (DeepSeek-MoE, top-k '6+2'); rest: deepseek-moe-16b-base config.json",
    hidden_size=2048,
    expert_ffn_size=1408,
    num_experts=64,
    top_k=6,  # 000 Table I "6+2": 6 routed ...
    num_shared_experts=2,  # ... + 2 shared
    shared_ffn_size=1408,  # public cfg (moe_intermediate_size per shared expert)
    num_sparse_layers=27,  # public cfg (first_k_dense_replace = 1)
    num_layers=28,  # public cfg
    dense_ffn_size=10944,  # public cfg
    num_heads=16,
    num_kv_heads=16,  # public cfg
    head_dim=128,  # public cfg
    attention_kind="MHA",  # public cfg
    total_params=16.4e9,
)
_add(
    name="qwen3-30b-a3b",
    source="000 Table I (Qwen3-A3B); rest: Qwen/Qwen3-30B-A3B config.json",
    hidden_size=2048,
    expert_ffn_size=768,
    num_experts=128,
    top_k=8,
    num_shared_experts=0,  # public cfg
    shared_ffn_size=0,  # public cfg
    num_sparse_layers=48,  # public cfg
    num_layers=48,  # public cfg
    dense_ffn_size=0,  # public cfg (every block is MoE)
    num_heads=32,
    num_kv_heads=4,  # public cfg
    head_dim=128,  # public cfg
    attention_kind="GQA",  # public cfg
    total_params=30e9,
)

# --- 001 MoEntwine (wafer), Table I: Size, Layers sparse/total, Single Expert Size, k / E ----
# 001 §VI-A runs linear layers in INT8 and attention / communication in FP16, so weights are
# 1 byte: with that, 3 * hidden * expert_ffn bytes reproduces Table I's "Single Expert Size"
# in MiB (42, 18, 23, 189, 288) from the public configs' sizes.

_add(
    name="deepseek-v3",
    source="001 Table I (DeepSeek-V3); rest: deepseek-ai/DeepSeek-V3 config.json",
    hidden_size=7168,  # public cfg
    expert_ffn_size=2048,  # public cfg (Table I: 42 MB per expert at INT8)
    num_experts=256,
    top_k=8,
    num_shared_experts=1,  # public cfg
    shared_ffn_size=2048,  # public cfg
    num_sparse_layers=58,
    num_layers=61,
    dense_ffn_size=18432,  # public cfg
    num_heads=128,  # public cfg
    num_kv_heads=128,  # MLA: one latent KV per head
    head_dim=192,  # public cfg (128 nope + 64 rope)
    attention_kind="MLA",  # public cfg
    kv_lora_rank=512,  # public cfg
    weight_bytes=1.0,  # 001 §VI-A INT8 linear layers
    total_params=671e9,
)
_add(
    name="qwen3-235b-a22b",
    source="001 Table I (Qwen3); rest: Qwen/Qwen3-235B-A22B config.json",
    hidden_size=4096,  # public cfg
    expert_ffn_size=1536,  # public cfg (Table I: 18 MB per expert at INT8)
    num_experts=128,
    top_k=8,
    num_shared_experts=0,  # public cfg
    shared_ffn_size=0,  # public cfg
    num_sparse_layers=94,
    num_layers=94,
    dense_ffn_size=0,  # public cfg (every block is MoE)
    num_heads=64,  # public cfg (004 §VII-B's table lists 128 attention heads)
    num_kv_heads=4,  # public cfg
    head_dim=128,  # public cfg
    attention_kind="GQA",  # public cfg
    weight_bytes=1.0,  # 001 §VI-A INT8 linear layers
    total_params=235e9,
)
_add(
    name="deepseek-v2",
    source="001 Table I (DeepSeek-V2); rest: deepseek-ai/DeepSeek-V2 config.json",
    hidden_size=5120,  # public cfg
    expert_ffn_size=1536,  # public cfg (Table I: 23 MB per expert at INT8)
    num_experts=160,
    top_k=6,
    num_shared_experts=2,  # public cfg
    shared_ffn_size=1536,  # public cfg
    num_sparse_layers=59,
    num_layers=60,
    dense_ffn_size=12288,  # public cfg
    num_heads=128,  # public cfg
    num_kv_heads=128,  # MLA: one latent KV per head
    head_dim=192,  # public cfg (128 nope + 64 rope)
    attention_kind="MLA",  # public cfg
    kv_lora_rank=512,  # public cfg
    weight_bytes=1.0,  # 001 §VI-A INT8 linear layers
    total_params=236e9,
)
_add(
    name="dbrx",
    source="001 Table I (DBRX); rest: databricks/dbrx-instruct config.json",
    hidden_size=6144,  # public cfg
    expert_ffn_size=10752,  # public cfg (Table I: 189 MB per expert at INT8)
    num_experts=16,
    top_k=4,
    num_shared_experts=0,  # public cfg
    shared_ffn_size=0,  # public cfg
    num_sparse_layers=40,
    num_layers=40,
    dense_ffn_size=0,  # public cfg (every block is MoE)
    num_heads=48,  # public cfg
    num_kv_heads=8,  # public cfg
    head_dim=128,  # public cfg
    attention_kind="GQA",  # public cfg
    weight_bytes=1.0,  # 001 §VI-A INT8 linear layers
    total_params=132e9,
)
_add(
    name="mixtral-8x22b",
    source="001 Table I (Mixtral-8x22B); rest: mistralai/Mixtral-8x22B-v0.1 config.json",
    hidden_size=6144,  # public cfg
    expert_ffn_size=16384,  # public cfg (Table I: 288 MB per expert at INT8)
    num_experts=8,
    top_k=2,
    num_shared_experts=0,  # public cfg
    shared_ffn_size=0,  # public cfg
    num_sparse_layers=56,
    num_layers=56,
    dense_ffn_size=0,  # public cfg (every block is MoE)
    num_heads=48,  # public cfg
    num_kv_heads=8,  # public cfg
    head_dim=128,  # public cfg
    attention_kind="GQA",  # public cfg
    weight_bytes=1.0,  # 001 §VI-A INT8 linear layers
    total_params=141e9,
)

# --- 002 AMoE (A100) and 003 EPS-MoE (H800) ------------------------------------------------

_add(
    name="mixtral-8x7b",
    source="002 §2 Fig. 4 (32 blocks, 8 experts), 003 §1 (46B total); rest: "
    "mistralai/Mixtral-8x7B-v0.1 config.json",
    hidden_size=4096,  # public cfg
    expert_ffn_size=14336,  # public cfg
    num_experts=8,  # 002 Fig. 4 caption
    top_k=2,  # public cfg (002 also runs a top-1 variant)
    num_shared_experts=0,  # public cfg
    shared_ffn_size=0,  # public cfg
    num_sparse_layers=32,  # 002 Fig. 4 caption
    num_layers=32,  # 002 Fig. 4 caption
    dense_ffn_size=0,  # public cfg (every block is MoE)
    num_heads=32,  # public cfg
    num_kv_heads=8,  # public cfg (002 §5 switches to MQA for its runs; a policy choice)
    head_dim=128,  # public cfg
    attention_kind="GQA",  # public cfg
    total_params=46e9,  # 003 §1 "46 billion" (public count 46.7B)
)
_add(
    name="snowflake-arctic",
    source="003 §5.1 Table 4 (Snowflake Arctic, dense-MoE hybrid); sizes: "
    "Snowflake/snowflake-arctic-instruct config.json",
    hidden_size=7168,  # public cfg
    expert_ffn_size=4864,  # public cfg
    num_experts=128,  # public cfg
    top_k=2,  # public cfg
    num_shared_experts=1,  # public cfg: the residual dense MLP beside each MoE, always on
    shared_ffn_size=4864,  # public cfg
    num_sparse_layers=35,  # public cfg
    num_layers=35,  # public cfg
    dense_ffn_size=0,  # public cfg (every block has an MoE)
    num_heads=56,  # public cfg
    num_kv_heads=8,  # public cfg
    head_dim=128,  # public cfg
    attention_kind="GQA",  # public cfg
    total_params=480e9,  # public cfg (003 quotes no size)
)

# --- 004 DySHARP (GH200 NVL32), Table I: hidden, MoE hidden, heads, seq len, E, top-k ------
# Large is the official DeepSeek-V3 configuration; Small and Medium scale it (004 §V-B).
# Everything not in Table I follows the DeepSeek-V3 structure. Table I's top-k candidates
# are {8, 16, 32}; 8 is DeepSeek-V3's and the catalog default (`with_overrides` for others).
# Table I's sequence lengths (2048 / 4096 / 8192) are workload, not model, fields.

_DSV3_STRUCTURE = dict(
    num_shared_experts=1,  # public cfg (DeepSeek-V3)
    num_sparse_layers=58,  # public cfg (DeepSeek-V3)
    num_layers=61,  # public cfg (DeepSeek-V3)
    attention_kind="MLA",  # public cfg (DeepSeek-V3)
    head_dim=192,  # public cfg (DeepSeek-V3: 128 nope + 64 rope)
    kv_lora_rank=512,  # public cfg (DeepSeek-V3)
    weight_bytes=1.0,  # 004 §V-A: FP8 kernels for DeepSeek-V3
)

_add(
    name="dysharp-s",
    source="004 Table I (Small); structure of DeepSeek-V3 (public config.json)",
    hidden_size=2048,
    expert_ffn_size=512,
    num_experts=64,
    top_k=8,
    shared_ffn_size=512,  # = MoE hidden size, as in DeepSeek-V3
    dense_ffn_size=4608,  # 9 x MoE hidden, DeepSeek-V3's ratio (18432 = 9 x 2048)
    num_heads=32,
    num_kv_heads=32,  # MLA: one latent KV per head
    **_DSV3_STRUCTURE,
)
_add(
    name="dysharp-m",
    source="004 Table I (Medium); structure of DeepSeek-V3 (public config.json)",
    hidden_size=4096,
    expert_ffn_size=1024,
    num_experts=128,
    top_k=8,
    shared_ffn_size=1024,  # = MoE hidden size, as in DeepSeek-V3
    dense_ffn_size=9216,  # 9 x MoE hidden, DeepSeek-V3's ratio (18432 = 9 x 2048)
    num_heads=64,
    num_kv_heads=64,  # MLA: one latent KV per head
    **_DSV3_STRUCTURE,
)
_add(
    name="dysharp-l",
    source="004 Table I (Large = DeepSeek-V3); rest: deepseek-ai/DeepSeek-V3 config.json",
    hidden_size=7168,
    expert_ffn_size=2048,
    num_experts=256,
    top_k=8,
    shared_ffn_size=2048,  # public cfg
    dense_ffn_size=18432,  # public cfg
    num_heads=128,
    num_kv_heads=128,  # MLA: one latent KV per head
    total_params=671e9,  # public cfg
    **_DSV3_STRUCTURE,
)
_add(
    name="gpt-oss-120b",
    source="004 §VII-B (GPT-OSS-120B: h 2880, MoE hidden 2880, 64 heads, 64 experts, top-4); "
    "rest: openai/gpt-oss-120b config.json",
    hidden_size=2880,  # 004 §VII-B; public cfg
    expert_ffn_size=2880,  # 004 §VII-B; public cfg
    num_experts=64,  # 004 §VII-B (the public config has 128 experts)
    top_k=4,  # 004 §VII-B; public cfg
    num_shared_experts=0,  # public cfg
    shared_ffn_size=0,  # public cfg
    num_sparse_layers=36,  # public cfg (every block is MoE)
    num_layers=36,  # public cfg
    dense_ffn_size=0,  # public cfg
    num_heads=64,  # 004 §VII-B; public cfg
    num_kv_heads=8,  # public cfg
    head_dim=64,  # public cfg
    attention_kind="GQA",  # public cfg
    weight_bytes=1.0,  # 004 §V-A: FP8 GEMM kernels (the public checkpoint is MXFP4)
    total_params=117e9,  # public model card
)
