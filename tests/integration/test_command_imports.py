"""The commands Slurm and operators run often load only what they need: none of the daemon's
libraries (aiohttp, the rules engine, YAML, the simulator), so that `gpuwatch health` before
every job costs a fresh Python and an HTTP request, not a daemon's start-up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What a command talking to a daemon has no use for: the server, the rules, the config file's
# parser, the simulator, NVML, the dashboard's and the tables' libraries.
HEAVY = ("aiohttp", "asyncio", "yaml", "pynvml", "rich", "textual", "uvloop", "urllib.request",
         "gpuwatch.serve", "gpuwatch.rules", "gpuwatch.promql", "gpuwatch.sim", "gpuwatch.config",
         "gpuwatch.daemon", "gpuwatch.model")  # fmt: skip
# Each command run as far as it gets with no daemon there: its imports are all made by then.
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback
RUNS = {
    "health": ["health", NOWHERE],
    "health --local": ["health", "--local", "--state-dir", "/nonexistent"],
    "job-report": ["job-report", "81234", NOWHERE],
    "events": ["events", NOWHERE],
    "ack": ["ack", "--state-dir", "/nonexistent", "0", "xid"],
    "silence list": ["silence", "list", "--state-dir", "/nonexistent"],
}
PROBE = """
import json, sys
from gpuwatch.cli import main
main(sys.argv[1:])
print(json.dumps(sorted(sys.modules)))
"""


def loaded(argv: list[str]) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("command", sorted(RUNS))
def test_a_command_that_asks_the_daemon_loads_none_of_the_daemons_libraries(command: str) -> None:
    assert heavy(loaded(RUNS[command])) == []


@pytest.mark.parametrize("command", ["health", "health --local", "job-report", "events", "ack"])
def test_a_plain_http_address_is_asked_without_http_client_ssl_or_email(command: str) -> None:
    """Those cost 20 ms to import; an http:// daemon and the control socket are asked on a
    socket."""
    modules = loaded(RUNS[command])
    assert not [m for m in modules if m.split(".")[0] in ("http", "ssl", "email")]


def test_status_loads_rich_for_its_table_and_nothing_else_heavy() -> None:
    assert {m.split(".")[0] for m in heavy(loaded(["status", NOWHERE]))} <= {"rich"}


def test_every_command_the_parser_knows_has_a_function() -> None:
    probe = (
        "import importlib; from gpuwatch.cli import COMMANDS;"
        "from gpuwatch.clients.parser import build_parser;"
        "p = build_parser(); sub = next(a for a in p._actions if a.dest == 'command');"
        "assert sorted(sub.choices) == sorted(COMMANDS), (sorted(sub.choices), sorted(COMMANDS));"
        "[getattr(importlib.import_module(m), f) for m, f in COMMANDS.values()]"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_the_daemons_command_loads_the_simulator_only_for_a_simulated_node() -> None:
    probe = "import json, sys, gpuwatch.cli.serving; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert [m for m in json.loads(done.stdout) if m.startswith("gpuwatch.sim")] == []


def test_the_daemon_loads_neither_bcrypt_without_users_nor_shutil_to_parse_arguments() -> None:
    """bcrypt waits for a listener with users; argparse's way to the terminal's width
    (shutil, with the bz2 and lzma modules it brings) is not taken to parse `run`."""
    probe = (
        "import json, sys, gpuwatch.cli.serving;"
        "from gpuwatch.clients.parser import build_parser; build_parser().parse_args(['run']);"
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert {"bcrypt", "shutil", "bz2", "lzma"} & set(json.loads(done.stdout)) == set()
