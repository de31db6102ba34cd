"""The Slurm files gpuwatch ships, installed by `make slurm-files` as on a GPU host: run by a
real slurmd, which gives them no PATH, the health check drains a node gpuwatch cannot be asked
about; run as slurmd runs them (root, SLURMD_NODENAME alone), it resumes the node once
gpuwatch answers healthy and drains it when a GPU is lost, and the prolog refuses a job only
on an unhealthy node."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import bcrypt

from tests.conftest import start_daemon, stop_daemon, wait_for
from tests.slurm_server import NODE, needs_slurm, start_slurm

pytestmark = needs_slurm
ROOT = Path(__file__).resolve().parents[2]
# Healthy for 12 s: time for the daemon to start and the check and the prolog to run once
# each (a Python process apiece) before the fault, however busy the machine.
SCENARIO = """\
name: fall-off
node: {gpus: 2, model: H100, workload: training, seed: 1}
faults:
  - {kind: fall_off_bus, gpu: 1, at: 12s}
"""


def install(libexec: Path, state_dir: Path, conf: Path) -> None:
    """`make slurm-files` with this checkout's gpuwatch (the virtualenv's) as the install, and
    the test cluster's slurm.conf."""
    prefix = Path(sys.executable).parent.parent
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(ROOT),
            "slurm-files",
            f"PREFIX={prefix}",
            f"LIBEXECDIR={libexec}",
            f"GPUWATCH_STATE_DIR={state_dir}",
            f"SLURM_CONF_FILE={conf}",
        ],
        check=True,
        timeout=30,
    )


def basic_auth(tmp_path: Path) -> Path:
    """A web config asking every reader of the listener for a password."""
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yaml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    return web


def test_the_health_check_and_prolog_act_on_the_verdict_under_slurmd(tmp_path: Path) -> None:
    libexec = tmp_path / "libexec"
    install(libexec, tmp_path / "d" / "state", tmp_path / "slurm" / "slurm.conf")
    Path(f"/run/gpuwatch-healthcheck-missed-{NODE}").unlink(missing_ok=True)  # a past run's

    def run(name: str) -> subprocess.CompletedProcess[str]:
        """The file as slurmd runs it: as root, its environment the node's name (and the
        job's id for a prolog) and nothing else, no PATH."""
        env = {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "4242"}
        return subprocess.run(
            [str(libexec / name)], env=env, capture_output=True, text=True, timeout=30, check=False
        )

    check = f"HealthCheckProgram={libexec}/gpuwatch-healthcheck\nHealthCheckInterval=1"
    slurm = start_slurm(tmp_path / "slurm", check)
    try:
        # No daemon yet: gpuwatch cannot be asked twice running, and the node is drained.
        wait_for(lambda: "DRAIN" in slurm.node()["State"], timeout=30)
        unreachable = "gpuwatch health: unreachable: cannot reach the daemon on "
        assert slurm.node()["Reason"].startswith(unreachable), slurm.node()["Reason"]
        assert run("gpuwatch-prolog").returncode == 0  # the job runs: the check deals with it
        scenario = tmp_path / "scenario.yaml"
        scenario.write_text(SCENARIO)
        # Behind a password: the scripts ask the control socket, not the listener.
        daemon = start_daemon(
            tmp_path / "d", "--simulate", str(scenario), "--web-config", str(basic_auth(tmp_path))
        )
        try:
            # Healthy: the check takes back its own drain; the prolog lets jobs start.
            assert run("gpuwatch-healthcheck").returncode == 0
            assert "DRAIN" not in slurm.node()["State"]
            assert run("gpuwatch-prolog").returncode == 0
            # GPU 1 falls off the bus: the prolog refuses jobs, the check drains (run as
            # slurmd runs it: slurmd's own runs start only some 12 s after it does).
            refused = wait_for(lambda: (r := run("gpuwatch-prolog")).returncode == 1 and r)
            assert refused.stderr.startswith(
                f"gpuwatch: not starting job 4242 on {NODE}: unhealthy: GPU 1 is lost"
            )
            assert run("gpuwatch-healthcheck").returncode == 0
            assert "DRAIN" in slurm.node()["State"]
            reason = slurm.node()["Reason"]
            assert reason.startswith("gpuwatch health: unhealthy: GPU 1 is lost"), reason
        finally:
            assert stop_daemon(daemon) == 0, daemon.log()
    finally:
        slurm.stop()
