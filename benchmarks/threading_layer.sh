#!/bin/bash
# numba's threading layer for ktframe's kernels: tbb (ktframe's choice where numba's omp layer cannot
# run on PyTorch's OpenMP pool), workqueue (its last choice), workqueue with OMP_WAIT_POLICY=PASSIVE
# (PyTorch's idle OpenMP threads sleep instead of spinning on the cores the kernels need) and omp
# (ktframe's choice on Linux: the kernels on PyTorch's own pool), taking turns round by round in one
# run; the ratios against scikit-learn are taken within each process.
#   bash benchmarks/threading_layer.sh [ROUNDS]
cd "$(dirname "$0")" || exit 1
for round in $(seq 1 "${1:-3}"); do
  for setting in "NUMBA_THREADING_LAYER=tbb" "NUMBA_THREADING_LAYER=workqueue" "NUMBA_THREADING_LAYER=workqueue OMP_WAIT_POLICY=PASSIVE" "NUMBA_THREADING_LAYER=omp"; do
    echo "== round $round, $setting"
    env $setting python lloyd_vs_sklearn.py --settings 50000,32,100 50000,2,16 --repeats 3 | grep -E "ktframe|scikit"
    env $setting python many_small_tasks.py --tasks 256 --repeats 3 | grep -E "batched|loop"
  done
done
