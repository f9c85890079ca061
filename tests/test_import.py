"""``import ktframe`` changes nothing in the host process: glibc's malloc thresholds stay glibc's
own (no ``mallopt``), and ``warnings.filters`` and the environment stay as they were, after the
import and after building and running a model; numba is imported only when a kernel first runs
(:mod:`ktframe.kernels.jit`). Checked in fresh processes. That the import writes no file is
``test_readonly_install.py``'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None

# glibc serves a request from mmap when it is at least the mmap threshold: 128 KiB to start with,
# raised by glibc itself (up to 32 MiB) each time a larger mmap'ed block is freed, unless a
# program sets the thresholds with mallopt, which also stops that adaptation. A block of 31 MiB is
# therefore mmap'ed (``hblkhd`` grows by it while it is held) with glibc's own thresholds, and
# taken from the heap once the thresholds are pinned at 32 MiB. Blocks are held, not freed, until
# the end, so that probing does not itself move the threshold; at the end one is freed and the
# same size asked for again: glibc's adaptation, still on, now serves it from the heap.
PROBE = """
import ctypes, json, sys, warnings

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
SIZE = 31 << 20
held = []

def mmapped() -> bool:
    before = libc.mallinfo2().hblkhd
    held.append(libc.malloc(SIZE))
    return libc.mallinfo2().hblkhd - before >= SIZE

import os
import torch, torchmetrics  # third-party imports first: what they do to the filters is theirs

seen = {"mmapped": {"before": mmapped()}, "filters": {}, "environ": {}}
filters = list(warnings.filters)
environ = dict(os.environ)
import ktframe
seen["numba at import"] = "numba" in sys.modules
from ktframe.learning import metrics
if "control" in sys.argv:  # what ktframe used to do on import: the probe must see it
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
    warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled", category=UserWarning)
seen["mmapped"]["after import"] = mmapped()
seen["filters"]["after import"] = warnings.filters == filters
seen["environ"]["after import"] = dict(os.environ) == environ

model = ktframe.build_model("lloyd", d=2, k=3, n_layers=2, gamma=float("inf"), dtype="float64")
X = torch.randn(2, 1 << 14, 2, dtype=torch.float64)  # large enough for the kernels (ktframe.kernels.jit.MIN_NUMBERS)
with torch.no_grad():
    result = model(X, X[:, :3].clone())
score = metrics.AdjustedRand()
score.update(X, result.centers, torch.randint(0, 3, (2, 1 << 14)))
score.compute()
seen["mmapped"]["after a model"] = mmapped()
seen["filters"]["after a model"] = warnings.filters == filters
seen["environ"]["after a model"] = dict(os.environ) == environ
seen["numba after a model"] = "numba" in sys.modules

libc.free(held.pop())
seen["adapts"] = not mmapped()
print(json.dumps(seen))
"""


def probe(*args: str) -> dict:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith("KTFRAME_") and key not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    }
    env["KTFRAME_STRICT_PLUGINS"] = "1"
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_import_and_a_model_leave_malloc_and_warnings_as_they_were():
    seen = probe()
    assert seen["mmapped"] == {"before": True, "after import": True, "after a model": True}
    assert seen["adapts"]  # glibc still adapts its threshold: nobody called mallopt
    assert seen["filters"] == {"after import": True, "after a model": True}
    assert seen["environ"] == {"after import": True, "after a model": True}
    assert not seen["numba at import"] and seen["numba after a model"]  # the model ran the kernels


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_the_probe_sees_pinned_thresholds_and_a_global_filter():
    seen = probe("control")
    assert seen["mmapped"] == {"before": True, "after import": False, "after a model": False}
    assert seen["filters"] == {"after import": False, "after a model": False}
