"""Configuration: typed dataclasses (schema), layering and checks (loading)."""
from .layering import dump_yaml, known_keys, load_config, save_config, to_dict
from .schema import (
                     DEFAULT_STALENESS,
                     AlgoConfig,
                     ArithmeticConfig,
                     Config,
                     DataConfig,
                     DistConfig,
                     EvalConfig,
                     GenerationConfig,
                     ModelConfig,
                     RewardConfig,
                     RolloutConfig,
                     RunConfig,
                     ToolsConfig,
                     TrainConfig,
                     WarmupConfig,
)

__all__ = ["DEFAULT_STALENESS", "AlgoConfig", "ArithmeticConfig", "Config", "DataConfig", "DistConfig", "EvalConfig",
           "GenerationConfig", "ModelConfig", "RewardConfig", "RolloutConfig", "RunConfig", "ToolsConfig",
           "TrainConfig", "WarmupConfig", "dump_yaml", "known_keys", "load_config", "save_config", "to_dict"]
