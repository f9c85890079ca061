"""One OpenMP pool in a process: PyTorch's. On Linux ktframe's numba kernels run in numba's omp
layer, whose OpenMP calls bind to the libgomp that PyTorch put in the process's global scope, so
that the kernels' work runs on PyTorch's own threads; read here off /proc/self/maps and
/proc/self/task in fresh processes that fit the estimator and take a training step. A layer the
user chose is kept, and a child forked after a fit fits (on PyTorch's operations: numba would end
it at its first kernel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps (Linux)")

PROBE = r"""
import ctypes, json, os, threading
import numpy as np, torch

def ticks(thread):
    try:
        fields = open(f"/proc/self/task/{thread}/stat").read().rsplit(")", 1)[1].split()
    except FileNotFoundError:  # a thread that has ended
        return 0
    return int(fields[11]) + int(fields[12])

def threads():
    return {int(t) for t in os.listdir("/proc/self/task")}

main = threading.get_native_id()
torch.ones(1 << 22).sum()  # PyTorch's pool starts
pytorch = threads() - {main}
import ktframe
X = np.random.default_rng(0).random((50000, 8))
ktframe.TransformerKMeans(n_clusters=10, random_state=0).fit(X)  # the arg-max and update kernels
model = ktframe.build_model("learned", d=8, k=10, n_layers=1)
Xt = torch.rand(4, 64, 8)
model(Xt, Xt[:, :10]).centers.sum().backward()  # a training step's forward and backward
# two threads fitting at once: the kernels take one launch at a time, the process goes on
fits = [threading.Thread(target=lambda: ktframe.TransformerKMeans(n_clusters=10, random_state=1).fit(X)) for _ in range(2)]
[t.start() for t in fits]; [t.join() for t in fits]
# where the kernels' work runs: CPU time of PyTorch's threads and of any other during more fits
others = threads() - pytorch - {main}  # those still running: the fitting threads have ended
before = {t: ticks(t) for t in pytorch | others}
for seed in range(10):
    ktframe.TransformerKMeans(n_clusters=10, n_init=1, init="random", random_state=seed, tol=0.0).fit(X)
import numba
maps = [line.split() for line in open("/proc/self/maps")]
openmp = sorted({m[-1] for m in maps if "libgomp" in m[-1].rsplit("/", 1)[-1] or "libiomp" in m[-1]})
address = ctypes.cast(ctypes.CDLL(None).GOMP_parallel, ctypes.c_void_p).value
bound = [m[-1] for m in maps if int(m[0].split("-")[0], 16) <= address < int(m[0].split("-")[1], 16)]
print(json.dumps({
    "openmp": openmp, "layer": numba.threading_layer(), "GOMP_parallel": bound[0],
    "pytorch_ticks": sum(max(0, ticks(t) - before[t]) for t in pytorch), "other_ticks": sum(max(0, ticks(t) - before[t]) for t in others),
    "torch_threads": torch.get_num_threads(), "own_pool": ktframe.core.host._kernels_own_pool,
}))
"""

# A fit, then a child forked as a DataLoader worker is (PyTorch on one thread there: GNU OpenMP's
# pool, PyTorch's own, does not survive a fork), which fits the same points again.
FORKED = r"""
import json, os
import numpy as np, torch
import ktframe
from ktframe.kernels import cpu
X = np.random.default_rng(0).random((20000, 8))
labels = ktframe.TransformerKMeans(n_clusters=10, random_state=0).fit(X).labels_
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    torch.set_num_threads(1)
    again = ktframe.TransformerKMeans(n_clusters=10, random_state=0).fit(X).labels_
    os.write(write, json.dumps({"same": bool((again == labels).all()), "kernels": cpu.eligible(torch.zeros(1))}).encode())
    os._exit(0)
os.close(write)
status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
import numba
print(json.dumps({"child": status, "seen": json.loads(os.read(read, 1000) or b"null"), "layer": numba.threading_layer(), "kernels": cpu.eligible(torch.zeros(1))}))
"""


def probe(script: str = PROBE, **env: str) -> dict:
    environ = {**{k: v for k, v in os.environ.items() if k not in ("NUMBA_THREADING_LAYER", "PYTHONPATH")}, "OMP_NUM_THREADS": "2", **env}
    done = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_the_kernels_run_on_pytorchs_openmp_pool():
    seen = probe()
    assert seen["layer"] == "omp"
    torch_libgomp = [path for path in seen["openmp"] if "torch" in path]
    assert len(torch_libgomp) == 1, seen["openmp"]
    # numba's OpenMP calls bind to the global scope's GOMP_parallel: PyTorch's
    assert seen["GOMP_parallel"] == torch_libgomp[0], seen
    # the one other copy numba loads (the system's libgomp) runs no thread: the kernels' second
    # thread is PyTorch's, and no thread that came after PyTorch's pool does any work
    assert len(seen["openmp"]) <= 2, seen["openmp"]
    assert seen["pytorch_ticks"] >= 20 and seen["other_ticks"] <= 2, seen
    assert seen["torch_threads"] == 2  # starting the layer left PyTorch's thread count as it was
    assert not seen["own_pool"]  # so the host makes its arrays with PyTorch, whose threads are the kernels'


@pytest.mark.slow
def test_a_threading_layer_the_user_chose_is_kept():
    seen = probe(NUMBA_THREADING_LAYER="tbb")
    assert seen["layer"] == "tbb"
    assert len(seen["openmp"]) == 1 and "torch" in seen["openmp"][0], seen["openmp"]
    assert seen["other_ticks"] >= 20, seen  # TBB's own pool: a second one beside PyTorch's
    assert seen["torch_threads"] == 2
    assert seen["own_pool"]  # so the host spares PyTorch's threads


@pytest.mark.parametrize("layer", ["default", pytest.param("tbb", marks=pytest.mark.slow)])
def test_a_child_forked_after_a_fit_fits_alike(layer):
    seen = probe(FORKED, NUMBA_THREADING_LAYER=layer)
    assert seen["child"] == 0 and seen["seen"]["same"], seen
    assert seen["kernels"]  # the parent's kernels are as they were
    # in the omp layer the child takes PyTorch's operations, in tbb its kernels
    assert seen["seen"]["kernels"] == (seen["layer"] != "omp"), seen
