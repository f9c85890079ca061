#!/usr/bin/env bash
# Every check that needs a CUDA device, in one run, with one JSON of figures at the end:
#   1. the tests that need CUDA (pytest -m cuda; elsewhere they skip);
#   2. a 2 000-step `paper` run in 32-true and in bf16-mixed precision (time per step, val metrics);
#   3. the exact-model benchmarks with --device cuda (lloyd_vs_sklearn.py, many_small_tasks.py).
# With --seeds, it then trains seeds 0-9 of `paper` and `paper-none` (a multirun each) and reports them.
# With --figures, it trains the paper's Figures 9 and 10 instead (the sweeps in the headers of
# configs/fig9.yaml and configs/fig10.yaml: 78 runs, eight at a time) and reports each beside its runs, and nothing else.
# With --seeds --figures, it trains seeds 3-9 of every setting of Figures 9 and 10 whose seeds 0-2 are in
# results/sweeps/ (168 runs; Figure 10a at k = 10 has its ten seeds in the paper presets'), so that
# each setting has the authors' ten, and nothing else ("Ten seeds on a GPU" below).
#
#   bash benchmarks/gpu.sh [OUT]                              # OUT defaults to gpu-results/; figures in OUT/gpu.json
#   bash benchmarks/gpu.sh OUT --seeds                        # also the twenty seed runs, into OUT/runs/
#   bash benchmarks/gpu.sh OUT --figures                      # the Figure 9 / 10 runs alone, into OUT/runs/, each sweep's report in its folder
#   bash benchmarks/gpu.sh OUT --seeds --figures              # seeds 3-9 of Figures 9 and 10, into OUT/runs/; run again, it goes on
#   bash benchmarks/gpu.sh OUT --seeds --figures --dry-run    # their plan, every run as ktframe's planner checks it; any machine
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-results}
SEEDS="" FIGURES="" DRY=""
for option in "${@:2}"; do
  case "$option" in
    --seeds) SEEDS=1 ;;
    --figures) FIGURES=1 ;;
    --dry-run) DRY=1 ;;
    *) echo "benchmarks/gpu.sh: unknown option $option; expected --seeds, --figures or --dry-run" >&2; exit 2 ;;
  esac
done
MODE=${SEEDS:+--seeds}${FIGURES:+--figures}  # both: --seeds--figures
if [ -n "$DRY" ] && [ "$MODE" != "--seeds--figures" ]; then
  echo "benchmarks/gpu.sh: --dry-run plans the runs of --seeds --figures; expected it with both" >&2; exit 2
fi
PY=${PYTHON:-python}

# Ten seeds on a GPU. Seeds 3-9 of each setting (the 2-core CPU ran seeds 0-2, docs/results.md), each run
# keeping its last checkpoint and evaluated when it ends as the authors evaluate (eval.checkpoint=last,
# eval.seed_per_run=true: each seed on tasks of its own). A run is 10 000 steps of a model of at most
# 23 000 weights (20-40 minutes on the 2-core CPU), launch-bound on a GPU: about 5 ms a step, so about
# 70 s a run alone (steps, 200 validations, the start) and about 95 s with 16 at once sharing the 16
# cores and the GPU; about 17 minutes for all 168, more than one lend (15 minutes, the start included,
# at most 10 a command). So the runs go in two parts: first the settings that the paper's Figure 10
# shows (Figure 10b, Figure 10a at k = 16 and 25, Figure 9 at lambda = 10: 84 runs, about 8 minutes),
# then the rest of Figure 9 (84 runs). The command stops by DEADLINE seconds (default 540): runs still
# going get SIGTERM, which saves their last checkpoint, and the same command run again goes on with
# them (resume=auto) and skips the finished ones.
TEN=(trainer.accelerator=gpu logger.kind=csv eval.after_fit=true eval.checkpoint=last eval.seed_per_run=true "eval.ns=[512]" "eval.inits=[random]"
  "trainer.seed=range(3,10)" resume=auto "root=$OUT/runs")
PART1=(
  "5 fig10b preset=fig10 data.k=6 data.d=8,16 model.embedding=onehot,none"
  "5 fig10a preset=fig10 data.k=16,25 model.embedding=onehot,none"
  "6 fig9-lambda10 preset=fig9 data.d=4,32 optim.loss_lambda=10.0 model.embedding=onehot,none"
)
PART2=("16 fig9-lambda1-7 preset=fig9 data.d=4,32 optim.loss_lambda=1.0,4.0,7.0 model.embedding=onehot,none")
PLAN='
import sys
from ktframe.learning.config import load_config
from ktframe.training.multirun import plan

part, jobs, name, *overrides = sys.argv[1:]
for job in plan(overrides, lambda: name).jobs:
    c = load_config(job.overrides)
    setting = f"preset={c.preset} n={c.data.n} d={c.data.d} k={c.data.k} lambda={c.optim.loss_lambda} embedding={c.model.embedding} steps={c.trainer.max_steps}"
    print(f"part {part} jobs {jobs} sweep {name} run {job.index}: {setting} seed={c.trainer.seed}")
'

if [ "$MODE" = "--seeds--figures" ]; then
  if [ -z "$DRY" ]; then
    $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'benchmarks/gpu.sh needs a CUDA device; torch sees none')"
    mkdir -p "$OUT"
  fi
  END=$(($(date +%s) + ${DEADLINE:-540}))
  export OMP_NUM_THREADS=1  # one core a run: the runs of a part's sweeps share the 16
  for part in 1 2; do
    declare -n sweeps="PART$part"
    for sweep in "${sweeps[@]}"; do
      read -r jobs name overrides <<<"$sweep"
      if [ -n "$DRY" ]; then  # every run the multirun would start, resolved and checked; nothing is written
        # shellcheck disable=SC2086
        $PY -c "$PLAN" "$part" "$jobs" "$name" $overrides "${TEN[@]}" "name=$name"
        continue
      fi
      left=$((END - $(date +%s)))
      [ "$left" -gt 60 ] || break
      # shellcheck disable=SC2086
      timeout --signal=TERM --kill-after=30 "$left" $PY -m ktframe.cli.main fit -m $overrides "${TEN[@]}" "name=$name" --jobs "$jobs" >>"$OUT/$name.log" 2>&1 &
    done
    wait || true
  done
  [ -n "$DRY" ] && exit 0
  for sweep in "${PART1[@]}" "${PART2[@]}"; do
    read -r _ name _ <<<"$sweep"
    echo "$name: $(grep -c '"status": "ok"' "$OUT/runs/$name/multirun.json" 2>/dev/null || echo 0) runs finished (log: $OUT/$name.log)"
  done
  exit 0
fi

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
