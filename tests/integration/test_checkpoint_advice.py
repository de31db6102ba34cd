"""Telling a job to checkpoint: a GPU's early warning (a row remap waiting for a reset) makes
the daemon advise every job that pushes; a training loop using gpuwatch.client sees
`should_checkpoint()` turn True, checkpoints, and says so."""

from __future__ import annotations

import time
from pathlib import Path

from gpuwatch.client import JobReporter
from tests.conftest import start_daemon, stop_daemon, wait_for


def test_a_training_loop_checkpoints_when_the_daemon_advises_it(tmp_path: Path) -> None:
    # GPU 1 records a row remap waiting for a reset 10 simulated seconds in (5 s at 2x).
    daemon = start_daemon(tmp_path, "--simulate", "row_remap_pending", "--speed", "2")
    heard: list[list[str]] = []
    reporter = JobReporter(
        "llama",
        rank=0,
        socket_path=str(tmp_path / "state" / "push.sock"),
        interval=0.2,
        on_checkpoint_advice=heard.append,
    )
    try:
        step, told_at, saved_at = 0, None, None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and saved_at is None:
            step += 1
            reporter.report(step=step, loss=2.0)
            if reporter.should_checkpoint():  # what a loop asks every step: no I/O
                told_at = told_at or time.monotonic()
                saved_at = time.monotonic()  # torch.save(...) would go here
                reporter.checkpointed()
            time.sleep(0.05)
        assert told_at is not None and saved_at is not None, daemon.log()
        assert "GpuRowRemapPending" in reporter.checkpoint_reasons
        assert heard and "GpuRowRemapPending" in heard[0]
        assert reporter.flush(timeout=5)
        events = daemon.json("/api/v1/events?kind=checkpoint_advice")["data"]["events"]
        assert len(events) == 1 and "GpuRowRemapPending" in events[0]["message"]
        pushed = wait_for(
            lambda: [
                line
                for line in daemon.metrics().splitlines()
                if line.startswith("train_checkpoints_total{")
            ],
            timeout=10,
        )
        assert float(pushed[0].rsplit(" ", 1)[1]) == 1.0

        # The simulated job's report says when it was told (the job runs on every GPU), and
        # that its ranks, told through their own pushes, checkpointed after.
        def checkpointed() -> dict[str, str] | None:
            report = daemon.json("/api/v1/jobs/81234/report")["data"]
            [advice] = report["checkpoint_advice"]
            assert "GpuRowRemapPending" in advice["message"]
            return advice if advice["checkpoint_after"] else None

        wait_for(checkpointed, timeout=10)
    finally:
        reporter.close()
        assert stop_daemon(daemon) == 0, daemon.log()
