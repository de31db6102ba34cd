"""A process as Linux's /proc shows it: its start time, name, user and environment.

What psutil read for gpuwatch, computed as psutil computes it (a start time is the boot time
from /proc/stat plus the process's start in clock ticks; a name cut at the kernel's 15
characters is completed from the command line), without its 1.5 MiB of import in a daemon
that asks four questions of a few processes. Every failure (the process gone, not ours to read,
a file not as expected) is an OSError.
"""

from __future__ import annotations

import os
import pwd
from functools import cache
from pathlib import Path

PROC = Path("/proc")
COMM_LIMIT = 15  # TASK_COMM_LEN - 1: the kernel's name for a process, cut there
_STARTTIME = 19  # field 22 of /proc/PID/stat, counted from the field after the name (3)


@cache
def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


@cache
def boot_time(proc: Path = PROC) -> float:
    """The machine's boot, in seconds since the epoch (`btime` in /proc/stat)."""
    for line in (proc / "stat").read_text(encoding="ascii", errors="replace").splitlines():
        if line.startswith("btime "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                break
    raise OSError(f"{proc / 'stat'}: no btime line")


def _stat(pid: int, proc: Path) -> tuple[str, list[str]]:
    """The process's name and the fields after it: the name is in parentheses and may hold
    spaces and parentheses itself, so it ends at the last ')'."""
    raw = (proc / str(pid) / "stat").read_bytes()
    opened, closed = raw.find(b"("), raw.rfind(b")")
    if opened < 0 or closed < opened:
        raise OSError(f"{proc / str(pid) / 'stat'}: not a process's stat line")
    name = raw[opened + 1 : closed].decode("utf-8", "surrogateescape")
    return name, raw[closed + 2 :].decode("ascii", "replace").split()


def start_time(pid: int, proc: Path = PROC) -> float:
    """When the process started, in seconds since the epoch: with the pid, it names one
    process (a pid is reused; the pair is not)."""
    _, fields = _stat(pid, proc)
    try:
        ticks = int(fields[_STARTTIME])
    except (IndexError, ValueError) as exc:
        raise OSError(f"{proc / str(pid) / 'stat'}: no start time") from exc
    return boot_time(proc) + ticks / _clock_ticks()


def cmdline(pid: int, proc: Path = PROC) -> list[str]:
    """The command line's words, split as psutil splits them: on NULs, or on spaces where a
    process rewrote its title (setproctitle) into one string, NUL-ended or not."""
    raw = (proc / str(pid) / "cmdline").read_bytes().decode("utf-8", "surrogateescape")
    if not raw:
        return []
    sep = "\0" if raw.endswith("\0") else " "
    words = raw.removesuffix(sep).split(sep)
    if sep == "\0" and len(words) == 1 and " " in words[0]:
        words = words[0].split(" ")
    return words


def name(pid: int, proc: Path = PROC) -> str:
    """The process's name; one the kernel cut at 15 characters is completed from its
    command line's first word, where that begins with it."""
    short, _ = _stat(pid, proc)
    if len(short) >= COMM_LIMIT:
        try:
            words = cmdline(pid, proc)
        except OSError:
            return short
        if words:
            longer = os.path.basename(words[0])
            if longer.startswith(short):
                return longer
    return short


def username(pid: int, proc: Path = PROC) -> str:
    """The name of the process's real user; its uid where the user has no name here."""
    text = (proc / str(pid) / "status").read_text(encoding="utf-8", errors="replace")
    for line in text.splitlines():
        if line.startswith("Uid:"):
            try:
                uid = int(line.split()[1])
            except (IndexError, ValueError):
                break
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return str(uid)
    raise OSError(f"{proc / str(pid) / 'status'}: no Uid line")


def environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    """The process's environment as it started (readable by its user and root only), read
    as psutil reads it: up to the first empty entry, and not an entry without its NUL (a
    process that rewrote its title over the area leaves old text there, a stale SLURM_JOB_ID
    among it)."""
    raw = (proc / str(pid) / "environ").read_bytes().decode("utf-8", "surrogateescape")
    out: dict[str, str] = {}
    entries = raw.split("\0")[:-1]  # the last is what follows the last NUL
    for entry in entries:
        if not entry:
            break
        key, sep, value = entry.partition("=")
        if sep and key:
            out[key] = value
    return out
