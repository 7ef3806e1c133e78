"""What is built: the backbone, the device mesh, the sampler defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dlr_jax.config.base import ConfigError, FrozenMapping, auto_on_off, check_dtype, freeze

# ModelConfig fields that describe how a run computes, not the architecture: with `init_from` they come
# from the YAML model section (the recipe's bf16 compute, remat), everything else from config.json.
RUN_MODEL_KEYS = ("dtype", "param_dtype", "remat", "attention", "scan_layers")
MESH_RULES = ("fsdp", "tp", "tpu")  # the profiles of sharding.RULES (a test keeps the two equal)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer (Llama-3 / Qwen2 / Qwen3 / Qwen3-VL text tower)."""

    model_type: str = "llama"
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    #  "original_max_position_embeddings"} or None for plain RoPE.
    rope_scaling: Mapping[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projection biases (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    dtype: str = "float32"  # activation / compute dtype
    param_dtype: str = "float32"
    remat: str = "none"  # none | full | dots (save matmul outputs)
    # auto | xla | cudnn | splash (einsum = xla): resolved from the compile target's platform, not the
    # host's (models/transformer.py resolve_attention); auto = cuDNN flash attention on GPU for
    # bf16/fp16, the splash kernel on TPU for training / scoring sequences of whole 128-token blocks.
    attention: str = "auto"
    # auto | scan | loop: how a training / scoring forward runs the stacked layers. scan = one
    # `lax.scan` (compile time flat in depth); loop = the layers one after another in the program.
    # auto = loop when compiling for CPU with <= 8 layers (XLA:CPU zero-fills the scan's stacked
    # residual buffers every step, which the loop avoids: models/transformer.py; BENCHMARKS.md, section
    # "SFT train step"), scan elsewhere (the scan keeps compile time flat in depth).
    scan_layers: str = "auto"
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None

    def run_keys(self) -> dict[str, Any]:
        """This section's RUN_MODEL_KEYS, which a run from `init_from` keeps (the rest comes from config.json)."""
        return {k: getattr(self, k) for k in RUN_MODEL_KEYS}

    def __post_init__(self) -> None:
        for key in ("dtype", "param_dtype"):
            object.__setattr__(self, key, check_dtype(getattr(self, key), f"model.{key}"))
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, FrozenMapping):
            object.__setattr__(self, "rope_scaling", freeze(self.rope_scaling))
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.remat not in ("none", "full", "dots"):
            raise ConfigError(f"model.remat must be none|full|dots, got {self.remat!r}")
        if self.scan_layers not in ("auto", "scan", "loop"):
            raise ConfigError(f"model.scan_layers must be auto|scan|loop, got {self.scan_layers!r}")
        if self.attention not in ("auto", "xla", "cudnn", "splash", "einsum"):
            raise ConfigError(f"model.attention must be auto|xla|cudnn|splash (einsum = xla), got "
                              f"{self.attention!r}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh shape. -1 on one axis takes the remaining devices."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    rules: str = "fsdp"  # fsdp | tp | tpu — the logical-axis rules profile

    def __post_init__(self) -> None:
        if self.rules not in MESH_RULES:
            raise ConfigError(f"mesh.rules must be one of {'|'.join(MESH_RULES)}, got {self.rules!r}")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    prompt_bucket: int = 64  # prompt lengths are padded up to a multiple of this
    # The decode loop's layer layout (`dlr_jax.generate.sampler.Sampler(unstack_layers=)`), for RL rollouts and
    # evaluation: auto = each layer's weights sliced once per call on CPU (XLA:CPU copies a scanned layer's
    # slices every token), the layer scan on GPU and TPU; on / off force either. On a GPU "on" decodes faster but
    # compiles every layer on its own and holds a second copy of the weights while generating, so the scan stays
    # the default there (BENCHMARKS.md, section "Greedy sampling on a GPU").
    # YAML's bare on/off are accepted.
    unstack_layers: str | bool = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "unstack_layers", auto_on_off(self.unstack_layers, "sampling.unstack_layers"))

    @property
    def unstack(self) -> bool | None:
        """`unstack_layers` as `Sampler(unstack_layers=)` takes it (None = auto)."""
        return {"auto": None, "on": True, "off": False}[self.unstack_layers]
