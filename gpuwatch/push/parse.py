"""Pushed bodies to samples, with every rule a user can break checked and named.

Two forms: Prometheus's text exposition format (job from the URL), and a small JSON form:

    {"job": "llama", "labels": {"rank": "0"}, "metrics": {"train_step": 1200, "train_loss": 2.31}}

Values may be NaN or ±Inf (a NaN loss is what TrainingLossNaN looks for; in JSON write NaN,
Infinity, or the strings "NaN", "+Inf", "-Inf"). Label values must be strings.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from gpuwatch.model import HARDWARE_PREFIXES, Labels, Sample

# Matched whole (fullmatch): with match() and "$", a name ending in a newline passed, and one
# such name in /metrics broke the exposition for the whole node.
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127}")
# Label names that mean something to the daemon, its verdict, its routes or Prometheus: a
# job's series carrying one would speak for a GPU, a cause or another node. As Prometheus does
# with a scraped label that clashes with a target's, a pushed one is kept as `exported_NAME`.
RESERVED_LABELS = frozenset({"cause", "uuid", "gpu", "node", "instance", "alertname",
                             "alertstate", "severity", "provenance", "pci_bus_id"})  # fmt: skip
MAX_LABEL_VALUE = 1024
MAX_LABELS_PER_SERIES = 32  # beside `job`; Prometheus's label_limit, set as a scrape might
SPECIAL_VALUES = {"NaN": math.nan, "+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf}


_NAMES: dict[str, str] = {}  # one string per metric and label name, shared by every job's series
_MAX_NAMES = 4096


def _shared(name: str) -> str:
    """The one copy of a name: 10,000 jobs pushing `train_step` hold one string, not 10,000
    (each parse makes its own). Bounded: cleared, not grown, past _MAX_NAMES."""
    if len(_NAMES) >= _MAX_NAMES and name not in _NAMES:
        _NAMES.clear()
    return _NAMES.setdefault(name, name)


class PushError(Exception):
    """A push refused; `status` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str, job: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.job = job  # when known: for the log line of a refused push


def check_job(job: Any) -> str:
    if not isinstance(job, str) or not JOB_NAME.fullmatch(job):
        raise PushError(400, f"job: expected a name of letters, digits and ._:@/-, got {job!r}")
    return job


def _check_name(name: str) -> None:
    if not METRIC_NAME.fullmatch(name):
        raise PushError(400, f"metric name {name!r} is not a valid Prometheus name")
    if name.startswith(HARDWARE_PREFIXES):
        raise PushError(
            400,
            f"metric name {name!r}: names starting with gpuwatch_ or gpuwatch: are the "
            "daemon's own",
        )


def _labels(job: str, raw: dict[str, Any], where: str) -> Labels:
    if len(raw) > MAX_LABELS_PER_SERIES:
        raise PushError(
            400, f"{where}: {len(raw)} labels; a series may have {MAX_LABELS_PER_SERIES}"
        )
    out: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not LABEL_NAME.fullmatch(key) or key.startswith("__"):
            raise PushError(
                400, f"{where}: label name {key!r} is not a valid Prometheus label name"
            )
        if not isinstance(value, str):
            raise PushError(400, f"{where}: label {key!r} must have a string value, got {value!r}")
        if not _utf8(value):
            raise PushError(400, f"{where}: label {key!r} is not valid UTF-8 text")
        if len(value) > MAX_LABEL_VALUE:
            raise PushError(
                400, f"{where}: label {key!r} is longer than {MAX_LABEL_VALUE} characters"
            )
        out[_shared(_exported(key, raw, out))] = value
    out["job"] = job
    return tuple(sorted(out.items()))


def _exported(key: str, raw: dict[str, Any], out: dict[str, str]) -> str:
    """A reserved name as `exported_NAME`, prefixed again while that is taken (the job's own
    `exported_gpu` stays as it was), as Prometheus renames a clash."""
    if key not in RESERVED_LABELS:
        return key
    name = "exported_" + key
    while name in raw or name in out:
        name = "exported_" + name
    return name


def _utf8(text: str) -> bool:
    """JSON may carry a lone surrogate ("\\ud800"), which no exposition can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _value(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise PushError(400, f"{where}: expected a number, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value in SPECIAL_VALUES:
        return SPECIAL_VALUES[value]
    raise PushError(400, f"{where}: expected a number, NaN, +Inf or -Inf, got {value!r}")


@dataclass(frozen=True, slots=True)
class TextShape:
    """What a text body can cost to parse, counted without parsing it: its sample lines (at
    least the series it carries), and the `=` signs in them (at least its label pairs, in
    all and on one line: the parser accepts `a = "x"`, so `="` is no count)."""

    lines: int
    equals: int
    most_on_a_line: int


def text_shape(body: bytes) -> TextShape:
    lines = equals = most = 0
    for line in body.split(b"\n"):
        if not line.strip() or line.lstrip().startswith(b"#"):
            continue
        lines += 1
        here = line.count(b"=")
        equals += here
        most = max(most, here)
    return TextShape(lines, equals, most)


def parse_text(body: bytes, job: str) -> list[Sample]:
    """Prometheus text format; every series gains (or has overridden) the label job."""
    # Imported at the first text push: prometheus_client's package costs 4.4 MiB of resident
    # set, and the job library pushes JSON.
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = body.decode("utf-8")
        # TYPE lines are dropped: the parser would rename a counter's samples to *_total, and
        # pushed series keep exactly the names they were pushed with.
        text = "".join(
            line for line in text.splitlines(keepends=True) if not line.startswith("# TYPE")
        )
        families = list(text_string_to_metric_families(text))
    except (UnicodeDecodeError, ValueError, IndexError, KeyError, TypeError) as exc:
        raise PushError(400, f"not valid Prometheus text format: {exc}") from exc
    out: list[Sample] = []
    for family in families:
        for s in family.samples:
            _check_name(s.name)
            labels = _labels(job, dict(s.labels), s.name)
            out.append(Sample(_shared(s.name), labels, float(s.value)))
    return out


def parse_json(body: bytes) -> tuple[str, list[Sample]]:
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise PushError(400, f"not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise PushError(400, "not valid JSON: nested too deeply") from exc
    if not isinstance(data, dict):
        raise PushError(400, 'expected {"job": ..., "labels": {...}, "metrics": {name: value}}')
    job = check_job(data.get("job"))
    raw_labels = data.get("labels", {})
    metrics = data.get("metrics")
    if not isinstance(raw_labels, dict):
        raise PushError(400, "labels: expected an object of label names to string values")
    if not isinstance(metrics, dict) or not metrics:
        raise PushError(400, "metrics: expected an object of metric names to values")
    try:
        labels = _labels(job, raw_labels, "labels")
        out = []
        for name, value in metrics.items():
            _check_name(name)
            out.append(Sample(_shared(name), labels, _value(value, name)))
    except PushError as exc:
        exc.job = job
        raise
    return job, out
