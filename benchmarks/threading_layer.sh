#!/bin/bash
# numba's threading layer for ktframe's kernels: workqueue (ktframe's choice, one OpenMP runtime in
# the process) against omp (numba's default, a second OpenMP runtime beside PyTorch's), taking
# turns round by round in one run; the ratios against scikit-learn are taken within each process.
#   bash benchmarks/threading_layer.sh [ROUNDS]
cd "$(dirname "$0")" || exit 1
for round in $(seq 1 "${1:-3}"); do
  for layer in workqueue omp; do
    echo "== round $round, NUMBA_THREADING_LAYER=$layer"
    NUMBA_THREADING_LAYER=$layer python lloyd_vs_sklearn.py --settings 50000,32,100 50000,2,16 --repeats 3 | grep -E "ktframe|scikit"
    NUMBA_THREADING_LAYER=$layer python many_small_tasks.py --tasks 256 --repeats 3 | grep -E "batched|loop"
  done
done
