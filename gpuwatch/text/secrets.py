"""Secret values (webhook URLs, routing keys) from the config, an environment variable or a
file. A Secret never shows its value in repr, str, logs or `config check` output."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PLACEHOLDER_PREFIX = "<not shown: "  # what `config check` prints for an inline secret


class Secret:
    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source  # how it was given, safe to show: "inline", "env:NAME", "file:PATH"

    def reveal(self) -> str:
        """The value, for the one place that sends it."""
        return self._value

    def __repr__(self) -> str:
        return f"<secret from {self.source}>"

    __str__ = __repr__

    def as_config(self) -> str | dict[str, str]:
        """How the config gives it, for `config check`: `{env: NAME}` or `{file: PATH}` as
        written; a value given inline is never printed, and the placeholder says so."""
        kind, _, ref = self.source.partition(":")
        if kind in ("env", "file"):
            return {kind: ref}
        return f"{PLACEHOLDER_PREFIX}given {self.source}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def parse_secret(value: Any, base: Path) -> Secret:
    """A plain string, `{env: NAME}` or `{file: PATH}` (relative to the config file)."""
    if isinstance(value, str) and value.startswith(PLACEHOLDER_PREFIX):
        # `config check` output loaded back: a token "<not shown: ...>" would be accepted
        # and every sender refused, so the placeholder is an error here.
        raise ValueError(f"{value} is the placeholder `config check` prints; give the value")
    if isinstance(value, str) and value:
        return Secret(value, "inline")
    if isinstance(value, dict) and len(value) == 1:
        ((kind, ref),) = value.items()
        if kind == "env" and isinstance(ref, str) and ref:
            found = os.environ.get(ref)
            if not found:
                raise ValueError(f"environment variable {ref} is not set or empty")
            return Secret(found, f"env:{ref}")
        if kind == "file" and isinstance(ref, str) and ref:
            path = Path(ref) if Path(ref).is_absolute() else base / ref
            try:
                text = path.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(f"cannot read {path}: {exc.strerror}") from exc
            if not text:
                raise ValueError(f"{path} is empty")
            return Secret(text, f"file:{path}")
    raise ValueError("expected a string, {env: VARIABLE} or {file: PATH}")
