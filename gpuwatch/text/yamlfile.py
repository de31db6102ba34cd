"""YAML loading that remembers where each key came from, so errors can name the line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpuwatch.text.units import parse_duration

PathKey = tuple[str | int, ...]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a file: where, which field, and what was expected."""

    file: str
    line: int | None
    field: str
    message: str
    column: int | None = None  # where the value starts, when the message is about its text

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        where += f":{self.column}" if self.line and self.column else ""
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


class FileError(Exception):
    """A file could not be used; carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


@dataclass
class YamlDoc:
    """Parsed YAML plus the line of every mapping key and sequence item."""

    file: str
    data: Any
    lines: dict[PathKey, int] = field(default_factory=dict)
    # Where each mapping's scalar value starts, (line, column), as promtool places an error
    # in an expression: `expr: |` at the `|`.
    values: dict[PathKey, tuple[int, int]] = field(default_factory=dict)

    def line(self, path: PathKey) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None

    def problem(self, path: PathKey, message: str) -> Problem:
        return Problem(self.file, self.line(path), dotted(path), message)


def dotted(path: PathKey) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _record_lines(
    node: yaml.Node, path: PathKey, doc: YamlDoc, duplicates: list[tuple[int, str]]
) -> None:
    """Where each field is, and every key a mapping holds twice: PyYAML keeps the last one
    silently, Prometheus refuses the file, and an operator's `expr:` written twice must not
    quietly become the second."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key, line = str(key_node.value), key_node.start_mark.line + 1
            if key in seen:
                duplicates.append(
                    (line, f'mapping key "{key}" already defined at line {seen[key]}')
                )
            seen.setdefault(key, line)
            sub = (*path, key)
            doc.lines[sub] = line
            if isinstance(value_node, yaml.ScalarNode):
                mark = value_node.start_mark
                doc.values[sub] = (mark.line + 1, mark.column + 1)
            _record_lines(value_node, sub, doc, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            sub = (*path, i)
            doc.lines[sub] = item.start_mark.line + 1
            _record_lines(item, sub, doc, duplicates)


def parse(text: str, file: str) -> YamlDoc:
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        raise FileError([Problem(file, line, "", f"not valid YAML: {exc.problem}")]) from exc
    except yaml.YAMLError as exc:
        raise FileError([Problem(file, None, "", f"not valid YAML: {exc}")]) from exc
    doc = YamlDoc(file, data)
    if root is not None:
        duplicates: list[tuple[int, str]] = []
        _record_lines(root, (), doc, duplicates)
        if duplicates:
            raise FileError([Problem(file, line, "", message) for line, message in duplicates])
    return doc


def load(path: str | Path) -> YamlDoc:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FileError([Problem(str(path), None, "", f"cannot read: {exc.strerror}")]) from exc
    return parse(text, str(path))


class Checker:
    """Walks a parsed file, converting fields and collecting every problem."""

    def __init__(self, doc: YamlDoc) -> None:
        self.doc = doc
        self.problems: list[Problem] = []

    def section(self, data: Any, path: PathKey, known: tuple[str, ...]) -> dict[str, Any]:
        if data is None:
            return {}
        if not isinstance(data, dict):
            shown = repr(data)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            message = f"expected a mapping, got {shown}" if path else "the file must be a mapping"
            self.problems.append(self.doc.problem(path, message))
            return {}
        for key in data:
            if key not in known:
                self.problems.append(
                    self.doc.problem(
                        (*path, str(key)),
                        f"unknown key; expected one of: {', '.join(known)}",
                    )
                )
        return data

    def value(
        self,
        data: dict[str, Any],
        path: PathKey,
        key: str,
        convert: Callable[[Any], T],
        default: T,
    ) -> T:
        if key not in data or data[key] is None:
            return default
        try:
            return convert(data[key])
        except (ValueError, TypeError) as exc:
            self.problems.append(self.doc.problem((*path, key), str(exc)))
            return default

    def require(self, data: dict[str, Any], path: PathKey, key: str, what: str) -> bool:
        if key in data and data[key] is not None:
            return True
        self.problems.append(self.doc.problem(path, f"missing {key!r} ({what})"))
        return False

    def check(self) -> None:
        if self.problems:
            raise FileError(self.problems)


def one_of(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {value!r}")
        return str(value)

    return convert


def whole_number(low: int, high: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"expected a whole number from {low} to {high}, got {value!r}")
        return value

    return convert


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def http_url(value: Any) -> str:
    if not text(value).startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return str(value)


def positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be greater than zero, got {value!r}")
    return seconds


def relative_to(config_file: str, path: str) -> str:
    return path if Path(path).is_absolute() else str(Path(config_file).parent / path)


def plain_path(value: Any) -> str:
    """A path taken as written (the state directory: relative to where gpuwatch runs)."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise ValueError(f"expected a path, got {value!r}")
    return value


def file_path(config_file: str, what: str) -> Callable[[Any], str]:
    """One path (`what`: "directory", "file"...); a relative one is relative to the config
    file."""

    def convert(value: Any) -> str:
        if not isinstance(value, str) or not value or "\0" in value:
            raise ValueError(f"expected a {what} path, got {value!r}")
        return relative_to(config_file, value)

    return convert
