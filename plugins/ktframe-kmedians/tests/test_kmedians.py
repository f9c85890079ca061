"""The plugin's own tests: ktframe's conformance suite, then what is particular to k-medians."""

import math

import pytest
import torch

import ktframe
from ktframe.plugin.testing import variant_checks


@pytest.mark.parametrize("check", variant_checks("kmedians"), ids=str)
def test_conformance(check):
    check()


def test_centers_are_coordinate_wise_medians():
    # One cluster in 2-D: the medians of (0, 1, 2, 10) and (5, 7, -1, 0) are 1.5 and 2.5;
    # the mean would be pulled to (3.25, 2.75) by the 10.
    X = torch.tensor([[[0.0, 5.0], [1.0, 7.0], [2.0, -1.0], [10.0, 0.0]]], dtype=torch.float64)
    C0 = X[:, :1].clone()
    model = ktframe.build_model("kmedians", d=2, k=1, n_layers=1, gamma=math.inf, dtype="float64")
    with torch.no_grad():
        out = model(X, C0)
    assert out.centers.tolist() == [[[1.5, 2.5]]]


def test_assignment_is_by_l1_distance():
    # (2.1, 0) is nearer (0, 0) in L1 (2.1 < 2.2) but nearer (1.1, 1.1) in L2 (2.0 < 4.41).
    X = torch.tensor([[[2.1, 0.0], [0.0, 0.0], [1.1, 1.1]]], dtype=torch.float64)
    C0 = X[:, 1:].clone()
    model = ktframe.build_model("kmedians", d=2, k=2, n_layers=1, gamma=math.inf, dtype="float64")
    with torch.no_grad():
        out = model(X, C0)
    assert out.labels.tolist() == [[0, 0, 1]]
