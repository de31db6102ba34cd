"""How a command ends when it cannot do its work: a line on stderr and an exit status that
scripts (the Slurm health check, the prolog, cron) tell apart."""

from __future__ import annotations

import sys

EXIT_CONFIG = 2  # a file or an argument that cannot be used
EXIT_UNREACHABLE = 3  # no daemon answered: the health check reads it as "the daemon is down"
EXIT_USAGE = 64  # sysexits.h's EX_USAGE: a malformed address, never 3


class ControlError(Exception):
    """The daemon could not be reached on its control socket; the message says where we
    looked. Here, not beside the socket's client, so a command over HTTP can catch it without
    loading that client."""


def fail(message: str, code: int = EXIT_CONFIG) -> int:
    print(f"gpuwatch: {message}", file=sys.stderr)
    return code
