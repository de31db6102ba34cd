"""A scenario file's faults, each checked against its kind and the node it runs on."""

from __future__ import annotations

from typing import Any

from gpuwatch.sim.cdefs import ERRORS
from gpuwatch.sim.faults import (
    AER_SEVERITIES,
    DEFAULT_COUNT,
    DEFAULT_RATE,
    ERROR_FAULT_KINDS,
    FABRIC_CONDITIONS,
    FABRIC_FAULT_KINDS,
    FAULT_KINDS,
    HOST_FAULT_KINDS,
    IB_FAULT_KINDS,
    NVLINK_FAULT_KINDS,
    Fault,
)
from gpuwatch.sim.xids import XID_KEYS, xid_details
from gpuwatch.text.units import parse_duration
from gpuwatch.text.yamlfile import (
    Checker,
    PathKey,
    boolean,
    one_of,
    whole_number,
)


def _kind(value: Any) -> str:
    if value not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {value!r}; expected one of: {', '.join(FAULT_KINDS)}")
    return str(value)


def _gpus(gpus: int) -> Any:
    """A fault's `gpu`: an index, or `all` (a hang every rank shares, a driver gone)."""
    one = whole_number(0, gpus - 1)

    def parse(value: Any) -> tuple[int, ...]:
        if value == "all":
            return tuple(range(gpus))
        try:
            return (one(value),)
        except ValueError:
            message = f"expected a GPU index from 0 to {gpus - 1} or all, got {value!r}"
            raise ValueError(message) from None

    return parse


def _positive(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise ValueError(f"must be a number of errors a second, 0 or more: {value!r}")
    return float(value)


def read_fault(
    c: Checker, raw: Any, path: PathKey, gpus: int, *, ib_ports: int, nvswitches: int
) -> list[Fault]:
    """The fault at `path`, one for each GPU it hits; none when it has problems."""
    before = len(c.problems)
    data = c.section(
        raw,
        path,
        (
            "kind",
            "gpu",
            "at",
            "duration",
            "code",
            "error",
            "action",
            "rate",
            "count",
            "link",
            "port",
            "switch",
            "fatal",
            "condition",
            "severity",
            *XID_KEYS,
        ),
    )
    if not data:
        return []
    has_kind = c.require(data, path, "kind", "the fault kind")
    kind = c.value(data, path, "kind", _kind, "")
    if kind in FABRIC_FAULT_KINDS and kind not in HOST_FAULT_KINDS and not nvswitches:
        c.problems.append(c.doc.problem((*path, "kind"), f"{kind} needs node.nvswitches"))
    condition = _only(
        c,
        data,
        path,
        "condition",
        kind=kind,
        kinds=("fabric_degraded",),
        parse=one_of(FABRIC_CONDITIONS),
    )
    severity = _only(
        c, data, path, "severity", kind=kind, kinds=("pcie_aer",), parse=one_of(AER_SEVERITIES)
    )
    if kind in HOST_FAULT_KINDS:
        return _host_fault(c, data, path, kind, sizes=(ib_ports, nvswitches), before=before)
    has_gpu = c.require(data, path, "gpu", "the index of the GPU the fault hits, or all")
    on = c.value(data, path, "gpu", _gpus(gpus), (0,))
    at = c.value(data, path, "at", parse_duration, 0.0)
    duration = c.value(data, path, "duration", parse_duration, None)
    code = None
    for key in ("port", "switch", "fatal"):
        if key in data:
            c.problems.append(c.doc.problem((*path, key), f"only host faults take a {key}"))
    details: dict[str, Any] = {}
    if kind == "xid" and c.require(data, path, "code", "the XID number"):
        code = c.value(data, path, "code", whole_number(1, 65535), None)
        details = xid_details(c, data, path, code)
    elif kind != "xid":
        c.problems += [
            c.doc.problem((*path, k), f"only xid faults take {k}")
            for k in ("code", "unit", "instance")
            if k in data
        ]
    error = None
    if (
        kind in ERROR_FAULT_KINDS and c.require(data, path, "error", "the NVML error, e.g. UNKNOWN")
    ) or kind == "fabric_unregistered":
        error = c.value(data, path, "error", one_of(tuple(ERRORS)), None)
    elif "error" in data:
        c.problems.append(
            c.doc.problem(
                (*path, "error"),
                "only nvml_error, event_wait_error and fabric_unregistered take an error",
            )
        )
    action = None
    if kind == "recovery_action":
        action = c.value(data, path, "action", whole_number(0, 7), 1)
    elif "action" in data:
        c.problems.append(c.doc.problem((*path, "action"), "only recovery_action takes an action"))
    rate = _only(c, data, path, "rate", kind=kind, kinds=tuple(DEFAULT_RATE), parse=_positive)
    count = _only(
        c, data, path, "count", kind=kind, kinds=tuple(DEFAULT_COUNT), parse=whole_number(0, 10**9)
    )
    link = (
        details.get("link")
        if kind == "xid"
        else _only(
            c, data, path, "link", kind=kind, kinds=NVLINK_FAULT_KINDS, parse=whole_number(0, 17)
        )
    )
    if len(c.problems) > before or not (has_kind and has_gpu):
        return []
    return [
        Fault(
            kind,
            g,
            at,
            duration,
            code,
            error,
            action,
            rate,
            count,
            link or 0,
            condition=condition or "degraded_bandwidth",
            severity=severity or "fatal",
            unit=details.get("unit", ""),
            instance=details.get("instance"),
        )
        for g in on
    ]


def _host_fault(
    c: Checker,
    data: dict[str, Any],
    path: PathKey,
    kind: str,
    *,
    sizes: tuple[int, int],
    before: int,
) -> list[Fault]:
    """A fault of an InfiniBand port or an NVSwitch: it names its port or switch, not a GPU.
    `sizes`: the node's InfiniBand ports and NVSwitches."""
    ib_ports, nvswitches = sizes
    at = c.value(data, path, "at", parse_duration, 0.0)
    duration = c.value(data, path, "duration", parse_duration, None)
    for key in ("gpu", "error", "action", "link"):
        if key in data:
            c.problems.append(c.doc.problem((*path, key), f"{kind} hits no GPU: no {key}"))
    if kind != "sxid":
        c.problems += [
            c.doc.problem((*path, k), f"only sxid takes a {k}")
            for k in ("switch", "fatal", "code")
            if k in data
        ]
    if kind in IB_FAULT_KINDS:
        if not ib_ports:
            c.problems.append(c.doc.problem((*path, "kind"), f"{kind} needs node.ib_ports"))
            return []
        port = c.value(data, path, "port", whole_number(0, ib_ports - 1), 0)
        rate = _only(c, data, path, "rate", kind=kind, kinds=tuple(DEFAULT_RATE), parse=_positive)
        count = _only(
            c,
            data,
            path,
            "count",
            kind=kind,
            kinds=tuple(DEFAULT_COUNT),
            parse=whole_number(0, 10**9),
        )
        if len(c.problems) > before:
            return []
        return [Fault(kind, 0, at, duration, rate=rate, count=count, port=port)]
    if not nvswitches:
        c.problems.append(c.doc.problem((*path, "kind"), f"{kind} needs node.nvswitches"))
        return []
    if kind == "fabric_manager_down":
        return [] if len(c.problems) > before else [Fault(kind, 0, at, duration)]
    switch = c.value(data, path, "switch", whole_number(0, nvswitches - 1), 0)
    code = c.value(data, path, "code", whole_number(1, 99999), 12028)
    fatal = c.value(data, path, "fatal", boolean, True)
    if len(c.problems) > before:
        return []
    return [Fault(kind, 0, at, duration, code=code, switch=switch, fatal=fatal)]


def _only(
    c: Checker,
    data: dict[str, Any],
    path: PathKey,
    key: str,
    *,
    kind: str,
    kinds: tuple[str, ...],
    parse: Any,
) -> Any:
    """A field only some kinds take: its value, or a problem naming the kinds that do."""
    if key not in data:
        return None
    if kind not in kinds:
        verb = "takes" if len(kinds) == 1 else "take"
        c.problems.append(c.doc.problem((*path, key), f"only {', '.join(kinds)} {verb} a {key}"))
        return None
    return c.value(data, path, key, parse, None)
