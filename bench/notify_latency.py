"""Notifications: time from an injected XID 79 to the webhook POST arriving, and outbox
throughput.

1. Latency. Runs the real daemon in this process (NVML source on the simulator, the shipped
   rules, journal and outbox in a temporary state directory) with one webhook receiver: a
   loopback HTTP server in a thread. Each run makes the 8 GPUs log XID 79 half a second apart
   (each fires its own GpuFellOffBus, a critical alert sent at once); 13 runs give 104
   measurements from the simulator raising the XID to the POST arriving. Goal: p99 under 1 s.
2. Throughput. Puts N notifications in the outbox in one go (one fsync'd transaction each, as
   the dispatcher writes them) and times delivering them all, in order, to the loopback server.

Run: .venv/bin/python bench/notify_latency.py [--runs 13] [--outbox 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import platform
import statistics
import tempfile
import threading
import time
from collections import Counter
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp

from gpuwatch.clock import SystemClock
from gpuwatch.config import Config, SamplingConfig
from gpuwatch.notify.config import NotifyConfig, ReceiverConfig
from gpuwatch.notify.db import NotifyDb, Outgoing
from gpuwatch.notify.sender import ReceiverSender
from gpuwatch.serve.runner import start
from gpuwatch.sim.faults import Fault
from gpuwatch.sim.library import SimulatedNvml
from gpuwatch.sim.scenario import load_scenario
from gpuwatch.text.secrets import Secret


class Receiver:
    def __init__(self) -> None:
        self.arrivals: list[tuple[float, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.arrivals.append((time.time(), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


async def one_run(receiver: Receiver) -> list[float]:
    faults = tuple(Fault("xid", gpu=g, at=1.0 + 0.5 * g, code=79) for g in range(8))
    scenario = replace(load_scenario("healthy"), faults=faults)
    clock = SystemClock()
    library = SimulatedNvml(scenario, clock)
    nvml = library.install()  # the real pynvml over the simulated library
    injected = {g: library.node.start + 1.0 + 0.5 * g for g in range(8)}
    ops = ReceiverConfig("ops", "webhook", Secret(receiver.url, "inline"))
    before = len(receiver.arrivals)
    with tempfile.TemporaryDirectory() as state:
        config = Config(
            listen="127.0.0.1:0",
            state_dir=state,
            sampling=SamplingConfig(interval=5.0),  # only the XID's own event can be this fast
            notify=NotifyConfig(receivers=(ops,)),
        )
        running = await start(config, nvml, clock)
        await asyncio.sleep(6.0)
        await running.stop()
    out = []
    for arrived, body in receiver.arrivals[before:]:
        if b'"GpuFellOffBus"' in body and b'"status":"firing"' in body:
            gpu = int(body.split(b'"gpu":"')[1].split(b'"')[0])
            out.append((arrived - injected[gpu]) * 1000)
    return out


async def throughput(receiver: Receiver, count: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as state:
        db = NotifyDb(Path(state))
        clock = SystemClock()
        body = b'{"version":"4","status":"firing","alerts":[]}'
        t0 = time.perf_counter()
        for i in range(count):
            db.enqueue(
                clock.now(), [Outgoing("ops", f"k{i}", body, {"Content-Type": "application/json"})]
            )
        enqueue_s = time.perf_counter() - t0
        ops = ReceiverConfig("ops", "webhook", Secret(receiver.url, "inline"))
        sender = ReceiverSender(ops, db, clock, Counter(), receiver.url)
        before = len(receiver.arrivals)
        t0 = time.perf_counter()
        async with aiohttp.ClientSession() as session:
            task = asyncio.create_task(sender.run(session))
            while len(receiver.arrivals) - before < count:  # noqa: ASYNC110 (another thread)
                await asyncio.sleep(0.01)
            task.cancel()
        deliver_s = time.perf_counter() - t0
        db.close()
    return count / enqueue_s, count / deliver_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=13)
    parser.add_argument("--outbox", type=int, default=2000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}")
    receiver = Receiver()
    latencies: list[float] = []
    for _ in range(args.runs):
        latencies += asyncio.run(one_run(receiver))
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    print(
        f"XID 79 -> webhook POST  n={len(latencies)}  p50 {statistics.median(latencies):6.1f} ms"
        f"  p99 {p99:6.1f} ms  max {latencies[-1]:6.1f} ms"
    )
    enqueue, deliver = asyncio.run(throughput(receiver, args.outbox))
    print(
        f"outbox  n={args.outbox}  enqueue {enqueue:7.0f}/s (fsync each)  deliver {deliver:7.0f}/s"
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    main()
