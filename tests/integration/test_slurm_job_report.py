"""`gpuwatch job-report` where the docs put it, run by a real Slurm: as a batch script's last
command for a job that never touched a GPU (most of a cluster's jobs), and with no daemon at
all, the job still ends COMPLETED 0:0; as the node's Epilog, slurmd does not drain the node
for it."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import start_daemon, stop_daemon, wait_for
from tests.slurm_server import Slurm, needs_slurm, program, start_slurm

pytestmark = needs_slurm


def _job_report_script(path: Path, url: str) -> Path:
    """What a user writes: the job's work, then the report (here with this checkout's
    Python: slurmd gives a job the submitter's environment, a virtualenv's PATH included)."""
    path.write_text(
        "#!/bin/sh\n"
        "echo working on the CPU\n"
        f'{sys.executable} -m gpuwatch job-report "$SLURM_JOB_ID" {url}\n'
    )
    path.chmod(0o755)
    return path


def _submit(slurm: Slurm, script: Path, out: Path) -> str:
    submitted = slurm.run(
        program("sbatch"), "--parsable", f"--output={out}", f"--chdir={out.parent}", str(script)
    )
    return submitted.strip().split(";")[0]


def _ended(slurm: Slurm, job: str) -> dict[str, str] | None:
    """JobState and ExitCode once the job has ended, as scontrol shows them."""
    shown = slurm.run(program("scontrol"), "show", "job", job)
    fields = dict(t.partition("=")[::2] for t in shown.split() if "=" in t)
    if fields.get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        return None
    return {"JobState": fields["JobState"], "ExitCode": fields["ExitCode"]}


def test_the_report_fails_no_job_and_drains_no_node_for_what_it_did_not_see(
    tmp_path: Path,
) -> None:
    daemon = start_daemon(tmp_path / "d", "--simulate", "healthy")
    epilog = tmp_path / "epilog"
    # As slurmd runs an Epilog: root, no PATH, the job's id in the environment.
    epilog.write_text(
        f'#!/bin/sh\nexec {sys.executable} -m gpuwatch job-report "$SLURM_JOB_ID" {daemon.url}\n'
    )
    epilog.chmod(0o755)
    slurm = start_slurm(tmp_path / "slurm", f"Epilog={epilog}")
    try:
        script = _job_report_script(tmp_path / "job.sh", daemon.url)
        out = tmp_path / "job.out"
        job = _submit(slurm, script, out)
        assert wait_for(lambda: _ended(slurm, job), timeout=60) == {
            "JobState": "COMPLETED",
            "ExitCode": "0:0",
        }, slurm.log()
        said = out.read_text()
        assert "working on the CPU" in said
        assert f"gpuwatch: no report: {daemon.url}: no job '{job}' ran on this node's GPUs" in said
        assert "DRAIN" not in slurm.node()["State"], slurm.node()
        assert stop_daemon(daemon) == 0, daemon.log()

        # No daemon at all (stopped, restarting): the job and the node fare the same.
        job = _submit(slurm, script, out)
        assert wait_for(lambda: _ended(slurm, job), timeout=60) == {
            "JobState": "COMPLETED",
            "ExitCode": "0:0",
        }, slurm.log()
        assert f"gpuwatch: no report: {daemon.url} unreachable" in out.read_text()
        assert "DRAIN" not in slurm.node()["State"], slurm.node()
        assert "epilog failed" not in (tmp_path / "slurm" / "slurmd.log").read_text()
    finally:
        if daemon.proc.poll() is None:
            stop_daemon(daemon)
        slurm.stop()


def test_a_strict_report_would_have_failed_the_job(tmp_path: Path) -> None:
    """The same job with --strict: the job fails, which is why it is not the default."""
    slurm = start_slurm(tmp_path / "slurm")
    try:
        script = tmp_path / "job.sh"
        script.write_text(
            f'#!/bin/sh\n{sys.executable} -m gpuwatch job-report --strict "$SLURM_JOB_ID" '
            "127.0.0.1:9\n"
        )
        script.chmod(0o755)
        job = _submit(slurm, script, tmp_path / "job.out")
        ended = wait_for(lambda: _ended(slurm, job), timeout=60)
        assert ended == {"JobState": "FAILED", "ExitCode": "3:0"}, slurm.log()
    finally:
        slurm.stop()
