"""Label matchers in Alertmanager's syntax: `severity="critical"`, `alertname=~"Gpu.*"`,
`gpu!="3"`, `job!~"test.*"`. Regular expressions are RE2 and anchored, as in Alertmanager."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuwatch.text.regex import Regex, RegexError, compile_regex

_MATCHER = re.compile(
    r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^\s",{}]*))\s*$'
)
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True, slots=True)
class Matcher:
    name: str
    op: str  # one of = != =~ !~
    value: str
    pattern: Regex | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.name, "")
        if self.pattern is not None:
            found = self.pattern.fullmatch(have) is not None
            return found if self.op == "=~" else not found
        return (have == self.value) if self.op == "=" else (have != self.value)

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op}"{escaped}"'


def parse_matcher(text: str) -> Matcher:
    """One matcher; ValueError says what is wrong with it."""
    if not isinstance(text, str):
        raise ValueError(f'expected a matcher such as severity="critical", got {text!r}')
    found = _MATCHER.match(text)
    if found is None:
        raise ValueError(f'not a matcher: {text!r}; expected name="value", !=, =~ or !~')
    name, op, quoted, bare = found.groups()
    value = (
        re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m.group(0)], quoted) if quoted is not None else bare
    )
    pattern = None
    if op in ("=~", "!~"):
        try:
            pattern = compile_regex(value)
        except RegexError as exc:
            raise ValueError(f"{text!r}: bad regular expression: {exc} (RE2 syntax)") from None
    return Matcher(name, op, value, pattern)


def matches_all(matchers: tuple[Matcher, ...], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)
