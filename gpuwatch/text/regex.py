"""The one regular-expression engine for everything a user writes: RE2, as Prometheus and
Alertmanager use it (Go's regexp is RE2).

Python's `re` backtracks: a silence `rank=~"(a+)+b"` met by a 28-character label stalled the
event loop for seconds, and `[[:digit:]]` or `foo((?i)bar)` meant something else than in
Prometheus. RE2 runs in time linear in the input, with bounded memory, and has Go's syntax."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Protocol

import re2


class Match(Protocol):
    def group(self, key: int | str = 0) -> str | None: ...

    def start(self) -> int: ...

    def end(self) -> int: ...


class Regex(Protocol):
    @property
    def pattern(self) -> str: ...

    def fullmatch(self, text: str) -> Match | None: ...

    def search(self, text: str) -> Match | None: ...

    def finditer(self, text: str) -> Iterator[Match]: ...


class RegexError(ValueError):
    """A pattern RE2 does not accept; the message is RE2's."""

    @property
    def go_message(self) -> str:
        """The message as Go's regexp words it: error parsing regexp: missing closing ): `(`."""
        reason, _, fragment = str(self).partition(": ")
        if reason == "trailing \\":
            reason, fragment = "trailing backslash at end of expression", ""
        reason = _GO_REASONS.get(reason, reason)
        return f"error parsing regexp: {reason}: `{fragment}`"


# RE2's C++ wording -> Go's regexp/syntax wording for the same error
_GO_REASONS = {
    "missing )": "missing closing )",
    "missing ]": "missing closing ]",
    "bad repetition operator": "invalid nested repetition operator",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid repetition size": "invalid repeat count",
    "invalid named capture group": "invalid named capture",
}


MAX_MEM = 8 << 20  # RE2's default budget per pattern; past it, compiling fails


def compile_regex(pattern: str, *, dot_matches_newline: bool = False) -> Regex:
    """`pattern` for full matches. Prometheus's label matchers let `.` match a newline;
    Alertmanager's do not."""
    options = re2.Options()
    options.log_errors = False  # an error is raised to the caller, not printed on stderr
    options.dot_nl = dot_matches_newline
    options.max_mem = MAX_MEM
    try:
        compiled: Regex = re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        text = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise RegexError(text) from None
    return compiled


# $$, ${name} and $name, names of letters, digits and underscores; anything else is text
_REFERENCE = re.compile(r"\$(\$|\{(\w+)\}|(\w+))")


def expand_replacement(template: str, match: Match) -> str:
    """Go's regexp.Expand, as label_replace and reReplaceAll use it: $1, ${1}, $name and
    ${name} are the group (empty when there is no such group), $$ is a dollar."""

    def ref(m: re.Match[str]) -> str:
        if m.group(1) == "$":
            return "$"
        key = m.group(2) if m.group(2) is not None else m.group(3)
        index = int(key) if key.isascii() and key.isdigit() else None
        try:
            group = match.group(key if index is None else index)
        except (IndexError, KeyError):
            return ""
        return group or ""

    return _REFERENCE.sub(ref, template)
