"""Damaged state files are set aside and shown, not fatal; a state directory removed under the
daemon is recreated with what it held."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from typing import Any

from tests.conftest import gpuwatch, start_daemon, stop_daemon, wait_for


def causes(daemon: Any) -> list[dict[str, str]]:
    node: dict[str, Any] = daemon.json("/api/v1/node")
    return list(node["data"]["causes"])


def test_damaged_databases_and_state_json_are_set_aside_and_shown(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "journal.db").write_bytes(b"not a database, a disk error's leftovers" * 100)
    (state / "notify.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    (state / "alerts.json").write_text(json.dumps({"version": 1, "rules": [1, 2]}))
    (state / "acks.json").write_text('{"half": ')
    daemon = start_daemon(tmp_path, "--simulate", "healthy")
    try:
        found = wait_for(lambda: [c for c in causes(daemon) if c["key"].startswith("state-")])
        damaged = sorted(c["key"].split(".damaged-")[0] for c in found)
        assert damaged == [
            "state-damaged-acks.json",
            "state-damaged-alerts.json",
            "state-damaged-journal.db",
            "state-damaged-notify.db",
        ]
        assert all(c["state"] == "degraded" for c in found)
        assert all("rm " in c["action"] for c in found)
        events = daemon.json("/api/v1/events?kind=state_damaged")["data"]["events"]
        assert len(events) == 4
        aside = sorted(
            p.name.split(".damaged-")[0] for p in state.iterdir() if ".damaged-" in p.name
        )
        assert aside == ["acks.json", "alerts.json", "journal.db", "notify.db"]
        # Deleting the damaged copy clears its cause.
        for p in state.iterdir():
            if p.name.startswith("journal.db.damaged-"):
                p.unlink()
        wait_for(lambda: not any("journal.db" in c["key"] for c in causes(daemon)))
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


def remove_tree(path: Path) -> None:
    """`rm -rf` as an operator runs it under a live daemon: a file the daemon removes meanwhile
    (SQLite's -wal at a checkpoint) is no error, one it adds meanwhile means trying again."""

    def gone_is_fine(_func: object, _path: str, exc_info: Any) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    for _ in range(50):
        try:
            shutil.rmtree(path, onerror=gone_is_fine)
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    raise AssertionError(f"{path} kept filling up while being removed")


def test_a_state_directory_removed_while_running_is_recreated(tmp_path: Path) -> None:
    scenario = tmp_path / "xid.yaml"
    scenario.write_text(
        "name: early_xid\nnode: {gpus: 2, model: H100, workload: training, seed: 1}\n"
        "faults:\n  - {kind: xid, gpu: 1, at: 1s, code: 48}\n"
    )
    daemon = start_daemon(tmp_path, "--simulate", str(scenario))
    state = tmp_path / "state"
    try:
        wait_for(lambda: (state / "journal.db").exists() and (state / "gpuwatch.sock").exists())
        before = len(wait_for(lambda: daemon.json("/api/v1/events")["data"]["events"]))
        remove_tree(state)
        wait_for(
            lambda: (
                (state / "journal.db").exists()
                and (state / "notify.db").exists()
                and (state / "gpuwatch.sock").exists()
                and (state / ".lock").exists()
            )
        )
        assert oct(state.stat().st_mode & 0o777) == "0o700"
        # The journal kept what it held, and the control socket answers again.
        assert len(daemon.json("/api/v1/events")["data"]["events"]) >= before
        code, out, err = gpuwatch("silence", "list", "--state-dir", str(state))
        assert code == 0, out + err
        status, _, _ = daemon.get("/healthz")
        assert status == 200
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
