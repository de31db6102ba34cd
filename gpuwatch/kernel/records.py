"""Kernel log records as `/dev/kmsg` hands them out, and `dmesg` lines as people save them.

A /dev/kmsg record (Documentation/ABI/testing/dev-kmsg) is one line
`PRIORITY,SEQUENCE,TIMESTAMP_US,FLAGS[,...];MESSAGE`, non-printable bytes escaped as `\\xNN`,
followed by continuation lines that start with a space (` SUBSYSTEM=pci`, ` DEVICE=+pci:...`).
A saved `dmesg` (`[ 1234.567890] NVRM: ...`) or a plain line of text is read as a record too,
so a log copied off a broken machine can be replayed; every record in a file is numbered by
the line it starts on.

Only what the kernel wrote speaks for the hardware. A /dev/kmsg record carries its facility
(user space may write records too, of another facility); a syslog or journal line its tag
(`kernel:` for the kernel's, `NAME[PID]:` for a program's, whatever it prints after), or its
`<PRI>`, or `dmesg -x`'s facility column. A line the kernel did not write is kept as a record
with `kernel` False, and the driver's words in it count for nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

MAX_RECORD_BYTES = 8192  # the kernel's own limit on a record it hands to a reader
_KMSG = re.compile(rb"^(\d{1,10}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)$")
_DMESG = re.compile(rb"^\[\s*(\d{1,10})\.(\d{1,9})\]\s?(.*)$", re.DOTALL)  # multi-line too
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
KERNEL_FACILITY = 0  # LOG_KERN; syslog(3) gives user space's LOG_KERN messages LOG_USER
# Where a line says who wrote it (a saved log's forms; anything else is the kernel's text):
# - a syslog priority, `<13>` (RFC 3164 and 5424 on the wire, some files keep it);
_PRI = re.compile(r"<(\d{1,3})>")
# - `dmesg -x`: `kern  :err   : ...`, `user  :warn  : ...`;
_DMESG_X = re.compile(
    r"(kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])\s*:"
    r"\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:"
)
# - a syslog or journal line's stamp and host, then whoever wrote it: only `kernel: ` is the
#   kernel (`Nov 28 01:45:00 gw1 kernel: ...`); anything else, `alice[4242]: `, a tag with a
#   space or without its colon, is not. The stamps: syslog's (`Nov 28 01:45:00`, with
#   `journalctl -o short-precise`'s fraction), RFC 3339's (rsyslog, `-o short-iso`), the same
#   with a space and a weekday and zone (`-o short-full`), seconds since the epoch
#   (`-o short-unix`);
_STAMP = (
    r"(?:[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d(?:\.\d+)?"
    r"|(?:[A-Z][a-z]{2} )?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d\S*(?: [A-Z][A-Za-z0-9+-]{1,5})?"
    r"|\d{9,11}\.\d+)"
)
_SYSLOG = re.compile(_STAMP + r" \S+ ")
# - a tag alone at the start (`kernel: ...`, `alice[4242]: ...`), or after a dmesg-style stamp
#   and a host (`journalctl -o short-monotonic`: `[ 1234.5] gw1 alice[4242]: ...`); the kernel
#   prints no `NAME[PID]:` of its own before the driver's words.
_TAG = re.compile(r"(?:\S+ )?([^\s:\[]+)(\[\d+\]): |(?:\S+ )?(kernel): ")
# - the kernel's own stamp, kept in a saved line: `[   34.193735] `, `[  +0.000844] `, and
#   `dmesg -T`'s `[Sun Jul 28 09:15:27 2024] `, `dmesg --time-format iso`'s
#   `2025-01-25T10:34:54,859532+00:00 `.
_UPTIME = re.compile(
    r"\s*(?:\[\s*\+?\d{1,10}\.\d{1,9}\]"
    r"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]\d+[+-]\d\d:?\d\d)\s?"
)


@dataclass(frozen=True, slots=True)
class Record:
    seq: int  # the kernel's sequence number (/dev/kmsg), or the line's number in a file
    uptime_us: int | None  # when it was printed, in microseconds since boot; None: unknown
    priority: int  # syslog level 0 (emerg) to 7 (debug); 6 (info) where the line has none
    message: str
    context: dict[str, str] = field(default_factory=dict)  # the continuation lines' KEY=value
    kernel: bool = True  # written by the kernel (its facility or tag says so)
    # Where the text the kernel printed begins in `message`, after a saved log's stamps, host
    # and tag: what reads a driver's line reads it from there and nowhere later, since a
    # kernel line may quote what a user chose (`tmpfs: Unknown parameter '...'`).
    start: int = 0


def _unescape(text: str) -> str:
    """The kernel writes bytes outside printable ASCII as \\xNN; decode them back to text
    (as UTF-8 where they are, else one character a byte), so the driver's text reads as it was
    printed. Control characters come back too: whatever shows a message (the API, `gpuwatch
    events`, the daemon's log) escapes them again."""
    if "\\x" not in text:
        return text
    raw = bytearray()
    last = 0
    for match in _ESCAPE.finditer(text):
        raw += text[last : match.start()].encode("utf-8", "surrogateescape")
        raw.append(int(match.group(1), 16))
        last = match.end()
    raw += text[last:].encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "replace")


def parse_record(chunk: bytes, line_number: int = 0) -> Record | None:
    """One record: a /dev/kmsg record with its continuation lines, or one line of a saved
    `dmesg` or of plain text. Numbered by the kernel's sequence number, or where `line_number`
    is given (a record in a file) by it: a file can mix the forms, and its lines are in order
    where sequence numbers from more than one boot are not. None for an empty line."""
    head, _, rest = chunk.partition(b"\n")
    head = head.rstrip(b"\r")[:MAX_RECORD_BYTES]
    match = _KMSG.match(head)
    if match is not None:
        context: dict[str, str] = {}
        for line in rest.split(b"\n"):
            if line.startswith(b" ") and b"=" in line:
                key, _, value = line[1:].decode("utf-8", "replace").partition("=")
                context[key] = value
        return Record(
            seq=line_number or int(match.group(2)),
            uptime_us=int(match.group(3)),
            priority=int(match.group(1)) & 7,
            message=_unescape(match.group(4).decode("utf-8", "replace")),
            context=context,
            kernel=int(match.group(1)) >> 3 == KERNEL_FACILITY,
        )
    # A saved log prints one message over several lines by indenting the lines after the
    # first (`dmesg` does): they are the same message.
    more = [line.strip() for line in rest.split(b"\n") if line.strip()]
    text = b"\n".join([head.strip(), *more])
    if not text:
        return None
    stamped = _DMESG.match(text)
    if stamped is not None:
        fraction = stamped.group(2).decode().ljust(6, "0")[:6]
        uptime = int(stamped.group(1)) * 1_000_000 + int(fraction)
        message = stamped.group(3).decode("utf-8", "replace")
        return Record(
            line_number,
            uptime,
            6,
            message,
            kernel=written_by_kernel(message),
            start=text_start(message),
        )
    message = text.decode("utf-8", "replace")
    return Record(
        line_number, None, 6, message, kernel=written_by_kernel(message), start=text_start(message)
    )


def text_start(line: str) -> int:
    """Where the kernel's own text begins in a saved log's line: after its priority, `dmesg
    -x` columns, syslog or journal stamp and host, `kernel: ` tag and uptime stamp."""
    pos = 0
    for pattern in (_PRI, _DMESG_X, _UPTIME, _SYSLOG, _TAG, _UPTIME):
        match = pattern.match(line, pos)
        if match is not None and (pattern is not _TAG or match.group(3) == "kernel"):
            pos = match.end()
            while pos < len(line) and line[pos] == " ":
                pos += 1
    return pos


def written_by_kernel(line: str) -> bool:
    """Whether a saved log's line is the kernel's, by what its start says of its writer; a
    line that says nothing of it (a bare `NVRM: ...`, as dmesg prints) is the kernel's."""
    pri = _PRI.match(line)
    if pri is not None:
        return int(pri.group(1)) >> 3 == KERNEL_FACILITY
    column = _DMESG_X.match(line)
    if column is not None:
        return column.group(1) == "kern"
    header = _SYSLOG.match(line)
    if header is not None:
        return line.startswith("kernel: ", header.end())
    tag = _TAG.match(line)
    return tag is None or tag.group(3) == "kernel"


def split_records(data: bytes) -> Iterator[tuple[bytes, int]]:
    """Complete records in a file's bytes: each with its continuation lines, and the offset
    just past it. A last line without its newline is not complete yet (the writer is
    mid-line). A writer puts a record and its continuation lines in one write, as the
    kernel hands them out in one read."""
    start = 0
    pos = 0
    size = len(data)
    while pos < size:
        end = data.find(b"\n", pos)
        if end < 0:
            return  # a line still being written
        nxt = end + 1
        if nxt < size and data[nxt : nxt + 1] == b" ":
            pos = nxt  # a continuation line follows: part of this record
            continue
        yield data[start:end], nxt
        start = pos = nxt
