"""Frozen configuration dataclasses, YAML loading (`base:` includes) and dot-path overrides.

Every run is described by one `Config` tree. YAML files in `configs/` fill it (backbone files include
the paper's recipe in `configs/paper/` through `base:`); `--set a.b=c` overrides single leaves.
The schema is split by concept: `model` (backbone, mesh, sampler), `stages` (each stage's section),
`root` (run, data, tokenizer and the `Config` tree), `loader` (building and printing it).
"""

from dlr_jax.config.base import ConfigError, FrozenMapping
from dlr_jax.config.loader import (
    apply_overrides,
    dump_config,
    from_dict,
    load_config,
    read_yaml_tree,
    save_config,
    to_dict,
)
from dlr_jax.config.model import MeshConfig, ModelConfig, SamplingConfig
from dlr_jax.config.root import Config, DataConfig, RunConfig, TokenizerConfig
from dlr_jax.config.stages import (
    CodebookConfig,
    EvalConfig,
    LatentConfig,
    RLConfig,
    RLTrainConfig,
    StagesConfig,
    TrainConfig,
)

__all__ = [
    "CodebookConfig", "Config", "ConfigError", "DataConfig", "EvalConfig", "FrozenMapping", "LatentConfig",
    "MeshConfig", "ModelConfig", "RLConfig", "RLTrainConfig", "RunConfig", "SamplingConfig", "StagesConfig",
    "TokenizerConfig", "TrainConfig", "apply_overrides", "dump_config", "from_dict", "load_config",
    "read_yaml_tree", "save_config", "to_dict",
]
