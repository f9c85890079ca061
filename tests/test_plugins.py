"""Plugins end to end: throwaway distributions are really pip-installed into a temporary folder and
found through the ``ktframe`` entry-point group, by the real CLI in a fresh interpreter and by
``pluginmanager.load()`` in this one.

The CLI runs are slow to start (torch), so every one of them is started at once, in parallel, the
first time a test asks for any; each test then reads the run it needs.
"""

from __future__ import annotations

import importlib.metadata as metadata
import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import distributions as dists
import pytest
import torch
from distributions import (
    BAD_SIGNATURE,
    BROKEN_HOOK,
    BROKEN_IMPORT,
    CLASH,
    EXITS_AT_IMPORT,
    EXITS_IN_HOOK,
    GOOD,
    INTERRUPTED_IMPORT,
    SAME_NAME,
    SHADOW,
    TYPO,
    Distribution,
    Run,
)

from ktframe.cli.main import main
from ktframe.components.scores import Euclidean
from ktframe.core import reference
from ktframe.core.errors import PluginError, UnknownNameError
from ktframe.hooks.registry import Entry, Provenance, Registry
from ktframe.plugin import manager as pluginmanager
from ktframe.plugin.build import get_variant
from ktframe.plugin.manager import BUILTIN_PLUGINS, PluginLoadWarning
from ktframe.plugin.variant import Variant, exact_tolerance

# Entry-point names, in the order the plugin manager loads them; each registers the variant of its name.
# ktframe's own variants: entry points of the ktframe distribution, in the order of their names
FIRST_PARTY = ("kmedoids", "learned", "lloyd", "lloyd-dot", "robust", "soft", "spherical", "trimmed")


@dataclass(frozen=True)
class Scenario:
    args: tuple[str, ...]
    installed: tuple[Distribution, ...]
    strict: bool
    disable: str | None = None


VERIFY = ("verify", "--json", "--n", "120", "--d", "2", "--k", "3", "--layers", "3", "--gamma", "inf", "--dtype", "float64")
PLUGINS = ("plugins", "--json")

SCENARIOS = {
    "good": Scenario(PLUGINS, (GOOD,), strict=True),
    "good-verify": Scenario((*VERIFY, "--variant", "good-lloyd"), (GOOD,), strict=True),
    "unknown-variant": Scenario((*VERIFY, "--variant", "good-loyd"), (GOOD,), strict=True),
    "broken": Scenario(PLUGINS, (GOOD, BROKEN_IMPORT, BROKEN_HOOK), strict=False),
    "broken-strict": Scenario(PLUGINS, (GOOD, BROKEN_IMPORT), strict=True),
    "exits": Scenario(PLUGINS, (GOOD, EXITS_AT_IMPORT), strict=False),
    "exits-verify": Scenario((*VERIFY, "--variant", "good-lloyd"), (GOOD, EXITS_AT_IMPORT), strict=False),
    "exits-strict": Scenario(PLUGINS, (GOOD, EXITS_AT_IMPORT), strict=True),
    "clash": Scenario(PLUGINS, (GOOD, CLASH), strict=False),
    "typo": Scenario(PLUGINS, (GOOD, TYPO), strict=False),
    "disable-all": Scenario(PLUGINS, (GOOD, BROKEN_IMPORT), strict=True, disable="1"),
    "disable-some": Scenario(PLUGINS, (GOOD, BROKEN_IMPORT), strict=True, disable="broken-import, lloyd-dot"),
}


@pytest.fixture(scope="session")
def sites(tmp_path_factory) -> dict[str, Path]:
    """Distribution name -> the folder pip installed it into."""
    return dists.build_all(tmp_path_factory.mktemp("plugin-distributions"))


@dataclass
class CliRuns:
    sites: dict[str, Path]
    cwd: Path
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=4))
    futures: dict[str, Future] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Run:
        if not self.futures:
            for name, s in SCENARIOS.items():
                paths = [self.sites[d.name] for d in s.installed]
                self.futures[name] = self.pool.submit(dists.ktframe, s.args, paths, strict=s.strict, disable=s.disable, cwd=self.cwd)
        return self.futures[key].result()


@pytest.fixture(scope="session")
def cli(sites, tmp_path_factory):
    runs = CliRuns(sites, tmp_path_factory.mktemp("cwd"))
    yield runs
    runs.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def installed(sites, monkeypatch):
    """``installed(*distributions, strict=..., disable=...)`` puts those distributions on this
    process's path and sets the plugin switches, then forgets the cached plugin state (again on
    the way out), so ``pluginmanager.load()``/``state()`` see exactly them."""

    def use(*chosen: Distribution, strict: bool, disable: str | None = None) -> None:
        for dist in chosen:
            monkeypatch.syspath_prepend(str(sites[dist.name]))
        monkeypatch.setenv("KTFRAME_STRICT_PLUGINS", "1" if strict else "0")
        if disable is None:
            monkeypatch.delenv("KTFRAME_DISABLE_PLUGINS", raising=False)
        else:
            monkeypatch.setenv("KTFRAME_DISABLE_PLUGINS", disable)
        pluginmanager.reset()

    yield use
    pluginmanager.reset()


def plugin_names(info: dict) -> list[str]:
    return [p["name"] for p in info["plugins"]]


def registered(info: dict, kind: str) -> set[str]:
    return {name for p in info["plugins"] for name in p["registers"].get(kind, [])}


def assert_one_line_error(run: Run, command: str) -> str:
    """Exit code 2 and exactly one line on stderr, ``ktframe COMMAND: error: ...``, no traceback."""
    assert run.returncode == 2, run
    assert "Traceback" not in run.stderr, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run
    assert lines[0].startswith(f"ktframe {command}: error: "), run
    assert run.stdout == "", run
    return lines[0]


def assert_builtins(info: dict) -> None:
    by_name = {p["name"]: p for p in info["plugins"]}
    for module in BUILTIN_PLUGINS:
        assert by_name[module]["distribution"] == "ktframe"
    assert {"euclidean", "dot", "linear"} <= registered(info, "score")
    assert {"softmax", "hardmax", "normalize"} <= registered(info, "map")


# (1) a working third-party plugin ---------------------------------------------------------------


def test_third_party_plugin_is_listed_with_its_distribution(cli):
    run = cli["good"]
    assert run.returncode == 0, run
    assert "Traceback" not in run.stderr and "PluginLoadWarning" not in run.stderr, run
    info = run.json()
    assert info["failures"] == []
    assert_builtins(info)
    # built-ins first, then entry points by name
    assert plugin_names(info) == [*BUILTIN_PLUGINS, "good", *FIRST_PARTY]
    good = info["plugins"][len(BUILTIN_PLUGINS)]
    assert good == {
        "name": "good",
        "distribution": "ktframe-good-plugin",
        "version": "1.2.3",
        "registers": {"score": ["manhattan"], "map": ["uniform"], "variant": ["good-lloyd"]},
    }
    variants = {v["name"]: v for v in info["variants"]}
    assert sorted(variants) == sorted(["good-lloyd", *FIRST_PARTY])
    assert variants["good-lloyd"]["plugin"] == "good"
    assert variants["good-lloyd"]["distribution"] == "ktframe-good-plugin"
    assert variants["good-lloyd"]["classical"] == "Lloyd's algorithm"
    assert variants["good-lloyd"]["options"] == variants["lloyd"]["options"]
    assert variants["lloyd"]["distribution"] == "ktframe"
    # Each variant's exact setting, the one `ktframe verify` runs by default; good-lloyd declares none.
    assert variants["lloyd"]["exact"] == {"gamma": "inf", "dtype": "float64"}
    assert variants["soft"]["exact"] == {"gamma": 100.0, "dtype": "float64"}
    assert variants["good-lloyd"]["exact"] is None
    # What the estimator offers with each: soft memberships (predict_proba) and sample weights.
    assert variants["soft"]["soft_memberships"] and not variants["lloyd"]["soft_memberships"]
    assert variants["lloyd"]["sample_weights"] and not variants["good-lloyd"]["sample_weights"]


def test_third_party_variant_passes_verify(cli):
    run = cli["good-verify"]
    assert run.returncode == 0, run
    report = run.json()
    assert report["variant"] == "good-lloyd"
    assert report["classical"] == "Lloyd's algorithm"
    assert (report["n"], report["k"], report["layers"], report["gamma"], report["dtype"]) == (120, 3, 3, "inf", "float64")
    assert report["passed"] is True
    assert report["max_center_error"] <= 1e-9
    assert report["assignment_agreement"] == 1.0


def test_third_party_components_are_usable_in_process(installed):
    installed(GOOD, strict=True)
    state = pluginmanager.state()
    assert state.failures == []
    assert state.registry.entry("score", "manhattan").provenance == Provenance("good", "ktframe-good-plugin", "1.2.3")

    g = torch.Generator().manual_seed(0)
    q, k = torch.rand(2, 4, 3, generator=g, dtype=torch.float64), torch.rand(2, 5, 3, generator=g, dtype=torch.float64)
    logits = state.registry.get("score", "manhattan")()(q, k, 2.0)
    assert torch.allclose(logits, -2.0 * (q[:, :, None] - k[:, None]).abs().sum(-1))
    weights = state.registry.get("map", "uniform")()(logits).weights
    assert torch.allclose(weights, torch.full((2, 4, 5), 0.2, dtype=torch.float64))

    # the variant builds through the public API and equals Lloyd's algorithm
    import ktframe

    X = torch.rand(1, 40, 2, generator=g, dtype=torch.float64)
    C0 = reference.random_points(X, 3, g)
    model = ktframe.build_model("good-lloyd", d=2, k=3, n_layers=4, gamma=math.inf, dtype="float64")
    assert model.variant == "good-lloyd"
    with torch.no_grad():
        got = model(X, C0)
    want = reference.lloyd(X, C0, 4)
    assert torch.allclose(got.trajectory, want.trajectory, atol=1e-12)


# (2) a plugin that raises at import / (3) one that raises inside its hook -----------------------


def test_broken_plugins_are_reported_and_the_rest_still_load(cli):
    run = cli["broken"]
    assert run.returncode == 0, run
    assert "Traceback" not in run.stderr, run
    info = run.json()

    failures = {f["plugin"]: f for f in info["failures"]}
    assert sorted(failures) == ["broken-hook", "broken-import"]
    assert failures["broken-import"] == {
        "plugin": "broken-import",
        "distribution": "ktframe-broken-import",
        "stage": "import",
        "error": "RuntimeError: ktframe-broken-import refuses to be imported",
    }
    assert failures["broken-hook"] == {
        "plugin": "broken-hook",
        "distribution": "ktframe-broken-hook",
        "stage": "ktframe_register_variants",
        "error": "ValueError: ktframe-broken-hook gave up halfway through registering",
    }
    # each failure is a warning on stderr
    for name, dist in (("broken-import", "ktframe-broken-import"), ("broken-hook", "ktframe-broken-hook")):
        assert any("PluginLoadWarning" in line and repr(name) in line and dist in line for line in run.stderr.splitlines()), run

    # the built-ins, the good plugin and the first-party variants still load ...
    assert_builtins(info)
    assert plugin_names(info) == [*BUILTIN_PLUGINS, "good", *FIRST_PARTY]
    assert sorted(v["name"] for v in info["variants"]) == sorted(["good-lloyd", *FIRST_PARTY])
    assert "manhattan" in registered(info, "score")
    # ... and nothing of the plugin that raised halfway is left, not even what its other hook registered
    assert "halfway" not in registered(info, "variant")
    assert "halfway-score" not in registered(info, "score")


def test_broken_plugins_warn_and_leave_nothing_in_process(installed):
    installed(GOOD, BROKEN_IMPORT, BROKEN_HOOK, strict=False)
    with pytest.warns(PluginLoadWarning) as warned:
        state = pluginmanager.load()
    messages = sorted(str(w.message) for w in warned)
    assert messages == [
        "plugin 'broken-hook' from distribution ktframe-broken-hook failed at ktframe_register_variants: "
        "ValueError: ktframe-broken-hook gave up halfway through registering",
        "plugin 'broken-import' from distribution ktframe-broken-import failed at import: RuntimeError: ktframe-broken-import refuses to be imported",
    ]
    assert [f.plugin for f in state.failures] == ["broken-import", "broken-hook"]
    names = {(entry.kind, entry.name) for entry in state.registry}
    assert ("variant", "halfway") not in names and ("score", "halfway-score") not in names
    assert all(entry.provenance.plugin != "broken-hook" for entry in state.registry)
    assert ("score", "manhattan") in names and ("variant", "good-lloyd") in names


def test_broken_plugins_in_the_text_listing(installed, capsys):
    installed(GOOD, BROKEN_IMPORT, strict=False)
    with pytest.warns(PluginLoadWarning):
        assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "good  (ktframe-good-plugin 1.2.3)" in out
    assert "    score: manhattan" in out
    failed = "FAILED: plugin 'broken-import' (ktframe-broken-import) at import: RuntimeError: ktframe-broken-import refuses to be imported"
    assert failed in " ".join(out.split())  # wrapped to the listing's width
    assert max(map(len, out.splitlines())) <= 100


def test_strict_mode_makes_an_import_failure_an_error(cli):
    line = assert_one_line_error(cli["broken-strict"], "plugins")
    assert "plugin 'broken-import' from distribution ktframe-broken-import failed at import" in line
    assert "RuntimeError: ktframe-broken-import refuses to be imported" in line
    assert "KTFRAME_STRICT_PLUGINS" in line


def test_a_plugin_that_exits_at_import_is_reported_and_every_command_goes_on(cli):
    for run in (cli["exits"], cli["exits-verify"]):
        assert run.returncode == 0, run
        assert "Traceback" not in run.stderr, run
        warned = [line for line in run.stderr.splitlines() if "PluginLoadWarning" in line]
        assert len(warned) == 1 and "'exits-at-import' from distribution ktframe-exits-at-import failed at import: SystemExit: 3" in warned[0], run
    info = cli["exits"].json()
    assert info["failures"] == [{"plugin": "exits-at-import", "distribution": "ktframe-exits-at-import", "stage": "import", "error": "SystemExit: 3"}]
    assert plugin_names(info) == [*BUILTIN_PLUGINS, "good", *FIRST_PARTY]
    assert cli["exits-verify"].json()["passed"] is True


def test_strict_mode_makes_an_exit_at_import_an_error(cli):
    line = assert_one_line_error(cli["exits-strict"], "plugins")
    assert "plugin 'exits-at-import' from distribution ktframe-exits-at-import failed at import: SystemExit: 3 (KTFRAME_STRICT_PLUGINS is set)" in line


def test_a_hook_that_exits_is_reported_and_leaves_nothing(installed):
    installed(GOOD, EXITS_IN_HOOK, strict=False)
    with pytest.warns(PluginLoadWarning) as warned:
        state = pluginmanager.load()
    assert [str(w.message) for w in warned] == [
        "plugin 'exits-in-hook' from distribution ktframe-exits-in-hook failed at ktframe_register_scores: SystemExit: ktframe-exits-in-hook has had enough"
    ]
    assert all(entry.provenance.plugin != "exits-in-hook" for entry in state.registry)
    assert ("variant", "good-lloyd") in {(entry.kind, entry.name) for entry in state.registry}


def test_ctrl_c_while_a_plugin_is_imported_stops_the_load(installed):
    installed(GOOD, INTERRUPTED_IMPORT, strict=False)
    with pytest.raises(KeyboardInterrupt):
        pluginmanager.load()


def test_strict_mode_makes_a_hook_failure_an_error(installed):
    installed(GOOD, BROKEN_HOOK, strict=True)
    with pytest.raises(PluginError) as raised:
        pluginmanager.load()
    message = str(raised.value)
    assert "\n" not in message
    assert "plugin 'broken-hook' from distribution ktframe-broken-hook failed at ktframe_register_variants" in message
    assert "ValueError: ktframe-broken-hook gave up halfway" in message


# (4) two distributions registering the same thing ----------------------------------------------


def test_same_component_from_two_distributions_is_an_error(cli):
    line = assert_one_line_error(cli["clash"], "plugins")
    assert "score 'manhattan' is registered twice" in line
    assert "plugin 'good' (distribution ktframe-good-plugin 1.2.3)" in line
    assert "plugin 'clash' (distribution ktframe-clash 0.3.0)" in line


def test_clash_with_a_builtin_names_the_builtin_first(installed):
    installed(SHADOW, strict=False)
    with pytest.raises(PluginError) as raised:
        pluginmanager.load()
    version = metadata.version("ktframe")
    assert str(raised.value) == (
        f"score 'euclidean' is registered twice: by plugin 'ktframe.components.scores' (distribution ktframe {version}) "
        "and by plugin 'shadow' (distribution ktframe-shadow 0.5.0); uninstall one of them or rename the component"
    )


def test_two_entry_points_with_one_name_is_an_error(installed):
    installed(GOOD, SAME_NAME, strict=False)
    with pytest.raises(PluginError) as raised:
        pluginmanager.load()
    message = str(raised.value)
    assert "\n" not in message
    assert "two plugins are named 'good'" in message
    assert "ktframe-good-plugin" in message and "ktframe-good-fork" in message


# (5) a misspelt hook, or a hook with the wrong arguments ---------------------------------------


def test_misspelt_hook_is_an_error_even_when_not_strict(cli):
    line = assert_one_line_error(cli["typo"], "plugins")
    assert "plugin 'typo' (distribution ktframe-typo 0.0.3) has an unknown hook" in line
    assert "unknown hook 'ktframe_register_scorez'" in line
    assert "ktframe_register_scores" in line  # the known hooks are listed


def test_hook_with_wrong_arguments_is_a_one_line_error(installed):
    installed(BAD_SIGNATURE, strict=False)
    with pytest.raises(PluginError) as raised:
        pluginmanager.load()
    message = str(raised.value)
    assert "\n" not in message
    assert "plugin 'bad-signature' (distribution ktframe-bad-signature 0.0.4)" in message
    assert "ktframe_register_scores" in message and "width" in message


# (6) unknown names ----------------------------------------------------------------------------


def test_unknown_variant_lists_the_valid_ones_and_the_closest(cli):
    line = assert_one_line_error(cli["unknown-variant"], "verify")
    assert "unknown variant 'good-loyd'" in line
    assert f"expected one of: {', '.join(sorted(['good-lloyd', *FIRST_PARTY]))}" in line
    assert line.endswith("(did you mean 'good-lloyd'?)")


def test_unknown_component_suggests_a_third_party_one(installed):
    installed(GOOD, strict=True)
    with pytest.raises(UnknownNameError) as raised:
        pluginmanager.registry().get("score", "manhatan")
    assert str(raised.value) == "unknown score 'manhatan'; expected one of: cluster-euclidean, dot, euclidean, linear, manhattan (did you mean 'manhattan'?)"


# (7) disabling entry-point plugins --------------------------------------------------------------


def test_disable_all_keeps_only_ktframe_itself(cli):
    run = cli["disable-all"]
    assert run.returncode == 0, run  # strict, yet the broken plugin is never imported
    info = run.json()
    # The built-in components and ktframe's own variants; no other distribution's plugin ran.
    assert plugin_names(info) == [*BUILTIN_PLUGINS, *FIRST_PARTY]
    assert_builtins(info)
    assert sorted(v["name"] for v in info["variants"]) == sorted(FIRST_PARTY) and info["failures"] == []
    assert all(v["distribution"] == "ktframe" for v in info["variants"])
    assert "manhattan" not in registered(info, "score")


def test_disable_a_list_skips_just_those(cli):
    run = cli["disable-some"]
    assert run.returncode == 0, run
    info = run.json()
    rest = [name for name in FIRST_PARTY if name != "lloyd-dot"]
    assert plugin_names(info) == [*BUILTIN_PLUGINS, "good", *rest]
    assert sorted(v["name"] for v in info["variants"]) == sorted(["good-lloyd", *rest])
    assert "sqnorm" not in registered(info, "embedding")  # lloyd-dot's embedding went with it
    assert info["failures"] == []


def test_disabled_plugins_leave_unknown_variant_errors_helpful(installed):
    installed(GOOD, strict=True, disable="1")
    with pytest.raises(UnknownNameError) as raised:
        pluginmanager.registry().get("variant", "good-lloyd")
    # ktframe's own variants are left to suggest, the closest first.
    assert str(raised.value) == f"unknown variant 'good-lloyd'; expected one of: {', '.join(sorted(FIRST_PARTY))} (did you mean 'lloyd'?)"


# The register callbacks ---------------------------------------------------------------------------

A = Provenance("alpha", "dist-alpha", "1.0")
B = Provenance("beta", "dist-beta", "2.0")


def a_variant(name: str = "mine") -> Variant:
    return Variant(
        name=name, summary="s", classical="Lloyd's algorithm", build=get_variant("lloyd").build, reference=reference.lloyd, tolerance=exact_tolerance
    )


def test_a_variant_is_registered_under_its_own_name():
    staged: list[Entry] = []
    variant = a_variant()
    pluginmanager.registrar("variant", A, staged)(variant)
    assert staged == [Entry("variant", "mine", variant, A)]


def test_the_older_register_name_variant_is_accepted_while_the_names_agree():
    staged: list[Entry] = []
    register = pluginmanager.registrar("variant", A, staged)
    with pytest.warns(DeprecationWarning, match=r"register\(name, variant\) is deprecated; call register\(variant\)"):
        register("mine", a_variant())
    assert [entry.name for entry in staged] == ["mine"]
    with pytest.raises(
        PluginError,
        match=r"^plugin 'alpha' \(distribution dist-alpha 1.0\) registered the variant named 'mine' as 'yours'; call register\(variant\), which uses variant.name$",
    ):
        register("yours", a_variant())
    assert len(staged) == 1


def test_a_variant_hook_registers_variants_only():
    register = pluginmanager.registrar("variant", A, [])
    with pytest.raises(PluginError, match=r"registered a str as a variant; expected a ktframe.Variant$"):
        register("lloyd")
    with pytest.raises(PluginError, match=r"registered a variant with an invalid name ''"):
        register(a_variant(""))
    with pytest.raises(PluginError, match=r"called register\(\) with 3 arguments"):
        register("mine", a_variant(), "extra")


def test_a_component_is_registered_under_the_name_given():
    staged: list[Entry] = []
    pluginmanager.registrar("score", A, staged)("mine", Euclidean)
    assert staged == [Entry("score", "mine", Euclidean, A)]
    with pytest.raises(PluginError, match=r"registered a score with an invalid name None"):
        pluginmanager.registrar("score", A, staged)(None, Euclidean)


# Registry --------------------------------------------------------------------------------------


def test_registry_duplicate_names_both_providers():
    registry = Registry()
    registry.add(Entry("score", "same", 1, A))
    registry.add(Entry("map", "same", 2, B))  # other kind: no clash
    with pytest.raises(PluginError) as raised:
        registry.add(Entry("score", "same", 3, B))
    assert str(raised.value) == (
        "score 'same' is registered twice: by plugin 'alpha' (distribution dist-alpha 1.0) and by "
        "plugin 'beta' (distribution dist-beta 2.0); uninstall one of them or rename the component"
    )
    assert registry.get("score", "same") == 1


def test_registry_unknown_name():
    registry = Registry()
    for name in ("euclidean", "dot", "linear"):
        registry.add(Entry("score", name, name, A))
    with pytest.raises(UnknownNameError, match=r"^unknown score 'euclidian'; expected one of: dot, euclidean, linear \(did you mean 'euclidean'\?\)$"):
        registry.get("score", "euclidian")
    with pytest.raises(UnknownNameError) as raised:
        registry.get("score", "zzzzzz")
    assert "did you mean" not in str(raised.value)
    with pytest.raises(UnknownNameError, match=r"^unknown map 'softmax'; expected one of: \(none registered\)$"):
        registry.get("map", "softmax")
    with pytest.raises(UnknownNameError, match="unknown score '3'"):
        registry.get("score", 3)


def test_registry_listing_is_sorted():
    registry = Registry()
    registry.add(Entry("score", "b", 1, A))
    registry.add(Entry("score", "a", 2, B))
    registry.add(Entry("map", "c", 3, A))
    assert registry.kinds() == ["map", "score"]
    assert registry.names("score") == ["a", "b"] and registry.names("norm") == []
    assert [(e.kind, e.name) for e in registry] == [("map", "c"), ("score", "a"), ("score", "b")]
    assert registry.entry("score", "a").provenance == B
    assert str(Provenance("local")) == "plugin 'local'"
    assert str(Provenance("p", "d")) == "plugin 'p' (distribution d)"
