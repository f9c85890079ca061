"""One training step of ``ktframe fit preset=paper`` against the authors' research script
(``train.py`` of github.com/rithram/kmeans-trf) at the paper's setting, in one run, as a ratio.

    git clone https://github.com/rithram/kmeans-trf /tmp/kmeans-trf
    python benchmarks/train_step_vs_authors.py /tmp/kmeans-trf     # 2 rounds of 170 steps each

Both programs run as they are, each in its own process, taking turns round by round: ktframe as
``ktframe fit preset=paper`` (32 tasks of n = 512, d = 32, k = 10, one-hot tokens, four softmax
heads, attention dropout 0.01, softmin bound with λ = 10, Adam, float32), the authors' ``train.py``
with the arguments of their ``expt-run.sh`` at the same setting. The authors' code needs pandas and
matplotlib (``pip install .[bench]``); its validation helper moves tasks to ``"cuda"`` whether or
not there is one, so on a machine without CUDA the harness keeps them on the CPU (``Tensor.to`` with
``"cuda"`` returns the tensor itself; no training step of theirs moves anything). A step is timed from the end of one optimizer step to the
end of the next (``torch.optim.Adam.step`` is wrapped in the child process before the program
starts): it holds the drawing of the batch, the forward and backward passes and the update. The
first ``--warmup`` steps are left out, and validation is set to run only before the first and
after the last timed step. The figure is the median over every timed step of every round. Not a
test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Runs a program with torch.optim.Adam.step wrapped to record when each step ends; writes the
# times (a JSON list) to argv[1] at exit. argv[2] is "ktframe" or the path of the authors' train.py.
HARNESS = """
import atexit, json, runpy, sys, time
import torch
out, program, args = sys.argv[1], sys.argv[2], sys.argv[3:]
ends = []
step = torch.optim.Adam.step
def timed(self, *a, **k):
    result = step(self, *a, **k)
    ends.append(time.perf_counter())
    return result
torch.optim.Adam.step = timed
atexit.register(lambda: open(out, "w").write(json.dumps(ends)))
if program == "ktframe":
    from ktframe.cli.main import main
    sys.exit(main(["fit", *args]))
if not torch.cuda.is_available():  # the authors' validation helper moves its tasks to "cuda" unconditionally
    to = torch.Tensor.to
    torch.Tensor.to = lambda self, *a, **k: self if a[:1] == ("cuda",) else to(self, *a, **k)
sys.argv = [program, *args]
sys.path.insert(0, str(__import__("pathlib").Path(program).parent))
runpy.run_path(program, run_name="__main__")
"""


def ktframe_args(steps: int, root: str) -> list[str]:
    return ["preset=paper", f"trainer.max_steps={steps}", f"trainer.val_every={steps}", "logger.kind=none", "trainer.progress_bar=false", f"root={root}"]


def authors_args(steps: int) -> list[str]:
    """The arguments of the authors' expt-run.sh at the paper's setting (N = 512, d = 32, k = 10,
    learning rate 0.01, loss temperature 10, one-hot scratch space)."""
    return (
        "--nlb 512 --nub 512 --nclusters 10 --ndims 32 --train_dists normal --scale 0.1 --em --es --sdb "
        "--scratch onehot --dqkv 1 --attn_act softmax --attn_itemp 1.0 --loss_act softmax --loss_itemp 10 "
        f"--seed 548977 --bsz 32 --init_lr 0.01 --lr_decay 0.5 --patience 5 --nsteps {steps} --nsteps_per_eval {steps - 1} --val_nbatches 10"
    ).split()


def step_times(program: str, args: list[str], cwd: str) -> list[float]:
    """The seconds between consecutive optimizer steps of one run of ``program``."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        done = subprocess.run([sys.executable, "-c", HARNESS, out.name, program, *args], cwd=cwd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{Path(program).name} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        ends = json.loads(Path(out.name).read_text())
    return [b - a for a, b in zip(ends, ends[1:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("authors", type=Path, help="a checkout of github.com/rithram/kmeans-trf")
    parser.add_argument("--steps", type=int, default=170, help="training steps per run (default: 170)")
    parser.add_argument("--warmup", type=int, default=10, help="first steps of each run left out (default: 10)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each program, taking turns (default: 2)")
    args = parser.parse_args()
    train_py = args.authors / "train.py"
    if not train_py.is_file():
        sys.exit(f"no train.py in {args.authors}; expected a checkout of github.com/rithram/kmeans-trf")

    import torch

    print(f"machine: {os.uname().machine}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads; torch {torch.__version__}")
    print(f"paper setting: 32 tasks, n=512, d=32, k=10, float32; {args.rounds} rounds of {args.steps} steps, the first {args.warmup} of each left out")
    timed: dict[str, list[float]] = {"ktframe fit": [], "authors' train.py": []}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for name, program, program_args in (
                ("authors' train.py", str(train_py.resolve()), authors_args(args.steps)),
                ("ktframe fit", "ktframe", ktframe_args(args.steps, scratch)),
            ):
                times = step_times(program, program_args, scratch)[args.warmup : -1]  # the last interval holds a validation
                timed[name] += times
                print(f"  round {round_ + 1} {name:18s} median {statistics.median(times) * 1e3:8.1f} ms/step over {len(times)} steps")
    for name, times in timed.items():
        print(f"{name:20s} {statistics.median(times) * 1e3:8.1f} ms/step (median of {len(times)} steps)")
    ours, theirs = (statistics.median(timed[name]) for name in ("ktframe fit", "authors' train.py"))
    print(f"ktframe is {theirs / ours:.2f}x faster per step")


if __name__ == "__main__":
    main()
