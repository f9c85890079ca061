"""Configuration: dataclass schemas, YAML presets in ``configs/``, ``key=value`` overrides.

A misspelt key is an error naming the key and the closest valid one; a wrong type is an error
naming the key, the value and the expected type. YAML is read with OmegaConf (a safe loader).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ktframe.errors import InputError
from ktframe.registry import closest
from ktframe.tasks import FAMILIES

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
    options: dict = field(default_factory=dict)  # the variant's own build options (`ktframe plugins` lists them)


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
    # `variant=NAME`: train a learnable version of variant NAME, at the setting it declares
    # (model.variant=NAME plus its Variant.training overrides, under the command line's own).
    variant: Optional[str] = None
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
    except yaml.constructor.ConstructorError as exc:  # e.g. !!python/object: the safe loader builds none
        raise InputError(f"{path}: refused: {exc.problem} ({' '.join(str(exc.problem_mark).split())}); config files may hold only plain YAML values, no Python tags") from None
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
    cfg = merge(file_values, *_variant_defaults(cli), cli)
    _check_variant(cfg)
    return cfg


def _variant_defaults(cli: dict) -> list[dict]:
    """The layers ``variant=NAME`` adds between the preset and the command line."""
    name = cli.get("variant")
    if name is None:
        return []
    chosen = (cli.get("model") or {}).get("variant") if isinstance(cli.get("model"), dict) else None
    if chosen not in (None, name):
        raise InputError(f"variant={name} and model.variant={chosen} name different variants; give one of them")
    from ktframe.variant import get_variant

    defaults = OmegaConf.to_container(OmegaConf.create(dict(get_variant(str(name)).training)))
    _check_keys(defaults, Config)
    return [{"model": {"variant": name}}, defaults]


def _check_variant(cfg: DictConfig) -> None:
    """The variant exists and takes the options given, before any training starts."""
    from ktframe.variant import check_options, get_variant

    check_options(get_variant(cfg.model.variant), dict(cfg.model.options))


def merge(*layers: Any) -> DictConfig:
    """The schema's defaults overlaid with ``layers`` in order, every value checked."""
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), *layers)
    except OmegaConfBaseException as exc:
        raise InputError(_type_error(exc)) from None
    check_values(cfg)
    return cfg


LOGGERS = ("wandb", "csv", "tensorboard", "none")
WANDB_MODES = ("auto", "online", "offline")

# Smallest valid value of each integer key.
_AT_LEAST = {
    "data.n": 1, "data.d": 1, "data.k": 1, "data.batch_size": 1, "data.val_tasks": 1, "data.val_batch_size": 1,
    "data.num_workers": 0, "model.n_layers": 1, "model.unroll": 1, "optim.plateau_patience": 0,
    "trainer.max_steps": 1, "trainer.val_every": 1, "trainer.log_every": 1, "trainer.num_nodes": 1,
    "eval.tasks": 1, "eval.steps": 1, "eval.batch_size": 1,
}  # fmt: skip
# Keys that must be a number > 0; "inf" is a valid gamma (the hard limit), nothing else's.
_POSITIVE = {"data.std": False, "model.gamma": True, "optim.lr": False, "optim.loss_lambda": False}
# Keys whose value is one of a fixed list; names that plugins register are checked where looked up.
_CHOICES = {"data.family": FAMILIES, "eval.family": (None, *FAMILIES), "logger.kind": LOGGERS, "logger.mode": WANDB_MODES}


def _value_error(key: str, value: Any, expected: str) -> InputError:
    return InputError(f"config key '{key}' must be {expected}; got {value!r}")


def check_values(cfg: DictConfig) -> None:
    """Ranges and choices that the schema's types cannot say, so that a bad value is a one-line
    error before a run starts rather than a failure (or NaN) deep inside it."""
    values = {key: OmegaConf.select(cfg, key) for key in (*_AT_LEAST, *_POSITIVE, *_CHOICES)}
    for key, minimum in _AT_LEAST.items():
        if values[key] < minimum:
            raise _value_error(key, values[key], f"an integer >= {minimum}")
    for key, infinite_ok in _POSITIVE.items():
        value = values[key]
        if math.isnan(value) or value <= 0 or (math.isinf(value) and not infinite_ok):
            raise _value_error(key, value, "a positive number" + (" or inf" if infinite_ok else ""))
    for key, choices in _CHOICES.items():
        if values[key] not in choices:
            raise _value_error(key, values[key], "one of " + ", ".join("null" if c is None else c for c in choices))
    if not 0 <= cfg.model.dropout < 1:
        raise _value_error("model.dropout", cfg.model.dropout, "a number in [0, 1)")
    if not 0 < cfg.optim.plateau_factor < 1:
        raise _value_error("optim.plateau_factor", cfg.optim.plateau_factor, "a number in (0, 1)")
    if cfg.model.scale is not None and not (math.isfinite(cfg.model.scale) and cfg.model.scale > 0):
        raise _value_error("model.scale", cfg.model.scale, "null (for 1/sqrt(d_emb)) or a positive number")
    if cfg.data.k > cfg.data.n:
        raise InputError(f"config key 'data.k'={cfg.data.k} exceeds data.n={cfg.data.n}: a task cannot have more clusters than points; expected data.k <= data.n")
    if not cfg.eval.inits:
        raise _value_error("eval.inits", [], "a non-empty list of initialiser names")
    if not cfg.eval.ns or not all(type(n) is int and n >= 1 for n in cfg.eval.ns):
        raise _value_error("eval.ns", list(cfg.eval.ns), "a non-empty list of integers >= 1")


def _type_error(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None)
    message = str(exc).splitlines()[0]
    return f"config key '{key}': {message}" if key else f"invalid config: {message}"


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)


def to_dict(cfg: DictConfig) -> dict:
    """Plain containers only, so that checkpoints load with ``weights_only=True``."""
    return OmegaConf.to_container(cfg, resolve=True)
