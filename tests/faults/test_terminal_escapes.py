"""A process or a label that names itself with terminal escapes and newlines is shown, never
obeyed: the dashboard's client and the CLI make every string from a daemon printable."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web
from gpuwatch.tui.http import JsonClient

from gpuwatch.clients.commands import _health
from gpuwatch.text.printable import printable, printable_json

HOSTILE = "train\x1b]0;pwned\x07\x1b[2J\nfake 2026-01-01T00:00:00Z xid GPU 0 forged\u202eevil"


def test_printable_shows_every_control_character() -> None:
    shown = printable(HOSTILE)
    assert "\x1b" not in shown and "\n" not in shown and "\x07" not in shown
    assert "\u202e" not in shown
    assert shown == (
        "train\\x1b]0;pwned\\x07\\x1b[2J\\nfake 2026-01-01T00:00:00Z xid GPU 0 forged\\u202eevil"
    )
    assert printable("GPU 3 (H100) 82°C — ok") == "GPU 3 (H100) 82°C — ok"
    assert printable_json({HOSTILE: [HOSTILE, 1, None]}) == {
        printable(HOSTILE): [printable(HOSTILE), 1, None]
    }


async def serve_events() -> tuple[web.AppRunner, str]:
    payload = {
        "status": "success",
        "data": {
            "events": [
                {
                    "time": "2026-11-24T00:00:00Z",
                    "kind": "alert",
                    "gpu": 0,
                    "message": HOSTILE,
                    "name": HOSTILE,
                }
            ]
        },
    }

    async def handler(_: web.Request) -> web.Response:
        return web.json_response(payload)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def test_the_dashboards_client_makes_what_it_reads_printable() -> None:
    runner, url = await serve_events()
    client = JsonClient(timeout=2.0)
    try:
        got = await client.get_json(f"{url}/api/v1/events")
    finally:
        await client.close()
        await runner.cleanup()
    event = got["data"]["events"][0]
    assert event["message"] == printable(HOSTILE) and event["name"] == printable(HOSTILE)


async def test_gpuwatch_events_prints_one_line_per_event_and_no_escape() -> None:
    runner, url = await serve_events()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuwatch",
            "events",
            url,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        await runner.cleanup()
    assert proc.returncode == 0, err
    text = out.decode()
    assert "\x1b" not in text and "\x07" not in text
    assert text.count("\n") == 1  # the forged second line stays on the first
    assert "\\x1b[2J" in text


def test_the_health_line_is_one_printable_line_cut_on_a_character(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The control socket's reply (`health --local`, the health check's and the prolog's way
    # in) is printed as the listener's is: escaped, on one line.
    node = {"verdict": "unhealthy", "reasons": [f"GPU 3: {HOSTILE}\x00"], "actions": ["é" * 300]}
    assert _health("sock", lambda: {"data": node}, 160) == 2
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("unhealthy: GPU 3: train\\x1b]0;pwned\\x07") and "\\x00" in line
    assert not any(ord(c) < 0x20 for c in line) and "\u202e" not in line
    # 160 characters, not bytes: the health check's `cut -c` in slurmd's C locale split an é.
    assert len(line) == 160 and line.endswith("é...")
    line.encode("utf-8")


def test_the_shipped_health_check_leaves_the_cut_to_gpuwatch() -> None:
    check = (Path(__file__).parents[2] / "deploy" / "slurm" / "gpuwatch-healthcheck").read_text()
    calls = [line for line in check.splitlines() if "health --local" in line]
    assert calls and all("--max-chars 160" in line for line in calls)
    assert "/usr/bin/cut" not in check
