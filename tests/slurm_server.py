"""A real single-node Slurm for integration tests (Debian's slurmctld, slurmd and munge): its
own munge key and socket, its own ports and spool, in a temporary directory; nothing of the
machine's Slurm or munge is touched.

The partition has the real node (`gw1`, with a slurmd) and three that never answer, so a
test can drain some of them to see the circuit breaker count a partition.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.prometheus_server import free_port

PROGRAMS = ("slurmctld", "slurmd", "munged", "scontrol", "sinfo")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")

needs_slurm = pytest.mark.skipif(
    any(shutil.which(p, path=os.pathsep.join(SBIN)) is None for p in PROGRAMS)
    and not os.environ.get("GPUWATCH_REQUIRE_TOOLS"),
    reason="Slurm not installed (Debian packages 'slurmctld', 'slurmd', 'slurm-client', 'munge')",
)
NODE = "gw1"
OTHERS = ("gw2", "gw3", "gw4")
PARTITION = "gpu"


def program(name: str) -> str:
    found = shutil.which(name, path=os.pathsep.join(SBIN))
    assert found is not None, f"{name} is not installed"
    return found


@dataclass
class Slurm:
    directory: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *args: str) -> str:
        done = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            env={**os.environ, **self.env},
        )
        assert done.returncode == 0, f"{args}: {done.stderr}"
        return done.stdout

    def node(self, name: str = NODE) -> dict[str, str]:
        """What scontrol says of the node: State and Reason (the reason without its
        [user@time] suffix)."""
        out = self.run(program("scontrol"), "show", "node", name)
        fields: dict[str, str] = {}
        for raw in out.splitlines():
            line = raw.strip()
            if line.startswith("Reason="):
                fields["Reason"] = line[len("Reason=") :].rsplit(" [", 1)[0]
                continue
            for token in line.split():
                key, _, value = token.partition("=")
                fields.setdefault(key, value)
        return fields

    def drain(self, name: str, reason: str) -> None:
        self.run(
            program("scontrol"), "update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}"
        )

    def resume(self, name: str) -> None:
        self.run(program("scontrol"), "update", f"NodeName={name}", "State=RESUME")

    def log(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.directory.glob("*.log"))
        )

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _conf(d: Path, health_check: str) -> str:
    host = socket.gethostname()
    ctld, slurmd = free_port(), free_port()
    # The three other nodes listen on a port nothing listens on: they never answer.
    dead = free_port()
    lines = [
        "ClusterName=gwtest",
        f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ctld}",
        f"SlurmdPort={slurmd}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={d}/munge.sock",
        "CredType=cred/munge",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool",
        f"SlurmctldPidFile={d}/slurmctld.pid",
        f"SlurmdPidFile={d}/slurmd.pid",
        f"SlurmctldLogFile={d}/slurmctld.log",
        f"SlurmdLogFile={d}/slurmd.log",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/linear",
        "ReturnToService=2",
        "MpiDefault=none",
        "SlurmdTimeout=300",
        health_check,
        f"NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 RealMemory=100"
        " State=UNKNOWN",
        f"NodeName=gw[2-4] NodeAddr=127.0.0.1 Port={dead} CPUs=1 RealMemory=100 State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={NODE},gw[2-4] Default=YES State=UP",
    ]
    return "\n".join(lines) + "\n"


def start_slurm(directory: Path, health_check: str = "") -> Slurm:
    """munged, slurmctld and slurmd in `directory`; returns once gw1 has registered (idle, or
    drained by a health check). `health_check` is a line or two of slurm.conf
    (HealthCheckProgram=...)."""
    d = directory
    (d / "state").mkdir(parents=True)
    (d / "spool").mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (d / "slurm.conf").write_text(_conf(d, health_check))
    slurm = Slurm(d)
    munged = [program("munged"), "--foreground", f"--key-file={key}", f"--socket={d}/munge.sock",
              f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
              f"--seed-file={d}/munge.seed", "--force"]  # fmt: skip
    env = {**os.environ, **slurm.env}
    try:
        for cmd in (
            munged,
            [program("slurmctld"), "-D", "-i", "-f", str(slurm.conf)],
            [program("slurmd"), "-D", "-f", str(slurm.conf), "-N", NODE],
        ):
            slurm.processes.append(
                subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
            time.sleep(0.3)  # munged's socket, then slurmctld's port, before the next starts
        _wait_registered(slurm)
    except BaseException:
        slurm.stop()
        raise
    return slurm


def _wait_registered(slurm: Slurm, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        done = subprocess.run(
            [program("sinfo"), "-h", "-n", NODE, "-o", "%T"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            env={**os.environ, **slurm.env},
        )
        state = done.stdout.strip()
        if done.returncode == 0 and state in ("idle", "drained"):
            return
        time.sleep(0.2)
    raise AssertionError(
        f"slurm node {NODE} not registered in {timeout}s (state {state!r})\n{slurm.log()}"
    )
