"""What a template function is to the executor: its Python code, the Go types of its
parameters (which Go checks its arguments against), and its errors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class FuncError(Exception):
    """A function's error: Go prints it after "error calling NAME: "."""


class Context(Protocol):
    """What the functions that look outside the template need."""

    @property
    def time(self) -> float: ...

    @property
    def external_url(self) -> str: ...

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]: ...


@dataclass(frozen=True, slots=True)
class Func:
    fn: Callable[..., object]
    params: tuple[str, ...]  # Go types: string, float64, any, template.queryResult, ...
    variadic: str | None = None  # the type of the ... parameters
    needs_context: bool = False
