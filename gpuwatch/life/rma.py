"""The evidence an RMA asks for, written as a folder: `summary.txt` (what NVIDIA's RMA form
wants: the board, its counts, its faults with times and the driver's text, and how to add
nvidia-bug-report.sh's output) and `history.json` (the whole life record, for tools)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from shlex import quote

from gpuwatch import __version__
from gpuwatch.life.book import FAULT_KINDS, Entry, GpuLife, jobs_own_xid
from gpuwatch.life.history import describe, entry_lines, history_json
from gpuwatch.text.printable import printable
from gpuwatch.text.timefmt import utc_second as when

SUMMARY = "summary.txt"
HISTORY = "history.json"
BUG_REPORT = """\
Before sending: add NVIDIA's own report
  NVIDIA's RMA process asks for the output of nvidia-bug-report.sh, the script the driver
  installs in /usr/bin. Run it on this node as root, as soon after the fault as you can and
  with the GPU still installed, from this folder, so its file lands beside this summary:

      cd {folder} && sudo nvidia-bug-report.sh

  It writes nvidia-bug-report.log.gz here. If it hangs or the report is incomplete, power-cycle
  the node, keep the file it wrote, and run it once more (NVIDIA asks for both). Then send the
  folder as one file:

      tar czf {tarball} -C {parent} {name}
"""


def bundle_name(serial: str, now: float) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", serial)[:64]
    return f"gpuwatch-rma-{safe}-{when(now).replace(' ', 'T').replace(':', '')}Z"


def summary_text(life: GpuLife, entries: list[Entry], folder: Path, now: float) -> str:
    # A job's own XIDs (application faults, kept a day to an entry) are not the board's.
    faults = [e for e in entries if e.kind in FAULT_KINDS and not jobs_own_xid(e.kind, e.key)]
    lines = [
        f"RMA evidence for GPU serial {printable(life.serial)}, written by gpuwatch "
        f"{__version__} at {when(now)} UTC",
        "",
        *describe(life),
        "",
        f"Faults this node recorded ({len(faults)}; times in UTC, the driver's text where the "
        "kernel log had it)",
        *(entry_lines(faults) if faults else ["  none"]),
        "",
        f"The whole record (installs, moves, driver upgrades, drains, acknowledgements): {HISTORY}",
        "",
        BUG_REPORT.format(
            folder=quote(str(folder)),
            tarball=quote(f"{folder}.tar.gz"),
            parent=quote(str(folder.parent)),
            name=quote(folder.name),
        ),
    ]
    return "\n".join(lines)


def write_bundle(life: GpuLife, entries: list[Entry], out: Path, now: float) -> Path:
    """The bundle's folder, created under `out` (which must exist); private to its owner, as
    the record names the jobs that ran on the GPU."""
    folder = (out / bundle_name(life.serial, now)).absolute()
    folder.mkdir(mode=0o700)
    _private(folder / SUMMARY, summary_text(life, entries, folder, now))
    _private(folder / HISTORY, json.dumps(history_json(life, entries), indent=2) + "\n")
    return folder


def _private(path: Path, text: str) -> None:
    """A new file only its owner reads (a tarball of the folder keeps the files' modes)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
