"""Run configuration: the sections with their defaults and docs (config/sections.py), loading from YAML and
`-o key=value` with the checks that span sections (config/load.py), and strict type coercion
(config/typecheck.py)."""

from thinkrl.config.sections import (
    AdvantageConfig,
    ArithConfig,
    Config,
    CorrectionConfig,
    DataConfig,
    EvalConfig,
    LogConfig,
    LoraConfig,
    MethodSection,
    ModelConfig,
    PromptConfig,
    RewardConfig,
    RolloutConfig,
    SeedsConfig,
    TrainConfig,
    VerifierConfig,
)

__all__ = [
    "AdvantageConfig",
    "ArithConfig",
    "Config",
    "CorrectionConfig",
    "DataConfig",
    "EvalConfig",
    "LogConfig",
    "LoraConfig",
    "MethodSection",
    "ModelConfig",
    "PromptConfig",
    "RewardConfig",
    "RolloutConfig",
    "SeedsConfig",
    "TrainConfig",
    "VerifierConfig",
]
