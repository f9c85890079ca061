"""Configuration: dataclass schemas, YAML presets in ``configs/``, ``key=value`` overrides.

A misspelt key is an error naming the key and the closest valid one; a wrong type is an error
naming the key, the value and the expected type. YAML is read with OmegaConf (a safe loader).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ktframe.errors import InputError
from ktframe.registry import closest

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
DEFAULT_PRESET = "quick"


@dataclass
class DataConfig:
    n: int = 512
    d: int = 32
    k: int = 10
    family: str = "gaussian"  # gaussian, cauchy, gumbel, laplace, lognormal
    std: float = 0.1
    batch_size: int = 32
    val_tasks: int = 320
    val_batch_size: int = 64
    init: str = "random"  # initial centers: an initialiser name (random, kmeans++, greedy-kmeans++)
    seed: int = 0  # training tasks; each rank and worker draws its own stream from it
    val_seed: int = 20260  # the fixed validation tasks
    num_workers: int = 0


@dataclass
class ModelConfig:
    variant: str = "learned"
    n_layers: int = 1
    unroll: int = 1  # training steps through the layer(s), re-embedding in between
    gamma: float = 1.0
    embedding: str = "onehot"
    score: str = "euclidean"
    attention_map: str = "softmax"
    norm: str = "identity"
    scale: Optional[float] = None  # None: 1/sqrt(d_emb)
    dropout: float = 0.01


@dataclass
class OptimConfig:
    lr: float = 0.01
    loss_lambda: float = 10.0
    plateau_factor: float = 0.5
    plateau_patience: int = 5


@dataclass
class TrainerConfig:
    max_steps: int = 10_000
    val_every: int = 50
    accelerator: str = "auto"
    devices: Any = 1
    strategy: str = "auto"
    num_nodes: int = 1
    precision: str = "32-true"
    log_every: int = 10
    seed: int = 0
    progress_bar: bool = True


@dataclass
class LoggerConfig:
    kind: str = "wandb"  # wandb, csv, tensorboard, none
    project: str = "ktframe"
    entity: Optional[str] = None
    mode: str = "auto"  # auto (offline without an API key), online, offline


@dataclass
class EvalConfig:
    tasks: int = 320
    steps: int = 20
    seed: int = 777
    inits: list = field(default_factory=lambda: ["random", "kmeans++"])
    ns: list = field(default_factory=lambda: [128, 256, 512, 1024, 2048])
    family: Optional[str] = None  # None: the training family
    batch_size: int = 32


@dataclass
class Config:
    preset: str = DEFAULT_PRESET
    root: str = "runs"
    name: Optional[str] = None
    run_id: Optional[str] = None
    resume: Optional[str] = None  # auto, or a checkpoint path
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def presets() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def _check_keys(values: Any, schema: Any, prefix: str = "") -> None:
    """Every key of ``values`` must be a field of ``schema``; suggest the closest one otherwise."""
    if not isinstance(values, dict):
        return
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in values.items():
        if key not in fields:
            hint = closest(str(key), list(fields))
            suggestion = f"; did you mean '{prefix}{hint}'?" if hint else f"; expected one of: {', '.join(fields)}"
            raise InputError(f"unknown config key '{prefix}{key}'{suggestion}")
        sub = fields[key].default_factory() if fields[key].default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(sub):
            _check_keys(value, type(sub), f"{prefix}{key}.")


def _read_yaml(path: Path) -> dict:
    try:
        loaded = OmegaConf.load(path)
    except OmegaConfBaseException as exc:
        raise InputError(f"{path}: not a valid config ({str(exc).splitlines()[0]})") from None
    except Exception as exc:  # the YAML parser's own errors: a syntax error in the file
        raise InputError(f"{path}: YAML syntax error: {' '.join(str(exc).split())}") from None
    values = OmegaConf.to_container(loaded)
    if not isinstance(values, dict):
        raise InputError(f"{path}: a config file must be a mapping of keys to values; got {type(values).__name__}")
    return values


def _parse_overrides(overrides: Sequence[str]) -> dict:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise InputError(f"override {item!r} is not of the form key=value (e.g. optim.lr=0.001)")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as exc:
        raise InputError(f"could not parse overrides: {str(exc).splitlines()[0]}") from None


def load_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The resolved config: schema defaults, then the preset (``preset=NAME`` or
    ``preset=path/to/file.yaml``; default ``quick``), then the other overrides."""
    cli = _parse_overrides(overrides)
    _check_keys(cli, Config)
    preset = str(cli.get("preset", DEFAULT_PRESET))
    path = Path(preset) if preset.endswith((".yaml", ".yml")) else CONFIG_DIR / f"{preset}.yaml"
    if not path.is_file():
        if preset.endswith((".yaml", ".yml")):
            raise InputError(f"config file {path} does not exist")
        hint = closest(preset, presets())
        raise InputError(f"unknown preset {preset!r}; expected one of: {', '.join(presets())}" + (f" (did you mean {hint!r}?)" if hint else ""))
    file_values = _read_yaml(path)
    _check_keys(file_values, Config)
    file_values["preset"] = preset
    cfg = OmegaConf.structured(Config)
    try:
        cfg = OmegaConf.merge(cfg, file_values, cli)
    except OmegaConfBaseException as exc:
        raise InputError(_type_error(exc)) from None
    return cfg


def _type_error(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None)
    message = str(exc).splitlines()[0]
    return f"config key '{key}': {message}" if key else f"invalid config: {message}"


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)


def to_dict(cfg: DictConfig) -> dict:
    """Plain containers only, so that checkpoints load with ``weights_only=True``."""
    return OmegaConf.to_container(cfg, resolve=True)
