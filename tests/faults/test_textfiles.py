"""The textfile directory as someone with write access to it could fill it: nothing there stops
sampling, leaks a file from elsewhere, or reaches the log."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.push.registry import JobMetrics, PushLimits
from gpuwatch.push.textfile import TextfileDir
from tests.conftest import start_daemon, stop_daemon, wait_for

SECRET = "routing_key 123456789\n"


def read_within(files: TextfileDir, seconds: float = 10.0) -> dict[str, Any]:
    """read() on a thread, so a read that blocks fails the test instead of hanging it."""
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(files.read()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the textfile read blocked"
    return out


def test_fifos_devices_and_links_out_are_left_out_and_nothing_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "textfiles"
    d.mkdir()
    secret = tmp_path / "secret.prom"
    secret.write_text(SECRET)
    os.mkfifo(d / "fifo.prom")
    (d / "zero.prom").symlink_to("/dev/zero")
    (d / "leak.prom").symlink_to(secret)
    (d / "good.prom").write_text("train_step 5\n")
    (d / "alias.prom").symlink_to(d / "good.prom")  # a link inside the directory is fine
    (d / "broken.prom").write_text("routing_key{ 99\n")
    with caplog.at_level(logging.WARNING):
        got = read_within(TextfileDir(d, 4096))
    assert sorted(got) == ["alias", "good"]
    assert [s.value for s in got["good"]] == [5.0]
    log = caplog.text
    assert "fifo.prom left out: not a regular file" in log
    assert "zero.prom left out: a symlink out of the textfile directory" in log
    assert "leak.prom left out: a symlink out of the textfile directory" in log
    assert "broken.prom left out: not valid text format" in log
    assert "routing_key" not in log and "123456789" not in log


def test_a_big_file_is_cut_at_the_limit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "big.prom").write_text("x 1\n" * 10_000)
    with caplog.at_level(logging.WARNING):
        assert read_within(TextfileDir(tmp_path, 4096)) == {}
    assert "big.prom left out: larger than 4096 bytes" in caplog.text


def test_only_the_first_files_by_name_are_read(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"job{i:03d}.prom").write_text("x 1\n")
    got = read_within(TextfileDir(tmp_path, 4096, max_files=10))
    assert sorted(got) == [f"job{i:03d}" for i in range(10)]


def test_job_limits_count_every_job_once(tmp_path: Path) -> None:
    from gpuwatch.model import Sample

    jobs = JobMetrics(PushLimits(max_series_per_job=2, max_series=5, stale_after=10.0))
    for i in range(5):
        jobs.apply(f"j{i}", [Sample("x", (("job", f"j{i}"),), 1.0)], 0.0)
    jobs.apply("j0", [Sample("x", (("job", "j0"),), 2.0)], 1.0)  # the same series: no more
    with pytest.raises(Exception, match="the node would hold 6 pushed series"):
        jobs.apply("j9", [Sample("x", (("job", "j9"),), 1.0)], 1.0)
    assert len(jobs.samples(10.5)) == 1  # all but j0's refreshed series went stale
    jobs.apply("j9", [Sample("x", (("job", "j9"),), 1.0), Sample("y", (), 1.0)], 10.6)
    assert len(jobs.samples(10.6)) == 3


def sampled(daemon: Any) -> float:
    return float(daemon.json("/api/v1/node")["data"]["sampling"]["last_sample_time"])


def test_ten_thousand_textfiles_leave_sampling_current(tmp_path: Path) -> None:
    d = tmp_path / "textfiles"
    d.mkdir()
    for i in range(10_000):
        (d / f"job{i:05d}.prom").write_text(f'train_step{{rank="0"}} {i}\n')
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(f"push:\n  textfile_dir: {d}\n")
    daemon = start_daemon(tmp_path, "--simulate", "healthy", "-c", str(config))
    try:
        wait_for(lambda: "train_step" in daemon.metrics(), timeout=60)
        for _ in range(3):  # a few cycles on: still current
            last = sampled(daemon)
            wait_for(lambda t=last: sampled(daemon) > t)
            assert daemon.get("/healthz")[0] == 200
        assert daemon.metrics().count('train_step{job="job') == 1000
        assert "10000 files; only the first 1000 by name are read" in daemon.log()
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
