"""A GPU whose NVML calls hang is marked down; everything else keeps going."""

from __future__ import annotations

import time

from tests.conftest import parse_metrics

SPEED = 4.0  # the scenario's 10 s + 30 s hang plays in about 10 s of real time


def _by_gpu(families, name):  # type: ignore[no-untyped-def]
    return {labels["gpu"]: value for labels, value in families.get(name, []) if "gpu" in labels}


def test_hung_gpu_goes_down_and_comes_back_while_serving_stays_fast(run_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon = run_daemon("--simulate", "nvml_hang", "--speed", str(SPEED))
    seen_down = seen_back = False
    slowest = 0.0
    energy_while_down: list[dict[str, float]] = []
    timeouts = 0.0
    deadline = time.monotonic() + 45 / SPEED + 10
    while time.monotonic() < deadline and not seen_back:
        t0 = time.monotonic()
        status, _, body = daemon.get("/metrics", timeout=5)
        t1 = time.monotonic()
        health_status, _, _ = daemon.get("/healthz", timeout=5)
        t2 = time.monotonic()
        slowest = max(slowest, t1 - t0, t2 - t1)
        assert status == 200
        assert health_status == 200
        families = parse_metrics(body.decode())
        up = _by_gpu(families, "gpuwatch_gpu_up")
        if up.get("1") == 0.0:
            seen_down = True
            assert all(up[g] == 1.0 for g in up if g != "1"), up
            # The hung GPU's readings are gone (stale), not frozen at old values.
            assert "1" not in _by_gpu(families, "gpuwatch_gpu_temperature_celsius")
            energy_while_down.append(_by_gpu(families, "gpuwatch_gpu_energy_joules_total"))
            timeouts = _by_gpu(families, "gpuwatch_nvml_timeouts_total")["1"]
        elif seen_down and up.get("1") == 1.0:
            seen_back = True
        time.sleep(0.1)
    assert seen_down, "GPU 1 never reported gpuwatch_gpu_up 0"
    assert seen_back, "GPU 1 never came back to gpuwatch_gpu_up 1"
    assert slowest < 1.0, f"a request took {slowest:.3f}s"
    assert timeouts >= 1
    # The other GPUs kept being sampled during the hang: their energy counters kept rising.
    first, last = energy_while_down[0], energy_while_down[-1]
    assert len(energy_while_down) >= 5
    for gpu in ("0", "2", "7"):
        assert last[gpu] > first[gpu]
    node = daemon.json("/api/v1/node")["data"]
    assert node["gpus"][1]["status"] == "ok"
    assert "timed out" in daemon.log() or "took longer" in daemon.log()
