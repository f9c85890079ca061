"""``ktframe.plugin.testing`` over every first-party variant, and proof that its checks can fail."""

from __future__ import annotations

import math

import pytest

from ktframe.core.errors import InputError
from ktframe.hooks.registry import Entry, Provenance
from ktframe.plugin import manager as pluginmanager
from ktframe.plugin.build import get_variant
from ktframe.plugin.testing import CHECKS, check_variant, variant_checks
from ktframe.plugin.variant import Variant, exact_tolerance

FIRST_PARTY = ["lloyd", "lloyd-dot", "soft", "spherical", "trimmed", "robust", "kmedoids"]

SUITES = [pytest.param(check, id=str(check)) for variant in FIRST_PARTY for check in variant_checks(variant)]
# soft's finite-temperature model is itself its algorithm: checked there too.
SUITES += [pytest.param(check, id=f"{check}@gamma=30") for check in variant_checks("soft", gamma=30.0) if check.name in ("reference", "batching", "trainable")]


@pytest.mark.parametrize("check", SUITES)
def test_first_party_variant_conforms(check):
    check()


def test_every_first_party_variant_is_checked():
    assert sorted({param.values[0].variant for param in SUITES}) == sorted(FIRST_PARTY)
    assert [check.name for check in variant_checks("lloyd")] == list(CHECKS)
    assert check_variant("lloyd-dot") == list(CHECKS)


def test_a_variant_that_is_not_reproducible_fails_determinism():
    # Unseeded, the kmedoids noise comes from torch's global generator: two runs differ.
    check = next(c for c in variant_checks("kmedoids", options={"seed": None}) if c.name == "determinism")
    with pytest.raises(AssertionError, match=r"^ktframe conformance check kmedoids:determinism: a second run of the same model returned other centers$"):
        check()


@pytest.fixture
def live_registry():
    yield pluginmanager.registry()
    pluginmanager.reset()  # forget the entries a test added


def test_a_variant_whose_reference_is_another_algorithm_fails(live_registry):
    lloyd = get_variant("lloyd")
    wrong = Variant("mislabelled", "lloyd's construction", "spherical k-means", lloyd.build, get_variant("spherical").reference, exact_tolerance)
    live_registry.add(Entry("variant", "mislabelled", wrong, Provenance("test")))
    checks = {c.name: c for c in variant_checks("mislabelled")}
    checks["shapes"]()  # the model itself is fine ...
    with pytest.raises(
        AssertionError, match=r"^ktframe conformance check mislabelled:reference: torch.float64: center error .* against the reference, spherical k-means$"
    ):
        checks["reference"]()


def test_a_variant_that_declares_no_exact_setting_fails(live_registry):
    lloyd = get_variant("lloyd")
    vague = Variant("vague", "lloyd, exact nowhere in particular", lloyd.classical, lloyd.build, lloyd.reference, exact_tolerance)
    live_registry.add(Entry("variant", "vague", vague, Provenance("test")))
    check = next(c for c in variant_checks("vague") if c.name == "registered")
    with pytest.raises(AssertionError, match=r"^ktframe conformance check vague:registered: declares no exact setting \(Variant.exact\)"):
        check()


def test_every_first_party_variant_declares_an_exact_setting():
    for name in FIRST_PARTY:
        exact = get_variant(name).exact
        assert exact is not None and exact["dtype"] == "float64", name
        assert exact["gamma"] == (100.0 if name == "soft" else math.inf), name


@pytest.mark.parametrize(
    "exact, message",
    [
        (
            {"gama": math.inf},
            r"^variant 'x' declares an exact setting with unknown key 'gama'; expected dtype or a build option: dtype, gamma, center_update, .* \(did you mean 'gamma'\?\)$",
        ),
        ({"gamma": -1.0}, r"^gamma must be a positive number or inf; got -1.0$"),
        ({"dtype": "float16"}, r"^unsupported dtype 'float16'"),
        ("gamma=inf", r"^variant 'x' declares exact='gamma=inf'; expected a dict"),
    ],
)
def test_an_invalid_exact_setting_is_refused_when_the_variant_is_made(exact, message):
    lloyd = get_variant("lloyd")
    with pytest.raises(InputError, match=message):
        Variant("x", "s", lloyd.classical, lloyd.build, lloyd.reference, exact_tolerance, exact=exact)


def test_a_variant_registered_under_another_name_fails(live_registry):
    live_registry.add(Entry("variant", "alias", get_variant("lloyd"), Provenance("test")))
    check = next(c for c in variant_checks("alias") if c.name == "registered")
    with pytest.raises(AssertionError, match=r"registered as 'alias' but names itself 'lloyd'"):
        check()
