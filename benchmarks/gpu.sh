#!/usr/bin/env bash
# Every check that needs a CUDA device, in one run, with one JSON of figures at the end:
#   1. the tests that need CUDA (pytest -m cuda; elsewhere they skip);
#   2. a 2 000-step `paper` run in 32-true and in bf16-mixed precision (time per step, val metrics);
#   3. the exact-model benchmarks with --device cuda (lloyd_vs_sklearn.py, many_small_tasks.py).
# With --seeds, it then trains seeds 0-9 of `paper` and `paper-none` (a multirun each) and reports them.
# With --figures, it trains the paper's Figures 9 and 10 instead (the sweeps in the headers of
# configs/fig9.yaml and configs/fig10.yaml: 78 runs, eight at a time) and reports each beside its runs, and nothing else.
#
#   bash benchmarks/gpu.sh [OUT]            # OUT defaults to gpu-results/; figures in OUT/gpu.json
#   bash benchmarks/gpu.sh OUT --seeds      # also the twenty seed runs, into OUT/runs/
#   bash benchmarks/gpu.sh OUT --figures    # the Figure 9 / 10 runs alone, into OUT/runs/, each sweep's report in its folder
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-results}
MODE=${2:-}
case "$MODE" in
  "" | --seeds | --figures) ;;
  *) echo "benchmarks/gpu.sh: unknown option $MODE; expected --seeds or --figures" >&2; exit 2 ;;
esac
PY=${PYTHON:-python}
mkdir -p "$OUT"
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'benchmarks/gpu.sh needs a CUDA device; torch sees none')"
$PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/device.txt"

if [ "$MODE" = "--figures" ]; then
  # The same runs as docs/results.md gives for the CPU (resume=auto: a rerun skips the finished ones).
  GPU=(trainer.accelerator=gpu logger.kind=csv eval.after_fit=true "eval.ns=[512]" "eval.inits=[random]" resume=auto root="$OUT/runs" --jobs 8)
  $PY -m ktframe.cli.main fit -m preset=fig9 data.d=4,32 optim.loss_lambda=1.0,4.0,7.0,10.0 model.embedding=onehot,none "trainer.seed=range(0,3)" name=fig9 "${GPU[@]}" 2>&1 | tail -n 5
  $PY -m ktframe.cli.main fit -m preset=fig10 data.k=10,16,25 model.embedding=onehot,none "trainer.seed=range(0,3)" name=fig10a "${GPU[@]}" 2>&1 | tail -n 5
  $PY -m ktframe.cli.main fit -m preset=fig10 data.k=6 data.d=8,16 model.embedding=onehot,none "trainer.seed=range(0,3)" name=fig10b "${GPU[@]}" 2>&1 | tail -n 5
  $PY -m ktframe.cli.main report "$OUT/runs/fig9" --by data.d,optim.loss_lambda,model.embedding 2>&1 | tail -n 3
  $PY -m ktframe.cli.main report "$OUT/runs/fig10a" --by data.k,model.embedding 2>&1 | tail -n 3
  $PY -m ktframe.cli.main report "$OUT/runs/fig10b" --by data.d,model.embedding 2>&1 | tail -n 3
  exit 0
fi

$PY -m pytest -m cuda -n 0 -q -p no:cacheprovider tests 2>&1 | tee "$OUT/tests.txt"

for precision in 32-true bf16-mixed; do
  start=$(date +%s.%N)
  $PY -m ktframe.cli.main fit preset=paper name="paper-2000-$precision" root="$OUT/runs" trainer.max_steps=2000 \
    trainer.accelerator=gpu trainer.precision="$precision" trainer.progress_bar=false logger.kind=csv 2>&1 | tail -n 3 | tee "$OUT/fit-$precision.txt"
  echo "$start $(date +%s.%N)" > "$OUT/fit-$precision.time"
done

$PY benchmarks/lloyd_vs_sklearn.py --device cuda 2>&1 | tee "$OUT/lloyd_vs_sklearn.txt"
$PY benchmarks/many_small_tasks.py --device cuda 2>&1 | tee "$OUT/many_small_tasks.txt"

if [ "$MODE" = "--seeds" ]; then
  for preset in paper paper-none; do
    $PY -m ktframe.cli.main fit -m preset=$preset "trainer.seed=range(0,10)" root="$OUT/runs" name="$preset-seeds" \
      trainer.accelerator=gpu trainer.progress_bar=false logger.kind=csv eval.after_fit=true --jobs 2 2>&1 | tail -n 5
    $PY -m ktframe.cli.main report "$OUT/runs/$preset-seeds" --out "$OUT/$preset-seeds" 2>&1 | tail -n 3
  done
fi

$PY - "$OUT" <<'EOF'
import json, re, sys
from pathlib import Path

out = Path(sys.argv[1])
figures = {"device": (out / "device.txt").read_text().strip(), "tests": (out / "tests.txt").read_text().strip().splitlines()[-1]}
for precision in ("32-true", "bf16-mixed"):
    start, end = map(float, (out / f"fit-{precision}.time").read_text().split())
    summary = json.loads((out / "runs" / f"paper-2000-{precision}" / "summary.json").read_text())
    figures[f"paper 2000 steps {precision}"] = {
        "seconds": round(end - start, 1),
        "ms_per_step_with_validation": round((end - start) / 2000 * 1e3, 2),
        "val_ratio": summary["metrics"].get("val/ratio"),
        "val_log_objective": summary["metrics"].get("val/log_objective"),
    }
for name in ("lloyd_vs_sklearn", "many_small_tasks"):
    text = (out / f"{name}.txt").read_text()
    figures[name] = [line.strip() for line in text.splitlines() if re.search(r"ms|x faster|x\b", line)]
(out / "gpu.json").write_text(json.dumps(figures, indent=2))
print(f"figures: {out / 'gpu.json'}")
EOF
