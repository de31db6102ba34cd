"""Text from a process name, a label, a file or another daemon, made safe to print on a terminal
or hand to another program.

A process can name itself with ESC sequences (which move the cursor, retitle the window or
rewrite what was printed before) and newlines (which forge lines of `gpuwatch events`). Every
control character, and the Unicode controls that reorder or hide text, is shown as a visible
escape instead: `\\x1b`, `\\n`, `\\u202e`.

`one_line` is the form for what leaves gpuwatch as a single line (a Slurm drain reason, the
health check's line): its whitespace, line and record separators included, made single
spaces, every other control escaped, no NUL, and cut on a character, never inside one."""

from __future__ import annotations

import re
from typing import Any

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    named = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code)
    if named is not None:
        return named
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    return _UNSAFE.sub(_escape, text)


def one_line(text: str, limit: int | None = None) -> str:
    """`text` as one printable line of at most `limit` characters (ending "..." when cut)."""
    line = printable(" ".join(text.split()))  # split() takes \x1c-\x1f and U+2028 too
    if limit is not None and len(line) > limit:
        line = line[: limit - 3].rstrip() + "..." if limit > 3 else line[: max(0, limit)]
    return line


def printable_json(value: Any) -> Any:
    """`value` (parsed JSON) with every string, keys included, made printable."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(k)): printable_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_json(v) for v in value]
    return value
