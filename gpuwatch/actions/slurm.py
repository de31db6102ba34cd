"""Slurm through its own commands: what `scontrol` and `sinfo` say of a node, and a drain or a
resume. Every run has a deadline and a cap on what it may print; nothing goes through a shell.

The node's state is read with `sinfo` in a format of our own choosing, not `scontrol show
node`, whose `Reason=` runs on with spaces to the end of its line and whose field order
changes between releases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuwatch.clock import within
from gpuwatch.text.printable import one_line

log = logging.getLogger(__name__)

OWN_REASON_PREFIX = "gpuwatch: "
MAX_OUTPUT_BYTES = 16 * 1024 * 1024  # sinfo of a 20,000-node partition prints a few MiB
MAX_REASON_CHARS = 200
# One line per node and partition: name, partition, the state with its flags, the time the
# reason was set, then the reason (last: it is free text and may hold the separator).
SEP = "\x1f"
SINFO_FIELDS = ("NodeList", "Partition", "StateComplete", "Timestamp", "Reason")
# States in which a node takes no new jobs (sinfo's StateComplete: idle+drain, down+drain...).
OUT_OF_SERVICE = frozenset({"drain", "drained", "draining", "down", "fail", "failing"})


class SlurmError(Exception):
    """A Slurm command failed, timed out or could not be run; the message says which."""


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    partitions: tuple[str, ...]
    states: frozenset[str]  # lower case: {"idle", "drain"}, {"down", "not_responding"}
    reason: str  # "" when none
    reason_time: float | None  # when the reason was set, seconds since the epoch

    @property
    def out_of_service(self) -> bool:
        return bool(self.states & OUT_OF_SERVICE)

    @property
    def drained(self) -> bool:
        """Drained or draining: no new jobs start on it."""
        return bool(self.states & {"drain", "drained", "draining"})

    @property
    def ours(self) -> bool:
        """Whether the daemon's actions set the node's current reason."""
        return self.reason.startswith(OWN_REASON_PREFIX)

    @property
    def by_gpuwatch(self) -> bool:
        """Whether any part of gpuwatch set it: the daemon, or the shipped health check
        ("gpuwatch health: ..."). The circuit breaker counts both."""
        return self.reason.startswith("gpuwatch")


def _states(text: str) -> frozenset[str]:
    """sinfo's StateComplete ("idle+drain", "down*+drain"): '*' marks a node not responding."""
    out: set[str] = set()
    for part in text.lower().split("+"):
        if part.endswith("*"):
            out.add("not_responding")
        if bare := part.rstrip("*~#!%$@^-"):
            out.add(bare)
    return frozenset(out)


def _time(text: str) -> float | None:
    """sinfo's reason time, in slurmctld's local time ("Unknown" or "none" when unset)."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_sinfo(output: str) -> list[SlurmNode]:
    """Nodes from `sinfo -N -h -O <SINFO_FIELDS, SEP-separated>`; a node in several
    partitions is one node with all of them. A line that does not parse is skipped."""
    nodes: dict[str, SlurmNode] = {}
    # sinfo ends its lines with \n alone; splitlines() would also split a reason at U+2028
    # or \x1c-\x1e, and one crafted reason would count as several nodes.
    for line in output.split("\n"):
        fields = line.split(SEP, len(SINFO_FIELDS) - 1)
        if len(fields) != len(SINFO_FIELDS):
            continue
        name, partition, state, when, reason = (f.strip() for f in fields)
        partition = partition.rstrip("*")  # the default partition is starred
        reason = "" if reason.lower() == "none" else reason
        known = nodes.get(name)
        parts = (*known.partitions, partition) if known else (partition,)
        nodes[name] = SlurmNode(name, parts, _states(state), reason, _time(when))
    return list(nodes.values())


def sinfo_format() -> str:
    # Width 0 is "as wide as the value" in -O; a field with a suffix ends in it.
    return ",".join(
        f"{f}:0{SEP}" if i < len(SINFO_FIELDS) - 1 else f"{f}:0" for i, f in enumerate(SINFO_FIELDS)
    )


def own_reason(text: str) -> str:
    """A reason gpuwatch sets: its prefix marks it as ours, so an admin's is never undone."""
    # One line, no control characters: scontrol keeps it whole, and `sinfo -R` shows it as
    # written; a label's ESC or NUL would reach every admin's terminal, or cut the reason.
    return one_line(OWN_REASON_PREFIX + text, MAX_REASON_CHARS)


class SlurmCli:
    """`scontrol` and `sinfo` as the daemon's user runs them (root, or SlurmUser for a drain),
    with SLURM_CONF and the rest of the environment the daemon has."""

    def __init__(self, scontrol: str, sinfo: str, timeout: float) -> None:
        self.scontrol = scontrol
        self.sinfo = sinfo
        self.timeout = timeout

    async def nodes(
        self, names: Iterable[str] = (), partitions: Iterable[str] = ()
    ) -> list[SlurmNode]:
        args = ["-N", "-h", "-O", sinfo_format()]
        if names := list(names):
            args += ["-n", ",".join(names)]
        if partitions := list(partitions):
            args += ["-p", ",".join(partitions)]  # named, a hidden one is listed too
        else:
            args.append("--all")  # hidden partitions too (sinfo refuses it beside -p)
        return parse_sinfo(await self._run(self.sinfo, args))

    async def node(self, name: str) -> SlurmNode:
        found = [n for n in await self.nodes(names=[name]) if n.name == name]
        if not found:
            raise SlurmError(f"sinfo does not list node {name!r}: is it the node's Slurm name?")
        return found[0]

    async def drain(self, name: str, reason: str) -> None:
        await self._run(
            self.scontrol, ["update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}"]
        )

    async def resume(self, name: str) -> None:
        await self._run(self.scontrol, ["update", f"NodeName={name}", "State=RESUME"])

    async def _run(self, program: str, args: Sequence[str]) -> str:
        what = " ".join([os.path.basename(program), *args[:2]])
        try:
            proc = await asyncio.create_subprocess_exec(
                program,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: a kill reaches its children
            )
        except OSError as exc:
            raise SlurmError(f"{program}: cannot run it: {exc.strerror or exc}") from None
        assert proc.stdout is not None and proc.stderr is not None
        streams = (proc.stdout, proc.stderr)
        readers = [asyncio.ensure_future(_capped(stream)) for stream in streams]
        done = False
        try:
            out, err = await within(asyncio.gather(*readers), self.timeout)
            await within(proc.wait(), self.timeout)
            done = True
        except TimeoutError:
            raise SlurmError(f"{what}: no answer within {self.timeout:g}s") from None
        except _TooLongError:
            raise SlurmError(f"{what}: printed more than {MAX_OUTPUT_BYTES} bytes") from None
        finally:
            if not done:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                for reader in readers:
                    reader.cancel()
                await asyncio.gather(*readers, return_exceptions=True)
                # Killed, it leaves at most a pipe's buffer: read to the end, or the process
                # is never reaped (asyncio waits for its pipes to close).
                for stream in streams:
                    with contextlib.suppress(Exception):
                        await within(_drain(stream), self.timeout)
                await proc.wait()
        if proc.returncode != 0:
            said = err.decode(errors="replace").strip().splitlines()
            raise SlurmError(
                f"{what}: exit status {proc.returncode}: {said[-1] if said else 'no message'}"
            )
        return out.decode(errors="replace")


class _TooLongError(Exception):
    pass


async def _capped(stream: asyncio.StreamReader) -> bytes:
    """All a stream says, up to MAX_OUTPUT_BYTES."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(65536):
        size += len(chunk)
        if size > MAX_OUTPUT_BYTES:
            raise _TooLongError
        chunks.append(chunk)
    return b"".join(chunks)


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass
