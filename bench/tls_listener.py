"""The listener with TLS on: what a TLS client waits for a new connection's answer, quiet and
while a thousand connections sit silent, and what plain HTTP to it gets.

    .venv/bin/python bench/tls_listener.py [--tree PATH] [--probes 200] [--silent 1100]

`--tree` runs the daemon from another checkout (for the numbers before a change). The daemon
runs a healthy simulated 8-GPU node with TLS on its listener (a certificate from a CA made for
the run), with systemd's default soft limit of 1024 descriptors. A probe is GET /healthz on
a new connection (a full TLS handshake each), one after the other; one that gets no answer
in 5 s counts a failure.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import trustme

SERVING = re.compile(r"gpuwatch serving on ([\d.]+):(\d+)")


def start(tree: Path, work: Path) -> tuple[subprocess.Popen[bytes], str, ssl.SSLContext]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(work / "node.key"))
    cert.cert_chain_pems[0].write_to_path(str(work / "node.crt"))
    (work / "web.yaml").write_text("tls_server_config: {cert_file: node.crt, key_file: node.key}\n")
    context = ssl.create_default_context()
    ca.configure_trust(context)
    trampoline = (
        "import os, resource, sys; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    log_path = work / "daemon.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                trampoline,
                "-m",
                "gpuwatch",
                "run",
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                str(work / "state"),
                "--simulate",
                "healthy",
                "--web-config",
                str(work / "web.yaml"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=work,
            env={**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if found := SERVING.search(log_path.read_text()):
            return proc, f"https://{found.group(1)}:{found.group(2)}", context
        time.sleep(0.1)
    raise SystemExit(f"daemon did not start:\n{log_path.read_text()}")


def probes(url: str, context: ssl.SSLContext, count: int) -> tuple[list[float], int]:
    times, failed = [], 0
    for _ in range(count):
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=5, context=context) as r:
                r.read()
            times.append((time.perf_counter() - started) * 1000)
        except OSError:
            failed += 1
    return sorted(times), failed


def summary(times: list[float], failed: int) -> str:
    if not times:
        return f"answered 0, failed {failed}"
    p = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return (
        f"answered {len(times)}, failed {failed}; ms p50 {p(0.5):.1f} p99 {p(0.99):.1f} "
        f"max {times[-1]:.1f}"
    )


def plain_http(url: str) -> str:
    host, port = url.removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = b"".join(iter(lambda: s.recv(4096), b""))
        except OSError as exc:
            return f"no answer ({exc.strerror})"
    return answer.split(b"\r\n", 1)[0].decode() if answer else "no answer (closed)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--silent", type=int, default=1100)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python "
        f"{platform.python_version()}; daemon from {args.tree}"
    )
    with tempfile.TemporaryDirectory() as work:
        proc, url, context = start(args.tree, Path(work))
        try:
            time.sleep(5)  # past the first cycles
            print(f"quiet:                {summary(*probes(url, context, args.probes))}")
            host, port = url.removeprefix("https://").rsplit(":", 1)
            silent = [
                socket.create_connection((host, int(port)), timeout=5) for _ in range(args.silent)
            ]
            print(
                f"{args.silent} silent connections: "
                f"{summary(*probes(url, context, args.probes // 4))}"
            )
            for s in silent:
                s.close()
            print(f"plain HTTP to it:     {plain_http(url)}")
        finally:
            proc.terminate()
            proc.wait(20)


if __name__ == "__main__":
    main()
