"""Every command owns its outputs: report and gamma-sweep write into a folder of their own (or
refuse one that is not, naming --out and --force), and a result that standard output could not
take whole is an error, never exit 0."""

from __future__ import annotations

import hashlib
import resource
import signal
import subprocess
import sys
from pathlib import Path

from test_report import write_run
from test_training import cli_env, one_line_error, run_cli

CLUSTER_POINTS = "".join(f"{i % 7}.0,{i % 5}.0\n" for i in range(100_000))


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for seed in range(2):
        write_run(root / f"seed{seed}", {"val/ratio": 1.0 + seed}, None)
    return root


def test_report_writes_into_a_folder_of_its_own_and_keeps_a_hand_written_report(tmp_path):
    root = runs(tmp_path)
    (root / "report.md").write_text("my own notes\n")
    (root / "report.png").write_bytes(b"not ktframe's")
    before = hashes(root)
    done = run_cli(["report", str(root)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"written: {root / 'report' / 'report.json'}" in done.stdout
    after = hashes(root)
    assert {name: digest for name, digest in after.items() if not name.startswith("report/")} == before
    again = run_cli(["report", str(root)], tmp_path)
    assert one_line_error(again, "report") == (
        f"ktframe report: error: --out {root / 'report'}: holds an earlier ktframe report; expected another --out, or --force to replace its files"
    )
    assert hashes(root) == after
    assert run_cli(["report", str(root), "--force"], tmp_path).returncode == 0


def test_report_refuses_a_folder_it_did_not_make_and_force_removes_nothing_there(tmp_path):
    root = runs(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.png").write_bytes(b"a user's figure")
    (mine / "notes.txt").write_text("keep\n")
    before = hashes(mine)
    refused = run_cli(["report", str(root), "--out", str(mine)], tmp_path)
    assert one_line_error(refused, "report") == (
        f"ktframe report: error: --out {mine}: exists and holds files that ktframe report did not write; expected a new folder for --out, or --force to write there"
    )
    assert hashes(mine) == before
    forced = run_cli(["report", str(root), "--out", str(mine), "--force"], tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (mine / "notes.txt").read_text() == "keep\n" and (mine / "report.png").read_bytes() == b"a user's figure"


def _cluster(tmp_path: Path, **kwargs) -> subprocess.Popen:
    (tmp_path / "points.csv").write_text(CLUSTER_POINTS)
    return subprocess.Popen(
        [sys.executable, "-m", "ktframe.cli.main", "--quiet", "cluster", "points.csv", "--k", "3", "--variant", "lloyd"],
        cwd=tmp_path, env=cli_env(tmp_path), stderr=subprocess.PIPE, text=True, **kwargs,
    )  # fmt: skip


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_labels_cut_short_by_a_file_size_limit_are_an_error(tmp_path):
    with open(tmp_path / "labels.csv", "wb") as sink:
        proc = _cluster(tmp_path, stdout=sink, preexec_fn=_limit_file_size)
        _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 2, stderr
    assert stderr.splitlines() == ["ktframe cluster: error: could not write to standard output (File too large); expected a writable output"]


def test_labels_into_a_pipe_closed_early_are_an_error(tmp_path):
    proc = _cluster(tmp_path, stdout=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.wait(timeout=240)
    assert proc.returncode == 2, stderr
    assert stderr.splitlines() == ["ktframe cluster: error: could not write to standard output (Broken pipe); expected a writable output"]
