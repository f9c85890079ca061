"""Configuration: dataclass schemas, YAML presets shipped in the package, ``key=value`` overrides.

A misspelt key is an error naming the key and the closest valid one; a wrong type is an error
naming the key, the value and the expected type. YAML is read with OmegaConf (a safe loader).
Every field carries a one-line meaning (its ``help`` metadata), which ``ktframe fit --help`` lists.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import II, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ktframe.clustering.baselines import BASELINES
from ktframe.core import limits
from ktframe.core.errors import InputError
from ktframe.core.names import canonical, closest
from ktframe.core.tasks import FAMILIES, TaskDistribution, TaskError
from ktframe.plugin.build import MODEL_OPTIONS, get_variant, model_keys
from ktframe.plugin.variant import check_options

DEFAULT_PRESET = "quick"


def key(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING) -> Any:
    """A config field with its one-line meaning."""
    return field(default=default, default_factory=factory, metadata={"help": help})


@dataclass
class DataConfig:
    n: int = key(512, "points per training task")
    d: int = key(32, "dimensions")
    k: int = key(10, "clusters per task")
    family: str = key("gaussian", "noise family of the mixtures: " + ", ".join(FAMILIES))
    std: float = key(0.1, "noise scale around each mixture mean")
    batch_size: int = key(32, "tasks per training step (per DDP rank)")
    val_tasks: int = key(320, "fixed validation tasks")
    val_batch_size: int = key(64, "validation tasks per batch")
    init: str = key("random", "initial centers: an initialiser name (random, k-means++, greedy-k-means++; kmeans++ is k-means++)")
    seed: int = key(II("trainer.seed"), "seed of the training tasks (each rank and worker draws its own stream); default: trainer.seed")
    val_seed: int = key(20260, "seed of the fixed validation tasks")
    num_workers: int = key(0, "dataloader workers drawing training tasks")
    k_range: Optional[list] = key(None, "[lo, hi]: each training step draws its tasks' k from lo..hi, the model built for any k up to hi; null: data.k")
    n_range: Optional[list] = key(None, "[lo, hi]: each training step draws its tasks' n from lo..hi; null: data.n")
    warm_start: Optional[list] = key(
        None, "[lo, hi]: each training step's initial centers first moved by t Lloyd steps, t drawn from lo..hi (the states an iterated model meets); null: 0"
    )
    # The switches of the general task distribution (ktframe.core.tasks.TaskDistribution):
    # each off by default, so that the paper's tasks are drawn as they always were.
    families: Optional[list] = key(None, "each task's noise family drawn from this list (e.g. [gaussian, laplace, student-t]); null: data.family")
    std_range: Optional[list] = key(None, "[lo, hi]: each task's noise scale drawn log-uniformly from lo..hi; null: data.std")
    weight_concentration: Optional[list] = key(
        None,
        "[lo, hi]: unequal component weights from a symmetric Dirichlet, its concentration drawn log-uniformly per task (1: uniform, smaller: more unequal); null: equal",
    )
    component_scale: Optional[list] = key(None, "[lo, hi]: each component's noise scale times a factor drawn log-uniformly from lo..hi; null: 1")
    axis_scale: Optional[list] = key(
        None, "[lo, hi]: each component stretched along each axis by a factor drawn log-uniformly from lo..hi (anisotropic); null: isotropic"
    )
    rotate: bool = key(False, "each component's noise turned by a random rotation of its own (correlated coordinates)")
    dim_scale: Optional[list] = key(
        None, "[lo, hi]: each coordinate of a task stretched by a factor drawn log-uniformly before scaling (minmax scaling undoes it); null: 1"
    )
    subspace: Optional[list] = key(
        None, "[lo, hi]: each task's data in its first d' coordinates, d' drawn from lo..hi, the others 0 (as narrower data zero-padded); null: all d"
    )
    outliers: Optional[list] = key(
        None, "[lo, hi]: a fraction drawn from lo..hi of each task's points moved uniformly into the task's bounding box; null: none"
    )
    components: Optional[list] = key(None, "[lo, hi]: each task's number of mixture components drawn from lo..hi, whatever its k; null: k")
    scaling: str = key(
        "minmax",
        "each task scaled per coordinate to [0, 1] (minmax, the paper's), by one factor to a largest coordinate span of 1 (isotropic, as real data is fed) or to an RMS distance to its mean of 1 (rms)",
    )


@dataclass
class ModelConfig:
    variant: str = key("learned", "the registered variant to train (`ktframe plugins` lists them)")
    n_layers: int = key(1, "layers of the model")
    unroll: int = key(1, "steps trained through the layer(s), re-embedding in between")
    gamma: float = key(1.0, "inverse temperature of the assignment (inf: the hard limit)")
    embedding: str = key("onehot", "token embedding: onehot (index + data) or none (data only)")
    score: str = key("euclidean", "attention score")
    attention_map: str = key("softmax", "attention map")
    norm: str = key("identity", "normalisation before attention")
    scale: Optional[float] = key(None, "attention scale; null: 1/sqrt(d_emb)")
    dropout: float = key(0.01, "attention dropout while training")
    options: dict = key(help="the variant's own build options (`ktframe plugins` lists them)", factory=dict)
    init_from: Optional[str] = key(
        None, "a checkpoint of ktframe fit whose weights the model starts from (a fresh optimiser, schedule and step count); null: fresh weights"
    )


@dataclass
class OptimConfig:
    lr: float = key(0.01, "Adam's learning rate")
    loss_lambda: float = key(10.0, "lambda of the softmin bound of the k-means objective")
    plateau_factor: float = key(0.5, "learning-rate factor when val/ratio stops improving")
    plateau_patience: int = key(5, "validations without improvement before the learning rate drops")


@dataclass
class TrainerConfig:
    """ktframe's own Trainer keys. Any other argument of Lightning's ``Trainer`` can be set as
    ``trainer.KEY`` too; it is checked against the Trainer's signature and passed as given."""

    max_steps: int = key(10_000, "training steps; the last one is always validated and checkpointed")
    val_every: int = key(50, "validate (and checkpoint) every this many steps")
    accelerator: str = key("auto", "cpu, gpu, auto, ...")
    devices: Any = key(1, "devices per node (an int, a list, or auto)")
    strategy: str = key("auto", "auto, ddp, ...")
    num_nodes: int = key(1, "nodes")
    precision: str = key("32-true", "32-true, bf16-mixed, 16-mixed, ...")
    log_every: int = key(10, "log training metrics every this many steps")
    seed: int = key(0, "seed of the weights, dropout and (by default) the training tasks")
    progress_bar: bool = key(True, "show a progress bar")
    early_stopping: Optional[int] = key(None, "stop when val/ratio has not improved for this many validations; null: never")
    threads: Optional[int] = key(
        None, "PyTorch's intra-op threads in the fit; null: one for a small model (as the quick preset's), else PyTorch's own (OMP_NUM_THREADS, the cores)"
    )


@dataclass
class LoggerConfig:
    kind: str = key("wandb", "wandb, csv, tensorboard or none")
    project: str = key("ktframe", "W&B project")
    entity: Optional[str] = key(None, "W&B entity (user or team)")
    mode: str = key("auto", "W&B mode: auto (offline without an API key), online, offline")
    group: Optional[str] = key(None, "W&B group (a multirun sets it to the sweep's name)")
    tags: list = key(help="W&B tags", factory=list)
    job_type: Optional[str] = key(None, "W&B job type, e.g. train")
    notes: Optional[str] = key(None, "W&B notes")
    log_model: bool = key(True, "log the best checkpoint to W&B as a model artifact (offline too)")
    init_timeout: float = key(30.0, "seconds W&B may take to start online; then the run logs offline")


@dataclass
class EvalConfig:
    tasks: int = key(320, "unseen tasks per setting")
    steps: int = key(20, "steps of the model (and of Lloyd) from the initial centers")
    seed: int = key(777, "seed of the evaluation tasks")
    inits: list = key(help="initial centers: initialiser names", factory=lambda: ["random", "k-means++"])
    ns: list = key(help="points per task, one setting each", factory=lambda: [128, 256, 512, 1024, 2048])
    family: Optional[str] = key(None, "noise family; null: the training family")
    ks: Optional[list] = key(None, "clusters per task, one setting each (a model trained for any k: each up to its maximum); null: data.k")
    baselines: list = key(help="more methods, final objective only: breathing-kmeans (bkmeans package), best-of-10 (scikit-learn, n_init=10)", factory=list)
    batch_size: int = key(32, "tasks per batch")
    lloyd_last: int = key(
        0, "also report the model with its last N steps taken by Lloyd's algorithm (exact, gamma = inf) instead, as method model+lloyd; 0: not"
    )
    swaps: int = key(
        0,
        "also report N swaps (a local search moving the least useful center) after the model's final centers (model+swaps, or model+lloyd+swaps "
        "with eval.lloyd_last) and after Lloyd's (lloyd+swaps), each followed by eval.steps Lloyd iterations; final objective only; 0: not",
    )
    task_preset: Optional[str] = key(
        None,
        "draw the tasks from this preset's task distribution (its data.family, data.std, switches and scaling), e.g. anyk for the paper's; null: the checkpoint's",
    )
    after_fit: bool = key(False, "evaluate the run's checkpoint (eval.checkpoint) when training ends (run folder's eval/, and W&B)")
    checkpoint: str = key("best", "which checkpoint of a run folder is evaluated: best (lowest val/ratio) or last (the authors' choice)")
    seed_per_run: bool = key(False, "each run's tasks from eval.seed and its trainer.seed (the authors' per-seed sets); false: one set for all runs")


@dataclass
class Config:
    preset: str = key(DEFAULT_PRESET, "a preset name (`ktframe fit --help` lists them) or the path of a YAML file")
    variant: Optional[str] = key(None, "train a learnable version of this variant at the setting it declares")
    root: str = key("runs", "folder of the run folders")
    name: Optional[str] = key(None, "run folder's name (default: the run id)")
    run_id: Optional[str] = key(None, "run id (W&B id too); default: new, or the one W&B's agent assigns")
    resume: Optional[str] = key(None, "auto (the named or latest run) or a checkpoint path")
    data: DataConfig = key(help="", factory=DataConfig)
    model: ModelConfig = key(help="", factory=ModelConfig)
    optim: OptimConfig = key(help="", factory=OptimConfig)
    trainer: TrainerConfig = key(help="", factory=TrainerConfig)
    logger: LoggerConfig = key(help="", factory=LoggerConfig)
    eval: EvalConfig = key(help="", factory=EvalConfig)


def preset_files() -> dict[str, Any]:
    """The presets shipped in the package (``ktframe/configs/*.yaml``), by name."""
    folder = resources.files("ktframe") / "configs"
    return {entry.name.rsplit(".", 1)[0]: entry for entry in folder.iterdir() if entry.name.endswith(".yaml")}


def presets() -> list[str]:
    return sorted(preset_files())


# Trainer arguments that ktframe sets itself: the key to use instead, or None where there is none.
_TRAINER_OWN = {
    "val_check_interval": "trainer.val_every", "log_every_n_steps": "trainer.log_every", "enable_progress_bar": "trainer.progress_bar",
    "logger": "logger.kind", "callbacks": None, "plugins": None, "default_root_dir": "root", "check_val_every_n_epoch": "trainer.val_every",
}  # fmt: skip


@lru_cache(maxsize=1)
def trainer_arguments() -> tuple[str, ...]:
    """The arguments of Lightning's ``Trainer`` (imported only when a key needs checking)."""
    import lightning

    return tuple(name for name in inspect.signature(lightning.Trainer.__init__).parameters if name != "self")


def _check_trainer_key(name: str) -> None:
    if name in _TRAINER_OWN:
        instead = _TRAINER_OWN[name]
        raise InputError(f"config key 'trainer.{name}' is set by ktframe" + (f"; expected '{instead}' instead" if instead else "; it cannot be given"))
    own = [f.name for f in dataclasses.fields(TrainerConfig)]
    if name not in trainer_arguments():
        hint = closest(name, [*own, *(a for a in trainer_arguments() if a not in _TRAINER_OWN)])
        raise InputError(
            f"unknown config key 'trainer.{name}': neither a ktframe key nor an argument of Lightning's Trainer"
            + (f"; did you mean 'trainer.{hint}'?" if hint else "")
        )


def check_keys(values: Any, schema: Any = None, prefix: str = "") -> None:
    """Every key of ``values`` must be a field of ``schema`` (default: :class:`Config`), or under
    ``trainer.`` an argument of Lightning's Trainer; suggest the closest one otherwise."""
    schema = schema or Config
    if not isinstance(values, dict):
        return
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for name, value in values.items():
        if name not in fields:
            if schema is TrainerConfig:
                _check_trainer_key(str(name))
                continue
            hint = _section_of(str(name)) if schema is Config else None  # max_steps=20: trainer.max_steps
            hint = hint or (f"{prefix}{close}" if (close := closest(str(name), list(fields))) else None)
            suggestion = f"; did you mean '{hint}'?" if hint else f"; expected one of: {', '.join(fields)}"
            raise InputError(f"unknown config key '{prefix}{name}'{suggestion}")
        sub = fields[name].default_factory() if fields[name].default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(sub):
            check_keys(value, type(sub), f"{prefix}{name}.")


def _section_of(name: str) -> str | None:
    """``section.name`` where ``name`` is a key of exactly one section of :class:`Config`."""
    found = [
        f"{f.name}.{name}"
        for f in dataclasses.fields(Config)
        if dataclasses.is_dataclass(f.default_factory) and name in {g.name for g in dataclasses.fields(f.default_factory)}
    ]
    return found[0] if len(found) == 1 else None


def trainer_extras_unresolved(cfg: DictConfig) -> dict[str, Any]:
    own = {f.name for f in dataclasses.fields(TrainerConfig)}
    return {name: cfg.trainer[name] for name in cfg.trainer if name not in own}


def _check_trainer_value(name: str, value: Any) -> None:
    """A Trainer argument that counts (``trainer.max_epochs``) is an integer within the bound
    (-1, Lightning's "no limit", allowed where Lightning takes it); other arguments are Lightning's to check."""
    if name in _TRAINER_COUNTS and value is not None and value != -1:
        limits.check_integer(value, f"config key 'trainer.{name}'", 0, limits.MAX_TRAINING_STEPS)


def trainer_extras(cfg: DictConfig) -> dict[str, Any]:
    """The ``trainer.KEY`` values that are Lightning Trainer arguments rather than ktframe's own keys."""
    extras = trainer_extras_unresolved(cfg)
    return {name: value for name, value in OmegaConf.to_container(cfg.trainer, resolve=True).items() if name in extras}


def _read_yaml(source: Any) -> dict:
    """The mapping in a YAML file (a path or a packaged resource)."""
    try:
        loaded = OmegaConf.create(source.read_text())
    except OmegaConfBaseException as exc:
        raise InputError(f"{source}: not a valid config ({str(exc).splitlines()[0]})") from None
    except yaml.constructor.ConstructorError as exc:  # e.g. !!python/object: the safe loader builds none
        raise InputError(
            f"{source}: refused: {exc.problem} ({' '.join(str(exc.problem_mark).split())}); config files may hold only plain YAML values, no Python tags"
        ) from None
    except Exception as exc:  # the YAML parser's own errors: a syntax error in the file
        raise InputError(f"{source}: YAML syntax error: {' '.join(str(exc).split())}") from None
    values = OmegaConf.to_container(loaded)
    if not isinstance(values, dict):
        raise InputError(f"{source}: a config file must be a mapping of keys to values; got {type(values).__name__}")
    return values


# ``${NAME:...}``: an OmegaConf resolver (oc.env, oc.decode, ...), which reads the environment or
# parses text as YAML; a plain ``${section.key}`` refers to another key and stays allowed.
_RESOLVER = re.compile(r"\$\{\s*[\w.\-]+\s*:")
# Keys whose value names a folder: empty is a mistake, not "generate one" (that is leaving it out).
_FOLDER_KEYS = ("name", "run_id")


def parse_overrides(overrides: Sequence[str]) -> dict:
    """``key=value`` strings as a nested dict (values parsed as YAML by OmegaConf, plain values
    only: no YAML tag, no resolver)."""
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise InputError(f"override {item!r} is not of the form key=value (e.g. optim.lr=0.001)")
        key, _, value = item.partition("=")
        if _RESOLVER.search(value):
            raise InputError(f"override {item!r}: refused: a resolver (${{NAME:...}}); expected a plain value (a ${{section.key}} reference is allowed)")
        if key.strip() in _FOLDER_KEYS and not value.strip():
            raise InputError(f"config key '{key.strip()}' is empty; expected a folder name, or no {key.strip()}= at all for a generated run id")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as exc:
        raise InputError(f"could not parse overrides: {str(exc).splitlines()[0]}") from None
    except yaml.YAMLError as exc:  # a tag such as !!python/object: the safe loader builds none
        raise InputError(
            f"could not parse overrides: refused: {' '.join(str(getattr(exc, 'problem', None) or exc).split())}; expected plain values, no YAML tags"
        ) from None


def _preset(preset: str) -> Any:
    if preset.endswith((".yaml", ".yml")):
        path = Path(preset)
        if not path.is_file():
            raise InputError(f"config file {path} does not exist")
        return path
    files = preset_files()
    if preset not in files:
        hint = closest(preset, sorted(files))
        raise InputError(f"unknown preset {preset!r}; expected one of: {', '.join(sorted(files))}" + (f" (did you mean {hint!r}?)" if hint else ""))
    return files[preset]


def load_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The resolved config: schema defaults, then the preset (``preset=NAME`` or
    ``preset=path/to/file.yaml``; default ``quick``), then the other overrides."""
    cli = parse_overrides(overrides)
    check_keys(cli)
    preset = str(cli.get("preset", DEFAULT_PRESET))
    file_values = _read_yaml(_preset(preset))
    check_keys(file_values)
    file_values["preset"] = preset
    cfg = merge(file_values, *_variant_defaults(cli), cli)
    _check_variant(cfg)
    # A preset's model keys describe the variant it names (learned where it names none): switching
    # the variant on the command line keeps the preset's tasks and schedule, not its heads.
    file_model = file_values.get("model") if isinstance(file_values.get("model"), dict) else {}
    _check_model_keys(cfg, {"the command line": cli, **({f"preset {preset}": file_values} if "variant" in file_model else {})})
    return cfg


def _variant_defaults(cli: dict) -> list[dict]:
    """The layers ``variant=NAME`` adds between the preset and the command line."""
    name = cli.get("variant")
    if name is None:
        return []
    chosen = (cli.get("model") or {}).get("variant") if isinstance(cli.get("model"), dict) else None
    if chosen not in (None, name):
        raise InputError(f"variant={name} and model.variant={chosen} name different variants; give one of them")
    defaults = OmegaConf.to_container(OmegaConf.create(dict(get_variant(str(name)).training)))
    check_keys(defaults)
    return [{"model": {"variant": name}}, defaults]


def _check_variant(cfg: DictConfig) -> None:
    """The variant exists and takes the options given, before any training starts."""
    check_options(get_variant(cfg.model.variant), dict(cfg.model.options))


def _check_model_keys(cfg: DictConfig, sources: dict[str, dict]) -> None:
    """A model key given (on the command line or in the preset) that the chosen variant does not
    read is refused, naming those it reads: a hand-built variant has no embedding or attention map
    to set, and a key it would ignore must not look as if it applied."""
    reads = model_keys(cfg.model.variant)
    for source, values in sources.items():
        given = values.get("model") if isinstance(values.get("model"), dict) else {}
        unread = [name for name in MODEL_OPTIONS if name in given and name not in reads]
        if unread:
            keys = ", ".join(f"model.{name}" for name in unread)
            raise InputError(
                f"{keys} (from {source}) {'is' if len(unread) == 1 else 'are'} not read by variant {cfg.model.variant!r}, whose model reads "
                f"{', '.join(f'model.{name}' for name in reads)}; expected to leave {'it' if len(unread) == 1 else 'them'} out (or a variant that reads {'it' if len(unread) == 1 else 'them'}, e.g. variant=learned)"
            )


def applicable(cfg: DictConfig) -> dict:
    """The config as plain containers without the model keys its variant does not read: what
    ``ktframe config show`` prints, the keys that apply."""
    values = to_dict(cfg)
    reads = model_keys(cfg.model.variant)
    values["model"] = {name: value for name, value in values["model"].items() if name in reads or name not in MODEL_OPTIONS}
    return values


def merge(*layers: Any) -> DictConfig:
    """The schema's defaults overlaid with ``layers`` in order, every value checked."""
    try:
        base = OmegaConf.structured(Config)
        OmegaConf.set_struct(base.trainer, False)  # open to Lightning's own Trainer arguments (checked by check_keys)
        cfg = OmegaConf.merge(base, *layers)
    except OmegaConfBaseException as exc:
        raise InputError(_type_error(exc)) from None
    # Initialisers in their one spelling (kmeans++ is k-means++), as the run's config and its tables show them.
    cfg.data.init = canonical(cfg.data.init)
    cfg.eval.inits = [canonical(name) for name in cfg.eval.inits]
    check_values(cfg)
    return cfg


LOGGERS = ("wandb", "csv", "tensorboard", "none")
WANDB_MODES = ("auto", "online", "offline")

# Smallest valid value of each integer key.
_AT_LEAST = {
    "data.n": 1, "data.d": 1, "data.k": 1, "data.batch_size": 1, "data.val_tasks": 1, "data.val_batch_size": 1,
    "data.num_workers": 0, "model.n_layers": 1, "model.unroll": 1, "optim.plateau_patience": 0,
    "trainer.max_steps": 1, "trainer.val_every": 1, "trainer.log_every": 1, "trainer.num_nodes": 1,
    "eval.tasks": 1, "eval.steps": 1, "eval.batch_size": 1, "eval.lloyd_last": 0, "eval.swaps": 0,
}  # fmt: skip
# Largest value of each integer key that counts steps or iterations.
_AT_MOST = {
    "trainer.max_steps": limits.MAX_TRAINING_STEPS, "trainer.val_every": limits.MAX_TRAINING_STEPS, "trainer.log_every": limits.MAX_TRAINING_STEPS,
    "model.n_layers": limits.MAX_ITERATIONS, "model.unroll": limits.MAX_ITERATIONS, "eval.steps": limits.MAX_ITERATIONS,
    "eval.lloyd_last": limits.MAX_ITERATIONS, "eval.swaps": limits.MAX_ITERATIONS,
}  # fmt: skip
_SEEDS = ("trainer.seed", "data.seed", "data.val_seed", "eval.seed")
# The largest data.std: float32 tasks whose noise reaches thousands of scales (Cauchy's tails) then
# stay below 1.8e19, the square root of float32's largest number, so squared distances stay finite.
_STD_MAX = 1e15
# Trainer arguments (trainer.KEY) that count steps or epochs: an integer within the bound.
_TRAINER_COUNTS = ("max_epochs", "min_epochs", "min_steps", "num_sanity_val_steps", "accumulate_grad_batches")
# Keys that must be a number > 0; "inf" is a valid gamma (the hard limit), nothing else's.
_POSITIVE = {"data.std": False, "model.gamma": True, "optim.lr": False, "optim.loss_lambda": False, "logger.init_timeout": False}
# Keys whose value is one of a fixed list; names that plugins register are checked where looked up.
_CHOICES = {"data.family": FAMILIES, "eval.family": (None, *FAMILIES), "eval.checkpoint": ("best", "last"), "logger.kind": LOGGERS, "logger.mode": WANDB_MODES}


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
    for key in _SEEDS:
        limits.check_seed(OmegaConf.select(cfg, key), f"config key '{key}'")
    for key, maximum in _AT_MOST.items():
        limits.check_integer(values[key], f"config key '{key}'", _AT_LEAST[key], maximum)
    if cfg.trainer.early_stopping is not None and cfg.trainer.early_stopping < 1:
        raise _value_error("trainer.early_stopping", cfg.trainer.early_stopping, "null (never) or an integer >= 1 (validations without improvement)")
    if cfg.data.std > _STD_MAX:
        raise _value_error(
            "data.std", cfg.data.std, f"a positive number up to {_STD_MAX:g}: the tasks are drawn in float32, whose squared distances overflow beyond it"
        )
    for name, value in trainer_extras_unresolved(cfg).items():
        _check_trainer_value(name, value)
    if not 0 <= cfg.model.dropout < 1:
        raise _value_error("model.dropout", cfg.model.dropout, "a number in [0, 1)")
    if not 0 < cfg.optim.plateau_factor < 1:
        raise _value_error("optim.plateau_factor", cfg.optim.plateau_factor, "a number in (0, 1)")
    if cfg.trainer.threads is not None and cfg.trainer.threads < 1:
        raise _value_error("trainer.threads", cfg.trainer.threads, "null (ktframe's choice) or an integer >= 1")
    if cfg.model.scale is not None and not (math.isfinite(cfg.model.scale) and cfg.model.scale > 0):
        raise _value_error("model.scale", cfg.model.scale, "null (for 1/sqrt(d_emb)) or a positive number")
    if cfg.data.k > cfg.data.n:
        raise InputError(
            f"config key 'data.k'={cfg.data.k} exceeds data.n={cfg.data.n}: a task cannot have more clusters than points; expected data.k <= data.n"
        )
    if not cfg.eval.inits:
        raise _value_error("eval.inits", [], "a non-empty list of initialiser names")
    if not cfg.eval.ns or not all(type(n) is int and n >= 1 for n in cfg.eval.ns):
        raise _value_error("eval.ns", list(cfg.eval.ns), "a non-empty list of integers >= 1")
    if cfg.eval.ks is not None and not (cfg.eval.ks and all(type(k) is int and k >= 1 for k in cfg.eval.ks)):
        raise _value_error("eval.ks", list(cfg.eval.ks), "null or a non-empty list of integers >= 1")
    if cfg.eval.lloyd_last > cfg.eval.steps:
        raise _value_error("eval.lloyd_last", cfg.eval.lloyd_last, f"an integer from 0 to eval.steps={cfg.eval.steps}")
    for name in ("name", "run_id"):
        check_path_component(f"config key '{name}'", cfg[name])
    if not all(name in BASELINES for name in cfg.eval.baselines):
        raise _value_error("eval.baselines", list(cfg.eval.baselines), "a list of baseline names, each one of " + ", ".join(BASELINES))
    for name in ("k_range", "n_range"):
        _check_range(cfg, name)
    warm = cfg.data.warm_start
    if warm is not None and not (len(warm) == 2 and all(type(v) is int for v in warm) and 0 <= warm[0] <= warm[1]):
        raise _value_error("data.warm_start", list(warm), "null or [lo, hi], integers with 0 <= lo <= hi")
    try:
        TaskDistribution.of(cfg.data).check(cfg.data.d)
    except TaskError as exc:
        raise _value_error(f"data.{exc.name}", exc.value, exc.expected) from None


def check_path_component(what: str, value: str | None) -> None:
    """A run's name or id becomes a folder below ``root``: one folder name, never a path that
    leads out of it (``..``, an absolute path) or into another run's subfolder."""
    if value is None:
        return
    if value in ("", ".", "..") or any(char in value for char in "/\\\0"):
        raise InputError(f"{what} must be a single folder name (not empty, '.' or '..', no '/' or '\\'); got {value!r}")
    if len(value.encode()) > _NAME_MAX:
        raise InputError(
            f"{what} is {len(value.encode())} bytes long; expected a folder name of at most {_NAME_MAX} bytes (file systems allow 255, less room for '-2' and ktframe's own names)"
        )


_NAME_MAX = 200


def _check_range(cfg: DictConfig, name: str) -> None:
    """``data.k_range`` / ``data.n_range``: null or ``[lo, hi]``, integers with 1 <= lo <= hi; the
    tasks of every step must have at least as many points as clusters, and the validation's
    ``data.k`` must be one the model takes."""
    span = cfg.data[name]
    if span is None:
        return
    span = list(span)
    if len(span) != 2 or not all(type(v) is int for v in span) or not 1 <= span[0] <= span[1]:
        raise _value_error(f"data.{name}", span, "null or [lo, hi], integers with 1 <= lo <= hi")
    ks = list(cfg.data.k_range) if cfg.data.k_range is not None else [cfg.data.k, cfg.data.k]
    ns = list(cfg.data.n_range) if cfg.data.n_range is not None else [cfg.data.n, cfg.data.n]
    if ks[1] > ns[0]:
        raise InputError(
            f"a training task may have k={ks[1]} clusters but only n={ns[0]} points; expected the largest k (data.k_range, data.k) <= the smallest n (data.n_range, data.n)"
        )
    if name == "k_range" and not ks[0] <= cfg.data.k <= ks[1]:
        raise InputError(f"config key 'data.k'={cfg.data.k} (the validation tasks' k) lies outside data.k_range={ks}; expected lo <= data.k <= hi")


# What a value of each schema type looks like, for the type error of a key.
_EXPECTED = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "list": "a list such as [a, b]",
    "dict": "a mapping such as {key: value}",
}


def _field_type(key: str) -> str | None:
    """The schema's type of a dotted key (``trainer.max_steps``: ``int``); None where the key is no field."""
    schema: Any = Config
    for part in key.split("."):
        found = {f.name: f for f in dataclasses.fields(schema)}.get(part) if dataclasses.is_dataclass(schema) else None
        if found is None:
            return None
        sub = found.default_factory() if found.default_factory is not dataclasses.MISSING else None
        schema = type(sub) if dataclasses.is_dataclass(sub) else str(found.type)
    return schema if isinstance(schema, str) else None


def _type_error(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None)
    message = str(exc).splitlines()[0]
    kind = _field_type(key) if key else None
    optional = kind is not None and kind.startswith("Optional[")
    expected = _EXPECTED.get(kind.removeprefix("Optional[").removesuffix("]")) if kind else None
    if expected is None:
        return f"config key '{key}': {message}" if key else f"invalid config: {message}"
    return f"config key '{key}' has the value {getattr(exc, 'value', None)!r}; expected {expected}" + (" or null" if optional else "")


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def to_dict(cfg: DictConfig) -> dict:
    """Plain containers only, so that checkpoints load with ``weights_only=True``."""
    return OmegaConf.to_container(cfg, resolve=True)


def describe_keys(schema: Any = Config, prefix: str = "", values: DictConfig | None = None) -> Iterator[tuple[str, str, str, str]]:
    """``(key, type, value, meaning)`` of every config key, sections flattened: its value in
    ``values`` (a resolved config: what a run of it uses), else the schema's default."""
    for f in dataclasses.fields(schema):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from describe_keys(type(default), f"{prefix}{f.name}.", values)
            continue
        kind = str(f.type).removeprefix("Optional[").removesuffix("]") + (" or null" if str(f.type).startswith("Optional[") else "")
        value = default if values is None else OmegaConf.select(values, f"{prefix}{f.name}")
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        shown = value if isinstance(value, str) else json.dumps(value)
        yield f"{prefix}{f.name}", kind, shown, f.metadata.get("help", "")
