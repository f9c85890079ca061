"""One OpenMP runtime in a process: PyTorch's. ktframe's numba kernels run in numba's tbb layer
(numba's own workqueue pool where the ``tbb`` distribution is missing) unless the user chose a
layer, read here off /proc/self/maps in fresh processes that fit the estimator and take a training
step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps (Linux)")

PROBE = r"""
import json, threading
import numpy as np, torch
import ktframe
X = np.random.default_rng(0).random((20000, 8))
ktframe.TransformerKMeans(n_clusters=10, random_state=0).fit(X)  # the arg-max and update kernels
model = ktframe.build_model("learned", d=8, k=10, n_layers=1)
Xt = torch.rand(4, 64, 8)
model(Xt, Xt[:, :10]).centers.sum().backward()  # a training step's forward and backward
# two threads fitting at once: the kernels take one launch at a time, the process goes on
fits = [threading.Thread(target=lambda: ktframe.TransformerKMeans(n_clusters=10, random_state=1).fit(X)) for _ in range(2)]
[t.start() for t in fits]; [t.join() for t in fits]
import numba
maps = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line.rsplit("/", 1)[-1] or "libiomp" in line})
print(json.dumps({"openmp": maps, "layer": numba.threading_layer()}))
"""


def probe(**env: str) -> dict:
    environ = {**{k: v for k, v in os.environ.items() if k not in ("NUMBA_THREADING_LAYER", "PYTHONPATH")}, "OMP_NUM_THREADS": "2", **env}
    done = subprocess.run([sys.executable, "-c", PROBE], env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_a_fit_and_a_training_step_load_one_openmp_runtime():
    seen = probe()
    assert seen["layer"] == "tbb"
    assert len(seen["openmp"]) == 1 and "torch" in seen["openmp"][0], seen["openmp"]


@pytest.mark.slow
def test_without_tbb_the_kernels_run_in_numbas_own_pool(tmp_path):
    # A ``tbb`` distribution that holds no library, found first on the path, stands for none.
    (tmp_path / "tbb-2099.0.dist-info").mkdir()
    (tmp_path / "tbb-2099.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tbb\nVersion: 2099.0\n")
    (tmp_path / "tbb-2099.0.dist-info" / "RECORD").write_text("")
    seen = probe(PYTHONPATH=str(tmp_path))
    assert seen["layer"] == "workqueue"
    assert len(seen["openmp"]) == 1 and "torch" in seen["openmp"][0], seen["openmp"]


@pytest.mark.slow
def test_a_threading_layer_the_user_chose_is_kept():
    seen = probe(NUMBA_THREADING_LAYER="omp")
    assert seen["layer"] == "omp"
    assert len(seen["openmp"]) == 2, seen["openmp"]  # the user's choice, with its second runtime
