"""Cell by cell, how far ktframe's temperature sweep and the authors' published one agree: per gamma,
the Pearson and the rank (Spearman) correlation of the two sides' delta over the cells both hold,
the spread of their differences and the largest ones, with where they are. From the repository root:

    git -C kmeans-trf show HEAD:results/klic_parameter_sweep.csv > klic_parameter_sweep.csv
    python results/gamma-sweep-paper/cells.py klic_parameter_sweep.csv > results/gamma-sweep-paper/gamma-sweep-cells.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy import stats

from ktframe.experiments.gamma_sweep import read_csv, read_other

HERE = Path(__file__).resolve().parent


def cell(row: dict) -> tuple:
    """A row's cell as read_other keys the authors' sweep."""
    return (row["k"], row["d"], row["n"], row["scale"], row["gamma"])


def main(authors: Path) -> None:
    rows = read_csv(HERE / "gamma-sweep.csv")
    other = read_other(authors)
    print("# gamma-sweep: cell by cell against klic_parameter_sweep.csv\n")
    print("delta = the soft construction's log objective minus Lloyd's after 10 steps, on each side's own random task of the cell.\n")
    print("| gamma | cells | Pearson | rank (Spearman) | median abs. difference | 99th percentile | cells > 0.5 apart | of them at d = 1 | largest |")
    print("|---|---|---|---|---|---|---|---|---|")
    largest = []
    for gamma in sorted({row["gamma"] for row in rows}):
        pairs = [(row, other[cell(row)]) for row in rows if row["gamma"] == gamma and cell(row) in other]
        ours, theirs = np.array([row["delta"] for row, _ in pairs]), np.array([value for _, value in pairs])
        gap = np.abs(ours - theirs)
        far = np.flatnonzero(gap > 0.5)
        at_d1 = sum(pairs[i][0]["d"] == 1 for i in far)
        print(
            f"| {gamma:g} | {len(pairs)} | {stats.pearsonr(ours, theirs)[0]:.3f} | {stats.spearmanr(ours, theirs)[0]:.3f} | {np.median(gap):.4f} "
            f"| {np.percentile(gap, 99):.3f} | {len(far)} | {at_d1} | {gap.max():.3f} |"
        )
        largest += [(gap[i], gamma, pairs[i][0], ours[i], theirs[i]) for i in np.argsort(-gap)[:3]]
    print("\nThe three largest differences at each gamma:\n")
    print("| gamma | k | d | n | scale | delta, ktframe | delta, authors |")
    print("|---|---|---|---|---|---|---|")
    for _, gamma, row, ours, theirs in largest:
        print(f"| {gamma:g} | {row['k']} | {row['d']} | {row['n']} | {row['scale']} | {ours:+.3f} | {theirs:+.3f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
