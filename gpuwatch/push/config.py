"""The `push:` section of the config: job metrics pushed over HTTP or the push socket, or read
from a textfile directory, and the limits that keep a job from swamping the daemon."""

from __future__ import annotations

import grp
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwatch.push.registry import PushLimits
from gpuwatch.text.secrets import Secret, parse_secret
from gpuwatch.text.yamlfile import Checker, YamlDoc, file_path, positive_duration, whole_number


@dataclass(frozen=True, slots=True)
class PushConfig:
    """Job metrics pushed by training processes, or read from a textfile directory."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_series_per_job: int = 1000
    max_series: int = 10000
    stale_after: float = 300.0
    token: Secret | None = None  # bearer token that opens /api/v1/push on the TCP listener
    textfile_dir: str | None = None
    # The push socket: pushes only, for every local user's jobs unless narrowed to a group.
    socket: str | None = None  # None: push.sock beside the control socket
    socket_mode: int = 0o666
    socket_group: int | None = None  # a gid; the config may name the group

    @property
    def limits(self) -> PushLimits:
        return PushLimits(
            self.max_body_bytes, self.max_series_per_job, self.max_series, self.stale_after
        )


def _file_mode(value: Any) -> int:
    """Permission bits as an operator writes them: '0660' (a string, or YAML's 0660, which
    YAML reads as octal) or 0o660."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0o777:
        return value
    if isinstance(value, str) and re.fullmatch(r"0?o?[0-7]{3}", value):
        return int(value[-3:], 8)
    raise ValueError(f"expected file permissions such as '0660', got {value!r}")


def _group(value: Any) -> int:
    """A group name or number, as the gid the socket is given. A number need not have a name
    (containers often lack /etc/group entries); "1000", quoted, is the number too."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, str) and value:
        try:
            return grp.getgrnam(value).gr_gid
        except KeyError:
            raise ValueError(f"no group named {value!r} on this host") from None
    raise ValueError(f"expected a group name or number, got {value!r}")


def parse_push(r: Checker, doc: YamlDoc, raw: Any) -> PushConfig:
    pu = r.section(
        raw,
        ("push",),
        (
            "max_body_bytes",
            "max_series_per_job",
            "max_series",
            "stale_after",
            "token",
            "textfile_dir",
            "socket",
            "socket_mode",
            "socket_group",
        ),
    )
    base_dir = Path(doc.file).parent
    push = PushConfig(
        max_body_bytes=r.value(
            pu, ("push",), "max_body_bytes", whole_number(1024, 2**30), 4 * 1024 * 1024
        ),
        max_series_per_job=r.value(
            pu, ("push",), "max_series_per_job", whole_number(1, 10**6), 1000
        ),
        max_series=r.value(pu, ("push",), "max_series", whole_number(1, 10**7), 10000),
        stale_after=r.value(pu, ("push",), "stale_after", positive_duration, 300.0),
        token=r.value(pu, ("push",), "token", lambda v: parse_secret(v, base_dir), None),
        textfile_dir=r.value(pu, ("push",), "textfile_dir", file_path(doc.file, "directory"), None),
        socket=r.value(pu, ("push",), "socket", file_path(doc.file, "socket"), None),
        socket_mode=r.value(pu, ("push",), "socket_mode", _file_mode, 0o666),
        socket_group=r.value(pu, ("push",), "socket_group", _group, None),
    )
    return push
