"""Alert templates as Prometheus expands them: Go's text/template with Prometheus's functions.

A template is parsed when its rule file loads, with the definitions Prometheus puts before
every alert template (`$labels`, `$externalLabels`, `$externalURL`, `$value`), so a template
Prometheus would refuse is refused at load with the same line, and a run-time error reads as
Prometheus's: `<error expanding template: ...>` in place of the text."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuwatch.rules.template.execute import ExecError, Executor
from gpuwatch.rules.template.functions import FUNCTIONS, FuncError
from gpuwatch.rules.template.lex import TemplateError
from gpuwatch.rules.template.parse import parse
from gpuwatch.rules.template.values import AlertData

__all__ = ["QueryFn", "Template", "TemplateData", "TemplateError"]

QueryFn = Callable[[str, float], list[tuple[dict[str, str], float]]]

_DEFS = (
    "{{$labels := .Labels}}",
    "{{$externalLabels := .ExternalLabels}}",
    "{{$externalURL := .ExternalURL}}",
    "{{$value := .Value}}",
)
_PREFIX = "".join(_DEFS)


@dataclass(frozen=True, slots=True)
class TemplateData:
    labels: Mapping[str, str]
    value: float
    external_labels: Mapping[str, str]
    external_url: str = ""
    query: QueryFn | None = None  # an instant query at `time`, for the `query` function
    time: float = 0.0


class _Context:
    __slots__ = ("data",)

    def __init__(self, data: TemplateData) -> None:
        self.data = data

    @property
    def time(self) -> float:
        return self.data.time

    @property
    def external_url(self) -> str:
        return self.data.external_url

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        if self.data.query is None:
            raise FuncError("no query engine")
        return self.data.query(expr, self.data.time)


class Template:
    """A compiled alert template; expand() never raises for data it is given."""

    def __init__(self, source: str, name: str = "__alert_") -> None:
        self.source = source
        self.name = name
        self.is_static = "{{" not in source
        if self.is_static:
            return
        self._text = _PREFIX + source
        try:
            self._tree = parse(self._text, name, FUNCTIONS)
        except TemplateError as exc:
            raise TemplateError(f"{name}:{exc}") from None
        self._body = self._tree.root[len(_DEFS) :]

    @classmethod
    def literal(cls, text: str) -> Template:
        """Text that is never expanded (a recording rule's labels)."""
        template = cls.__new__(cls)
        template.source, template.name, template.is_static = text, "", True
        return template

    def expand(self, data: TemplateData) -> str:
        if self.is_static:
            return self.source
        dot = AlertData(data.labels, data.external_labels, data.external_url, data.value)
        variables: list[tuple[str, object]] = [
            ("$", dot),
            ("$labels", dot.Labels),
            ("$externalLabels", dot.ExternalLabels),
            ("$externalURL", dot.ExternalURL),
            ("$value", dot.Value),
        ]
        executor = Executor(self._tree, self.name, self._text, _Context(data))
        try:
            return executor.run(dot, variables, self._body)
        except (ExecError, RecursionError) as exc:
            return f"<error expanding template: error executing template {self.name}: {exc}>"
