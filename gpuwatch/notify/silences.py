"""Silences: matchers and a time window; a firing alert they match is not notified.

Kept in notify.db, so they survive restarts; created, listed and expired over the control
socket (`gpuwatch silence add|list|expire`)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatch.notify.db import NotifyDb
from gpuwatch.notify.matchers import Matcher, matches_all, parse_matcher
from gpuwatch.text.timefmt import parse_rfc3339, rfc3339
from gpuwatch.text.units import parse_duration

log = logging.getLogger(__name__)

# The longest a silence may last: a year covers a node awaiting an RMA; a silence for ever is a
# route or a rule to change (and "300000y" overflowed every time shown, failing each listing).
MAX_SILENCE_S = 366 * 86400.0


@dataclass(frozen=True, slots=True)
class Silence:
    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    created_by: str
    comment: str

    def state(self, now: float) -> str:
        if now < self.starts_at:
            return "pending"
        return "active" if now < self.ends_at else "expired"

    def silences(self, labels: Mapping[str, str], now: float) -> bool:
        return self.state(now) == "active" and matches_all(self.matchers, labels)


class Silences:
    def __init__(self, db: NotifyDb) -> None:
        self._db = db.db
        self._all: dict[str, Silence] = {}
        self.generation = 0  # changes whenever a silence is added or expired
        rows = self._db.execute(
            "SELECT id, matchers, starts_at, ends_at, created_by, comment FROM silences"
        )
        for id_, matchers, starts, stored_ends, by, comment in rows:
            parsed = tuple(parse_matcher(m) for m in json.loads(matchers))
            ends = stored_ends
            if not _within_bounds(starts, ends):  # stored by a release that let it through
                if not math.isfinite(starts):
                    log.warning("silence %s has no usable start; dropped", id_)
                    continue
                log.warning("silence %s lasts longer than a silence may; cut to that", id_)
                ends = starts + MAX_SILENCE_S
            self._all[id_] = Silence(id_, parsed, starts, ends, by, comment)

    def all(self) -> list[Silence]:
        return sorted(self._all.values(), key=lambda s: (s.starts_at, s.id))

    def add(
        self, matchers: tuple[Matcher, ...], starts_at: float, ends_at: float, by: str, comment: str
    ) -> Silence:
        if not matchers:
            raise ValueError("a silence needs at least one matcher")
        if ends_at <= starts_at:
            raise ValueError("a silence must end after it starts")
        if not _within_bounds(starts_at, ends_at):
            raise ValueError(
                f"a silence lasts at most {MAX_SILENCE_S / 86400:.0f} days; for longer,"
                " change the route or the rule"
            )
        import uuid  # here: silences are rare, and the daemon need not hold the module

        silence = Silence(str(uuid.uuid4()), matchers, starts_at, ends_at, by, comment)
        self._db.execute(
            "INSERT INTO silences VALUES (?,?,?,?,?,?)",
            (silence.id, json.dumps([str(m) for m in matchers]), starts_at, ends_at, by, comment),
        )
        self._all[silence.id] = silence
        self.generation += 1
        return silence

    def expire(self, silence_id: str, now: float) -> Silence:
        """End a silence now; KeyError when there is none with this id."""
        silence = self._all[silence_id]
        if silence.ends_at > now:
            silence = Silence(
                silence.id,
                silence.matchers,
                min(silence.starts_at, now),
                now,
                silence.created_by,
                silence.comment,
            )
            self._db.execute(
                "UPDATE silences SET starts_at = ?, ends_at = ? WHERE id = ?",
                (silence.starts_at, now, silence_id),
            )
            self._all[silence_id] = silence
            self.generation += 1
        return silence

    def silenced(self, labels: Mapping[str, str], now: float) -> bool:
        return any(s.silences(labels, now) for s in self._all.values())


def _within_bounds(starts_at: float, ends_at: float) -> bool:
    return (
        math.isfinite(starts_at)
        and math.isfinite(ends_at)
        and (ends_at - starts_at <= MAX_SILENCE_S)
    )


def silence_json(silence: Silence, now: float) -> dict[str, Any]:
    """Alertmanager's shape for a silence."""
    return {
        "id": silence.id,
        "matchers": [str(m) for m in silence.matchers],
        "startsAt": rfc3339(silence.starts_at),
        "endsAt": rfc3339(silence.ends_at),
        "createdBy": silence.created_by,
        "comment": silence.comment,
        "status": {"state": silence.state(now)},
    }


def silence_request(
    body: dict[str, Any], now: float
) -> tuple[tuple[Matcher, ...], float, float, str, str]:
    """(matchers, starts_at, ends_at, created_by, comment) from an API request; ValueError
    names the field that is wrong."""
    raw = body.get("matchers")
    if not isinstance(raw, list) or not raw:
        raise ValueError('matchers: expected a list such as ["alertname=\\"GpuXidCritical\\""]')
    matchers = tuple(parse_matcher(m) for m in raw)
    starts = now
    if "endsAt" in body:
        try:
            ends = parse_rfc3339(str(body["endsAt"]))
        except ValueError as exc:
            raise ValueError(f"endsAt: expected an RFC 3339 time, got {body['endsAt']!r}") from exc
    else:
        ends = now + parse_duration(body.get("duration", "2h"))
    by, comment = body.get("createdBy", ""), body.get("comment", "")
    if not isinstance(by, str) or not isinstance(comment, str):
        raise ValueError("createdBy and comment must be strings")
    return matchers, starts, ends, by or "unknown", comment
