"""The real data sets of ``ktframe real-data``: data that ships inside installable packages, read
without the network. Kept apart from the evaluation, so that ``ktframe real-data --help`` lists them
without importing PyTorch."""

from __future__ import annotations

import csv
import importlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ktframe.core.errors import InputError
from ktframe.core.names import unknown_name_message

if TYPE_CHECKING:
    import numpy as np

INSTALL = "pip install 'ktframe[realdata]'"


@dataclass(frozen=True)
class DataSet:
    """A data set that a package ships: ``load()`` gives its points ``(n, D)`` (numeric features
    only, no labels); ``ks`` the numbers of clusters it is evaluated at: its number of classes
    (where it has classes) and others."""

    name: str
    source: str
    ks: tuple[int, ...]
    load: Callable[[], np.ndarray]


def _scikit_learn(loader: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        import numpy as np

        try:
            datasets = importlib.import_module("sklearn.datasets")
        except ImportError:
            raise InputError(f"the data sets of scikit-learn need the scikit-learn package, which is not installed; expected it installed: {INSTALL}") from None
        return np.asarray(getattr(datasets, loader)(return_X_y=True)[0], dtype=np.float64)

    return load


PENGUIN_FEATURES = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g")


def _penguins() -> np.ndarray:
    """The palmerpenguins package's penguins.csv: its four measurements, the rows that have all
    four. Read from the package's folder without importing it (which imports pandas)."""
    import numpy as np

    spec = importlib.util.find_spec("palmerpenguins")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            f"the data set 'penguins' needs the palmerpenguins package, which is not installed; expected it installed: {INSTALL} (or data sets without penguins)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "penguins.csv"
    with path.open(newline="") as handle:
        rows = [[row[name] for name in PENGUIN_FEATURES] for row in csv.DictReader(handle)]
    return np.array([[float(value) for value in row] for row in rows if "NA" not in row])


DATASETS = {
    data.name: data
    for data in (
        DataSet("iris", "scikit-learn load_iris", (3, 10), _scikit_learn("load_iris")),
        DataSet("wine", "scikit-learn load_wine", (3, 10), _scikit_learn("load_wine")),
        DataSet("breast-cancer", "scikit-learn load_breast_cancer", (2, 10), _scikit_learn("load_breast_cancer")),
        DataSet("digits", "scikit-learn load_digits", (5, 10, 16), _scikit_learn("load_digits")),
        DataSet("diabetes", "scikit-learn load_diabetes (a regression set: no classes)", (5, 10), _scikit_learn("load_diabetes")),
        DataSet("penguins", "palmerpenguins penguins.csv", (3, 10), _penguins),
    )
}


def data_sets(names: Sequence[str]) -> list[DataSet]:
    """The data sets ``names``, each known (a one-line error otherwise), in the order given."""
    for name in names:
        if name not in DATASETS:
            raise InputError(unknown_name_message("data set", name, list(DATASETS)))
    return [DATASETS[name] for name in dict.fromkeys(names)]
