"""Throwaway plugin distributions for the plugin tests: written to a folder, pip-installed into a
target folder of their own, then found through ``PYTHONPATH`` like any installed distribution.

Each distribution gets its own site folder so a test can put any combination of them on the path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Distribution:
    name: str  # the distribution (project) name
    version: str
    module: str  # the one importable module it ships
    entry_points: Mapping[str, str]  # entry-point name -> module, in the ``ktframe`` group
    source: str  # the module's text


# A third-party component of each kind a user would reach for first, and a variant reusing lloyd's
# construction (registered under a new name) on top of the built-ins.
GOOD = Distribution(
    name="ktframe-good-plugin",
    version="1.2.3",
    module="ktframe_test_good",
    entry_points={"good": "ktframe_test_good"},
    source="""
        import torch

        from ktframe import hookimpl
        from ktframe.core import reference
        from ktframe.components.maps import AttentionMap, MapOutput
        from ktframe.components.scores import Score
        from ktframe.plugin.variant import Variant, exact_tolerance

        import ktframe_lloyd


        class Manhattan(Score):
            description = "-gamma * ||q - k||_1"

            def __call__(self, q, k, gamma):
                return torch.cdist(q, k, p=1).mul_(-gamma)


        class Uniform(AttentionMap):
            description = "equal weight on every key"

            def __call__(self, logits):
                return MapOutput(weights=torch.full_like(logits, 1.0 / logits.shape[-1]))


        @hookimpl
        def ktframe_register_scores(register):
            register("manhattan", Manhattan)


        @hookimpl
        def ktframe_register_maps(register):
            register("uniform", Uniform)


        @hookimpl
        def ktframe_register_variants(register):
            register(
                Variant(
                    name="good-lloyd",
                    summary="lloyd's construction, republished by a third-party plugin",
                    classical="Lloyd's algorithm",
                    build=ktframe_lloyd.build,
                    reference=reference.lloyd,
                    tolerance=exact_tolerance,
                ),
            )
    """,
)

BROKEN_IMPORT = Distribution(
    name="ktframe-broken-import",
    version="0.0.1",
    module="ktframe_test_broken_import",
    entry_points={"broken-import": "ktframe_test_broken_import"},
    source="""
        raise RuntimeError("ktframe-broken-import refuses to be imported")
    """,
)

# exit() at import: a failure like any other, not the end of the command that loads it.
EXITS_AT_IMPORT = Distribution(
    name="ktframe-exits-at-import",
    version="0.0.5",
    module="ktframe_test_exits_at_import",
    entry_points={"exits-at-import": "ktframe_test_exits_at_import"},
    source="""
        import sys

        sys.exit(3)
    """,
)

# exit() in a hook: likewise a failure of that plugin alone.
EXITS_IN_HOOK = Distribution(
    name="ktframe-exits-in-hook",
    version="0.0.7",
    module="ktframe_test_exits_in_hook",
    entry_points={"exits-in-hook": "ktframe_test_exits_in_hook"},
    source="""
        import sys

        from ktframe import hookimpl


        @hookimpl
        def ktframe_register_scores(register):
            sys.exit("ktframe-exits-in-hook has had enough")
    """,
)

# Ctrl-C while it is imported: that stops the command.
INTERRUPTED_IMPORT = Distribution(
    name="ktframe-interrupted-import",
    version="0.0.6",
    module="ktframe_test_interrupted_import",
    entry_points={"interrupted-import": "ktframe_test_interrupted_import"},
    source="""
        raise KeyboardInterrupt
    """,
)

# Registers a score (its score hook returns normally), then a variant, then raises: neither may
# survive, or the registry would hold half a plugin.
BROKEN_HOOK = Distribution(
    name="ktframe-broken-hook",
    version="0.0.2",
    module="ktframe_test_broken_hook",
    entry_points={"broken-hook": "ktframe_test_broken_hook"},
    source="""
        from ktframe import hookimpl
        from ktframe.core import reference
        from ktframe.components.scores import Euclidean
        from ktframe.plugin.variant import Variant, exact_tolerance

        import ktframe_lloyd


        @hookimpl
        def ktframe_register_scores(register):
            register("halfway-score", Euclidean)


        @hookimpl
        def ktframe_register_variants(register):
            register(
                Variant(
                    name="halfway",
                    summary="never finished registering",
                    classical="Lloyd's algorithm",
                    build=ktframe_lloyd.build,
                    reference=reference.lloyd,
                    tolerance=exact_tolerance,
                ),
            )
            raise ValueError("ktframe-broken-hook gave up halfway through registering")
    """,
)

# Another distribution that also registers the score "manhattan".
CLASH = Distribution(
    name="ktframe-clash",
    version="0.3.0",
    module="ktframe_test_clash",
    entry_points={"clash": "ktframe_test_clash"},
    source="""
        from ktframe import hookimpl
        from ktframe.components.scores import Euclidean


        @hookimpl
        def ktframe_register_scores(register):
            register("manhattan", Euclidean)
    """,
)

# A distribution that registers a score under a built-in's name.
SHADOW = Distribution(
    name="ktframe-shadow",
    version="0.5.0",
    module="ktframe_test_shadow",
    entry_points={"shadow": "ktframe_test_shadow"},
    source="""
        from ktframe import hookimpl
        from ktframe.components.scores import Dot


        @hookimpl
        def ktframe_register_scores(register):
            register("euclidean", Dot)
    """,
)

# Another distribution whose entry point is also called "good".
SAME_NAME = Distribution(
    name="ktframe-good-fork",
    version="2.0.0",
    module="ktframe_test_good_fork",
    entry_points={"good": "ktframe_test_good_fork"},
    source="""
        from ktframe import hookimpl
        from ktframe.components.scores import Euclidean


        @hookimpl
        def ktframe_register_scores(register):
            register("fork-score", Euclidean)
    """,
)

TYPO = Distribution(
    name="ktframe-typo",
    version="0.0.3",
    module="ktframe_test_typo",
    entry_points={"typo": "ktframe_test_typo"},
    source="""
        from ktframe import hookimpl
        from ktframe.components.scores import Euclidean


        @hookimpl
        def ktframe_register_scorez(register):
            register("typo-score", Euclidean)
    """,
)

# A hook whose signature does not match its spec.
BAD_SIGNATURE = Distribution(
    name="ktframe-bad-signature",
    version="0.0.4",
    module="ktframe_test_bad_signature",
    entry_points={"bad-signature": "ktframe_test_bad_signature"},
    source="""
        from ktframe import hookimpl
        from ktframe.components.scores import Euclidean


        @hookimpl
        def ktframe_register_scores(register, width):
            register("bad-score", Euclidean)
    """,
)

ALL = (GOOD, BROKEN_IMPORT, EXITS_AT_IMPORT, EXITS_IN_HOOK, INTERRUPTED_IMPORT, BROKEN_HOOK, CLASH, SHADOW, SAME_NAME, TYPO, BAD_SIGNATURE)


def write(dist: Distribution, root: Path) -> Path:
    """The project folder of ``dist`` under ``root``."""
    project = root / dist.name
    (project / dist.module).mkdir(parents=True)
    (project / dist.module / "__init__.py").write_text(textwrap.dedent(dist.source).lstrip())
    entry_points = "".join(f'{json.dumps(name)} = "{target}"\n' for name, target in dist.entry_points.items())
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{dist.name}"\nversion = "{dist.version}"\n\n'
        f"[project.entry-points.ktframe]\n{entry_points}\n"
        f'[tool.setuptools]\npackages = ["{dist.module}"]\n'
    )
    return project


def pip_install(project: Path, target: Path) -> None:
    """Really install ``project`` into ``target``, offline, with this interpreter's setuptools."""
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
        "--no-build-isolation", "--no-index", "--target", str(target), str(project),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "PIP_NO_INPUT": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"pip could not install {project.name}:\n{done.stdout}\n{done.stderr}")


def build_all(root: Path, dists: Sequence[Distribution] = ALL) -> dict[str, Path]:
    """Install every distribution into ``root/site/<name>``; returns name -> site folder."""
    sites = {dist.name: root / "site" / dist.name for dist in dists}
    projects = {dist.name: write(dist, root / "src") for dist in dists}
    with ThreadPoolExecutor(max_workers=len(dists)) as pool:
        for future in [pool.submit(pip_install, projects[name], sites[name]) for name in sites]:
            future.result()
    return sites


def plugin_env(sites: Sequence[Path], *, strict: bool, disable: str | None = None) -> dict[str, str]:
    """This process's environment with ``sites`` first on the path and the ktframe plugin
    switches set explicitly (the test suite itself runs with KTFRAME_STRICT_PLUGINS=1)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("KTFRAME_")}
    env["KTFRAME_STRICT_PLUGINS"] = "1" if strict else "0"
    if disable is not None:
        env["KTFRAME_DISABLE_PLUGINS"] = disable
    env["PYTHONPATH"] = os.pathsep.join([*map(str, sites), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


@dataclass(frozen=True)
class Run:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)

    def __str__(self) -> str:  # shown when an assertion fails
        return f"ktframe {' '.join(self.args)} -> exit {self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def ktframe(args: Sequence[str], sites: Sequence[Path], *, strict: bool, disable: str | None = None, cwd: Path | None = None) -> Run:
    """Run the real CLI in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-m", "ktframe.cli.main", *args],
        capture_output=True, text=True, timeout=600, cwd=cwd, env=plugin_env(sites, strict=strict, disable=disable),
    )  # fmt: skip
    return Run(tuple(args), done.returncode, done.stdout, done.stderr)
