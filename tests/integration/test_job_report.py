"""`gpuwatch job-report` against a daemon whose simulated Slurm job (81234, a rank on each GPU)
meets an XID and a NaN loss on GPU 1: both are in the report, under GPU 1 and no other."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import start_daemon, stop_daemon, wait_for

# The faults 5 s of wall time in (at twice real time): the simulated job, started once the
# daemon serves, has its processes on the GPUs by then however busy the machine.
SCENARIO = """\
name: xid-and-nan
node: {gpus: 4, model: H100, workload: training, seed: 1}
faults:
  - {kind: xid, gpu: 1, at: 10s, code: 13}
  - {kind: nan_loss, gpu: 1, at: 11s}
"""


def job_report(url: str, job: str, *flags: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "job-report", job, url, *flags],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def test_the_report_lists_the_xid_and_the_nan_for_the_right_gpu(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    daemon = start_daemon(tmp_path, "--simulate", str(scenario), "--speed", "2")
    try:

        def both() -> dict[str, Any] | None:
            code, out, err = job_report(daemon.url, "81234", "--json", "--strict")
            if code != 0:  # the job's processes are not on the GPUs yet
                assert code == 1 and "no job '81234'" in err, err
                return None
            report: dict[str, Any] = json.loads(out)
            gpu1 = report["gpus"][1]
            seen = gpu1["xids"] and any(a["alertname"] == "TrainingLossNaN" for a in gpu1["alerts"])
            return report if seen else None

        report = wait_for(both, timeout=30)
        assert (report["job_kind"], report["job_id"], report["running"]) == ("slurm", "81234", True)
        assert [g["index"] for g in report["gpus"]] == [0, 1, 2, 3]
        assert [x["xid"] for x in report["gpus"][1]["xids"]] == [13]
        for other in (report["gpus"][i] for i in (0, 2, 3)):
            assert (other["xids"], other["alerts"]) == ([], [])
        code, text, _ = job_report(daemon.url, "81234")
        lines = text.splitlines()
        assert code == 0 and lines[0].startswith("gpuwatch: Slurm job 81234 of ")
        assert f"since {report['start']}, still running, on 4 GPUs" in lines[0]
        assert "XID 13 at" in lines[2] and "TrainingLossNaN at" in lines[2], text
        assert lines[2].startswith("  GPU 1: ") and lines[1].startswith("  GPU 0: nothing wrong (")
        # Each GPU's memory peak and how busy it was, as the simulated training job ran it.
        assert re.search(
            r"memory peak [\d.]+ of 79\.6 GiB \(\d+%\), busy 9\d% on average", lines[1]
        )
        for gpu in report["gpus"]:
            assert (
                0.8 * gpu["memory_total_bytes"]
                < gpu["memory_peak_bytes"]
                < gpu["memory_total_bytes"]
            )
            assert gpu["utilization_mean"] is None or gpu["utilization_mean"] > 0.9
        assert not (tmp_path / "state" / "reports").exists()  # written as the job ends
        # A job gpuwatch never saw on a GPU is said so, and fails nothing unless asked to.
        code, out, err = job_report(daemon.url, "999")
        assert (code, out) == (0, "") and "no job '999' ran on this node's GPUs" in err
        assert job_report(daemon.url, "999", "--strict")[0] == 1
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
    code, out, err = job_report(daemon.url, "81234")  # no daemon there any more
    assert (code, out) == (0, "") and f"no report: {daemon.url} unreachable" in err, err
    assert job_report(daemon.url, "81234", "--strict")[0] == 3
