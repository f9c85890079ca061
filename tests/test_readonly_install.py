"""ktframe installed read-only, as on a shared cluster or in a container image: ``import ktframe``
and every command run for a user who can write neither the install nor HOME, with the kernels
compiled in memory; importing writes no file; compiled kernels are cached in the user's cache
folder only (:mod:`ktframe.kernels.jit`), and a second process reuses them.

The install is the wheel in a virtual environment of its own (``test_wheel.install_wheel``, with
this interpreter's packages), made read-only. File modes do not stop root, so the commands run as
an unprivileged user (``setpriv``) where the tests run as root, and are skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from test_wheel import build_wheel, install_wheel
from test_workflow import SMALL_EVAL

from ktframe.kernels import cache as kernel_cache
from ktframe.kernels import jit

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
AS_ANOTHER_USER = pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None, reason="needs root and setpriv, to run the commands as a user for whom the install's file modes hold"
)

# What a user's process reports: whether the import brought numba, where kernels are cached
# (None: nowhere) and how a kernel's compilation went (from the cache, or compiled).
PROBE = """
import json, sys
import torch
import ktframe
numba_at_import = "numba" in sys.modules
from ktframe.kernels import cache, cpu as kernels
a = torch.zeros(3, 4, 2)
b = a.clone()
b[1, 2, 0] = 1.0
changed = kernels.tasks_changed(a, b).tolist()
stats = kernels._tasks_changed.stats
print(json.dumps({"numba at import": numba_at_import, "folder": cache.cache_folder(), "changed": changed,
                  "hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values())}))
"""


@pytest.fixture(scope="module")
def place() -> Iterator[Path]:
    """A folder that every user can reach (pytest's own temporary folders are private to the
    user who runs the tests)."""
    folder = Path(tempfile.mkdtemp(prefix="ktframe-readonly-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


@pytest.fixture(scope="module")
def install(place: Path) -> Path:
    """The virtual environment holding the installed wheel, every file and folder of it read-only."""
    env_dir = place / "venv"
    install_wheel(build_wheel(place / "dist"), env_dir, reuse_packages=True)
    for folder, _, files in os.walk(env_dir):
        for path in [folder, *(os.path.join(folder, name) for name in files)]:
            if not os.path.islink(path):
                os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~0o222)
    return env_dir


def listing(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and folder under ``root``: its mode, size and modification time."""
    found = {}
    for folder, folders, files in os.walk(root):
        for name in [*folders, *files]:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            found[os.path.relpath(path, root)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def environment(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment with ``home`` as HOME and none of the settings that would move
    ktframe's or numba's files elsewhere or put the checkout on the path, then ``extra``."""
    moved = ("PYTHONPATH", "XDG_CACHE_HOME", "NUMBA_CACHE_DIR")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("KTFRAME_", "WANDB_")) and key not in moved}
    return {**env, "HOME": str(home), "KTFRAME_STRICT_PLUGINS": "1", **extra}


def run(command: list[str], env: dict[str, str], cwd: Path, *, as_nobody: bool) -> subprocess.CompletedProcess:
    """``command`` run to its end, which must be exit 0 without a traceback."""
    if as_nobody:
        command = [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *command]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stderr, f"{' '.join(command)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done


def probe(install: Path, env: dict[str, str], cwd: Path, *, as_nobody: bool = False) -> dict:
    return json.loads(run([str(install / "bin" / "python"), "-c", PROBE], env, cwd, as_nobody=as_nobody).stdout)


@pytest.mark.slow
@AS_ANOTHER_USER
def test_a_user_who_can_write_neither_the_install_nor_home_runs_every_command(install, place):
    home = place / "read-only-home"
    home.mkdir(mode=0o555)
    work = place / "work"
    work.mkdir()
    os.chown(work, NOBODY, NOBODY)
    (work / "points.csv").write_text("x,y\n" + "\n".join(f"{i % 7},{i % 5}" for i in range(40)) + "\n")
    before = {root: listing(root) for root in (install, home)}
    env = environment(home)

    seen = probe(install, env, work, as_nobody=True)
    assert seen == {"numba at import": False, "folder": None, "changed": [False, True, False], "hits": 0, "misses": 1}

    def ktframe(*args: str) -> subprocess.CompletedProcess:
        return run([str(install / "bin" / "ktframe"), *args], env, work, as_nobody=True)

    alone = {
        "help": ("--help",),
        "plugins": ("plugins", "--json"),
        "verify": ("verify", "--n", "200", "--k", "3", "--layers", "3", "--gamma", "inf", "--dtype", "float64", "--json"),
        "cluster": ("cluster", "points.csv", "--k", "3", "--out", "labels.csv"),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        started = {name: pool.submit(ktframe, *args) for name, args in alone.items()}
        ktframe(
            "fit",
            "name=w",
            f"root={work / 'runs'}",
            "trainer.max_steps=3",
            "trainer.val_every=2",
            "data.val_tasks=8",
            "logger.kind=csv",
            "trainer.progress_bar=false",
        )
        done = {name: future.result() for name, future in started.items()}
    evaluated = ktframe("eval", str(work / "runs" / "w" / "checkpoints" / "best.ckpt"), *SMALL_EVAL, "--json")

    assert "COMMAND" in done["help"].stdout
    assert json.loads(done["plugins"].stdout)["failures"] == []
    assert json.loads(done["verify"].stdout)["passed"]
    assert (work / "labels.csv").read_text().splitlines()[0] == "label"
    assert torch.load(work / "runs" / "w" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    assert json.loads(evaluated.stdout)["tasks"] == 8
    assert {root: listing(root) for root in (install, home)} == before


@pytest.mark.slow
def test_kernels_are_cached_in_the_users_cache_folder_only_and_reused(install, place):
    # Run by whoever runs the tests, root included: the install could be written, and is not.
    home = place / "home"
    home.mkdir()
    work = place / "elsewhere"
    work.mkdir()
    before = listing(install)
    env = environment(home)

    first = probe(install, env, work)
    cache = home / ".cache" / "ktframe" / "numba"
    assert first == {"numba at import": False, "folder": str(cache), "changed": [False, True, False], "hits": 0, "misses": 1}
    assert all(path == ".cache" or path.startswith(".cache/ktframe") for path in listing(home)), listing(home)
    (index,) = cache.glob("*/cpu._tasks_changed-*.nbi")
    second = probe(install, env, work)
    assert (second["hits"], second["misses"]) == (1, 0)

    # An entry that can be neither read nor written (a folder where its index would be): compiled instead.
    index.unlink()
    index.mkdir()
    unreadable = probe(install, env, work)
    assert (unreadable["changed"], unreadable["hits"], unreadable["misses"]) == ([False, True, False], 0, 1)
    index.rmdir()

    # KTFRAME_CACHE_DIR is the folder, wherever HOME is.
    cached = listing(home)
    explicit = place / "explicit"
    third = probe(install, environment(home, KTFRAME_CACHE_DIR=str(explicit)), work)
    assert (third["folder"], third["hits"], third["misses"]) == (str(explicit / "numba"), 0, 1)
    assert listing(home) == cached
    assert listing(install) == before
    assert listing(work) == {}


def test_the_cache_folder_is_ktframes_setting_else_xdgs_else_homes(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv(kernel_cache.CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert kernel_cache.cache_root() == str(tmp_path / "home" / ".cache" / "ktframe")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not a valid XDG setting: ignored
    assert kernel_cache.cache_root() == str(tmp_path / "home" / ".cache" / "ktframe")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache.cache_root() == str(tmp_path / "xdg" / "ktframe")
    monkeypatch.setenv(kernel_cache.CACHE_ENV, str(tmp_path / "mine"))
    assert kernel_cache.cache_root() == str(tmp_path / "mine")

    # The folder is made where it can be, else there is none (the undecorated function: this
    # process's own choice stays as it was made).
    assert kernel_cache.cache_folder.__wrapped__() == str(tmp_path / "mine" / "numba")
    assert (tmp_path / "mine" / "numba").is_dir()
    monkeypatch.setenv(kernel_cache.CACHE_ENV, str(tmp_path / "a-file" / "cache"))
    (tmp_path / "a-file").write_text("")
    assert kernel_cache.cache_folder.__wrapped__() is None


def test_a_kernel_declares_no_cache_of_its_own():
    with pytest.raises(TypeError, match="kernel\\(\\) decides caching itself"):
        jit.kernel(cache=True)
