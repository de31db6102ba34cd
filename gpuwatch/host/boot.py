"""Which boot of the machine this is, so state that a reboot clears (XIDs, volatile counts) is
not carried across one."""

from __future__ import annotations

from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def current_boot_id(path: Path = BOOT_ID) -> str:
    """The kernel's random boot id; empty where there is none (not Linux)."""
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return ""
