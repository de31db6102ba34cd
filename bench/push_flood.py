"""A push-socket flood beside a real fault: does the node still sample, read its GPUs in time,
answer other users and page the fault?

    .venv/bin/python bench/push_flood.py [--tree PATH] [--seconds 30]

`--tree` runs the daemon (and its rule packs) from another checkout, for numbers before a
change. The daemon runs a simulated 8-GPU node whose GPU 1 falls off the bus 20 s in, posting
to a webhook that takes 2 messages a second. From 5 s in, for `--seconds`:

- a user (uid 60003) pushes text bodies of about 3.7 MB (1000 series of 100 labels: inside
  the push limits of before; `--shape allowed`, the largest the limits of after take) from 8
  threads, as fast as they are answered;
- a user (uid 60001) holds 520 connections that each announce a 4 MiB body and trickle a
  byte a second;
- a job pushes 200 ranks' NaN loss once, just before;
- another user (uid 60002) pushes one small series every 0.5 s and times the answer.

An observer in a process of its own asks `/api/v1/node` every 200 ms for the age of the last
sample. It prints sampling staleness (p99 and worst), NVML deadline misses
(gpuwatch_nvml_timeouts_total), the daemon's peak RSS (VmHWM), the other user's pushes
answered, and the time from the lost GPU's alert firing to the webhook's receipt (waited for
up to 2 minutes after the flood).
Run as root (the users are set with setuid).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

SERVING = re.compile(r"gpuwatch serving on ([\d.]+):(\d+)")
TRICKLER_UID, PROBE_UID, PUSHER_UID = 60001, 60002, 60003
SCENARIO = """\
name: push-flood
node: {gpus: 8, model: H100, workload: training, seed: 1}
faults:
  - {kind: fall_off_bus, gpu: 1, at: 20s}
"""


class Hook:
    """A webhook that answers 429 past 2 requests a second, as a chat service does."""

    def __init__(self) -> None:
        self.pages: list[tuple[float, dict[str, Any]]] = []
        self.requests = 0
        self._recent: list[float] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                now = time.time()
                hook._recent = [t for t in hook._recent if t > now - 1.0]
                hook.requests += 1
                if len(hook._recent) >= 2:
                    self.send_response(429)
                    self.send_header("Retry-After", "1")
                else:
                    hook._recent.append(now)
                    hook.pages.append((now, json.loads(body)))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def start_daemon(tree: Path, work: Path, hook: Hook) -> tuple[subprocess.Popen[bytes], str]:
    shared = work / "run"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    work.chmod(0o755)
    (work / "scenario.yaml").write_text(SCENARIO)
    (work / "gpuwatch.yaml").write_text(
        f"node_name: bench\npush:\n  socket: {shared / 'push.sock'}\n"
        f"rules:\n  files: ['{tree / 'rules'}/*.yaml']\n"
        f"notify:\n  receivers:\n    - {{name: chat, type: webhook, url: '{hook.url}'}}\n"
    )
    log_path = work / "daemon.log"
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwatch",
                "run",
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                str(work / "state"),
                "--simulate",
                str(work / "scenario.yaml"),
                "-c",
                str(work / "gpuwatch.yaml"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if found := SERVING.search(log_path.read_text()):
            return proc, f"http://{found.group(1)}:{found.group(2)}"
        time.sleep(0.1)
    raise SystemExit(f"daemon did not start:\n{log_path.read_text()}")


def post(path: Path, target: str, body: bytes, kind: str = "text/plain") -> tuple[int, float]:
    """(HTTP status, seconds) of one push; status 0 when the connection failed."""
    started = time.monotonic()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(path))
            s.sendall(
                f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        return int(reply.split()[1]), time.monotonic() - started
    except (OSError, IndexError, ValueError):
        return 0, time.monotonic() - started


def big_body(shape: str) -> bytes:
    """`wide`: 1000 series of 100 labels (3.7 MB), inside the limits of before; `allowed`: the
    largest body of 1000 series the limits of after take (20 labels of 190 characters)."""
    if shape == "wide":
        labels = ",".join(f'l{i}="value-{i:03d}-xxxxxxxxxxxxxx"' for i in range(100))
    else:
        labels = ",".join(f'l{i:02d}="{i:02d}' + "x" * 188 + '"' for i in range(19))
    return "".join(f'flood_value{{{labels},s="{s}"}} 1\n' for s in range(1000)).encode()


def big_pushes(path: str, shape: str, seconds: float, results: Connection) -> None:
    """8 threads pushing as fast as they are answered, from one user."""
    body = big_body(shape)
    counts: dict[str, int] = {}
    deadline = time.monotonic() + seconds

    def push() -> None:
        while time.monotonic() < deadline:
            status, _ = post(Path(path), "/api/v1/push?job=flood", body)
            counts[str(status)] = counts.get(str(status), 0) + 1

    threads = [threading.Thread(target=push) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.send((len(body), counts))


def as_user(uid: int, work: Any, *args: Any) -> multiprocessing.Process:
    def run() -> None:
        os.setgid(uid)
        os.setuid(uid)
        work(*args)

    process = multiprocessing.get_context("fork").Process(target=run)
    process.start()
    return process


def trickle(path: str, seconds: float) -> None:
    socks = []
    for _ in range(520):
        with contextlib.suppress(OSError):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(1)
            s.connect(path)
            s.sendall(
                b"POST /api/v1/push?job=slow HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: text/plain\r\nContent-Length: 4194304\r\n\r\n"
            )
            socks.append(s)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for s in list(socks):
            try:
                s.sendall(b"x")
            except OSError:
                socks.remove(s)
        time.sleep(1)
    for s in socks:
        s.close()


def probe_pushes(path: str, seconds: float, results: Connection) -> None:
    answered, failed, times = 0, [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, took = post(Path(path), "/api/v1/push?job=other", b'train_step{rank="0"} 1\n')
        if status == 200:
            answered += 1
            times.append(took)
        else:
            failed.append(status)
        time.sleep(0.5)
    results.send((answered, failed, times))


def observe(url: str, stop: EventType, results: Connection) -> None:
    ages: list[float] = []
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url + "/api/v1/node", timeout=5) as r:
                node = json.load(r)["data"]
            last = node["sampling"]["last_sample_time"]
            if last is not None:
                ages.append(time.time() - float(last))
        except OSError:
            ages.append(5.0)  # no answer within 5 s: at least that stale, as far as anyone knows
        stop.wait(0.2)
    results.send(ages)


def metric_sum(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def lost_pages(hook: Hook) -> list[tuple[float, dict[str, Any]]]:
    return [
        (t, a)
        for t, body in list(hook.pages)
        for a in body["alerts"]
        if a["labels"]["alertname"] == "GpuFellOffBus"
    ]


def nan_pages(hook: Hook) -> list[dict[str, Any]]:
    return [
        body
        for _, body in list(hook.pages)
        if body["commonLabels"].get("alertname") == "TrainingLossNaN"
    ]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--shape", choices=("wide", "allowed"), default="wide")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuwatch-push-flood-"))
    hook = Hook()
    proc, url = start_daemon(args.tree.resolve(), work, hook)
    path = work / "run" / "push.sock"
    try:
        time.sleep(5)
        timeouts_before = metric_sum(url, "gpuwatch_nvml_timeouts_total")
        spawn = multiprocessing.get_context("spawn")
        stop_observer = spawn.Event()
        observed, observer_end = spawn.Pipe(duplex=False)
        observer = spawn.Process(target=observe, args=(url, stop_observer, observer_end))
        observer.start()
        nan = "".join(f'train_loss{{rank="{r}"}} NaN\n' for r in range(200)).encode()
        nan_status, _ = post(path, "/api/v1/push?job=llama", nan)
        pushed, pushed_end = multiprocessing.get_context("fork").Pipe(duplex=False)
        pusher = as_user(PUSHER_UID, big_pushes, str(path), args.shape, args.seconds, pushed_end)
        trickler = as_user(TRICKLER_UID, trickle, str(path), args.seconds)
        probed, probe_end = multiprocessing.get_context("fork").Pipe(duplex=False)
        prober = as_user(PROBE_UID, probe_pushes, str(path), args.seconds, probe_end)
        answered, failed, push_times = probed.recv()
        size, counts = pushed.recv()
        pusher.join()
        trickler.join()
        prober.join()
        stop_observer.set()
        ages = observed.recv()
        observer.join()
        timeouts = metric_sum(url, "gpuwatch_nvml_timeouts_total") - timeouts_before
        deadline = time.monotonic() + 120  # the pages, however late
        while time.monotonic() < deadline and not (lost_pages(hook) and nan_pages(hook)):
            time.sleep(0.5)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        peak = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
        lost = lost_pages(hook)
        if lost:
            fired = datetime.fromisoformat(lost[0][1]["startsAt"].replace("Z", "+00:00"))
            page = f"{lost[0][0] - fired.timestamp():.2f} s"
        else:
            page = "never"
        nan_messages = len(nan_pages(hook))
        print(f"tree {args.tree}: {args.seconds:.0f} s of flood, 8 GPUs, GPU 1 lost at 20 s")
        print(
            f"  sampling staleness   p99 {quantile(ages, 0.99):.2f} s, worst {max(ages):.2f} s"
            f" ({len(ages)} looks)"
        )
        print(f"  NVML deadline misses {timeouts:.0f}")
        print(f"  peak RSS             {peak:.0f} MiB")
        print(f"  big pushes ({size / 1e6:.1f} MB)  {dict(sorted(counts.items()))} (status: count)")
        print(
            f"  other user's pushes  {answered} answered, {len(failed)} failed {failed}, "
            f"p99 {quantile(push_times, 0.99) * 1000:.0f} ms"
        )
        print(f"  200-rank NaN push    HTTP {nan_status}; {nan_messages} TrainingLossNaN messages")
        print(
            f"  lost GPU paged       {page} after its alert fired; "
            f"{hook.requests} requests to the webhook"
        )
    finally:
        proc.terminate()
        proc.wait(30)
        hook.server.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
