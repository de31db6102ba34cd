"""The Go-template forms rule authors use in labels and annotations, compiled at load time.

Supported: text, {{ $labels.x }} / {{ .Labels.x }}, {{ $value }} / {{ .Value }},
{{ $externalLabels.x }}, the label maps whole ({{ $labels }}, printed as Go prints a map),
string and number literals, pipes, and the functions humanize, humanize1024,
humanizePercentage, humanizeDuration, printf, toUpper, toLower, title, safeHtml, stripPort,
stripDomain, urlQueryEscape. Anything else (if, range, with, define ...) is rejected when the
rule file loads.
"""

from __future__ import annotations

import ipaddress
import math
import re
import shlex
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuwatch.gofmt import format_g4, format_v


class TemplateError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class TemplateData:
    labels: Mapping[str, str]
    value: float
    external_labels: Mapping[str, str]


Arg = str | float
Operand = Callable[[TemplateData], Arg]

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def humanize(v: float) -> str:
    if v == 0 or math.isnan(v) or math.isinf(v):
        return format_g4(v)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return format_g4(v) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return format_g4(v) + prefix


def humanize_duration(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return format_g4(v)
    if v == 0:
        return format_g4(v) + "s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        whole = int(v)
        seconds, minutes = whole % 60, (whole // 60) % 60
        hours, days = (whole // 3600) % 24, whole // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{format_g4(v)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{format_g4(v)}{prefix}s"


def _number(arg: Arg) -> float:
    if isinstance(arg, float):
        return arg
    try:
        return float(arg)
    except ValueError:
        raise TemplateError(f"expected a number, got {arg!r}") from None


def _text(arg: Arg) -> str:
    return format_v(arg) if isinstance(arg, float) else arg


def _printf(*args: Arg) -> str:
    if not args or not isinstance(args[0], str):
        raise TemplateError("printf needs a format string first")
    fmt, values = args[0], args[1:]
    converted: list[object] = []
    for spec, value in zip(
        re.findall(r"%[-+ #0]*\d*(?:\.\d+)?([a-zA-Z%])", fmt), values, strict=False
    ):
        if spec in "feEgGd":
            number = _number(value)
            converted.append(int(number) if spec == "d" else number)
        else:
            converted.append(_text(value))
    try:
        return fmt.replace("%v", "%s") % tuple(converted)
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"printf {fmt!r}: {exc}") from None


def humanize_1024(v: float) -> str:
    if abs(v) <= 1 or math.isnan(v) or math.isinf(v):
        return format_g4(v)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return format_g4(v) + prefix


def split_host_port(text: str) -> tuple[str, str] | None:
    """Go's net.SplitHostPort: (host, port), or None where Go answers an error."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            return None
        host, port = text[1:end], text[end + 2 :]
    else:
        host, sep, port = text.rpartition(":")
        if not sep or ":" in host:
            return None
    if any(c in host for c in "[]") or any(c in port for c in "[]:"):
        return None
    return host, port


def _strip_port(text: str) -> str:
    split = split_host_port(text)
    return text if split is None else split[0]


def _strip_domain(text: str) -> str:
    """Prometheus's stripDomain: the host's first name, the port kept; an IP unchanged."""
    host, port = split_host_port(text) or (text, "")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return text
    host = host.split(".")[0]
    if not port:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


FUNCTIONS: dict[str, Callable[..., str]] = {
    "humanize1024": lambda v: humanize_1024(_number(v)),
    "safeHtml": _text,
    "stripPort": lambda v: _strip_port(_text(v)),
    "stripDomain": lambda v: _strip_domain(_text(v)),
    "urlQueryEscape": lambda v: urllib.parse.quote_plus(_text(v), safe="-_.~"),
    "humanize": lambda v: humanize(_number(v)),
    "humanizePercentage": lambda v: format_g4(_number(v) * 100) + "%",
    "humanizeDuration": lambda v: humanize_duration(_number(v)),
    "printf": _printf,
    "toUpper": lambda v: _text(v).upper(),
    "toLower": lambda v: _text(v).lower(),
    "title": lambda v: _text(v).title(),
}


def _lookup(attr: str, key: str) -> Operand:
    def get(d: TemplateData) -> Arg:
        mapping: Mapping[str, str] = getattr(d, attr)
        return mapping.get(key, "")  # Prometheus renders a missing label as ""

    return get


def go_map(mapping: Mapping[str, str]) -> str:
    """A map[string]string as Go's fmt prints it, keys sorted: map[instance:a job:node]."""
    return "map[" + " ".join(f"{k}:{mapping[k]}" for k in sorted(mapping)) + "]"


# The label maps a template can name, whole or one key (`$labels.job`), and where they are.
_MAPS = {
    "$labels": "labels",
    ".Labels": "labels",
    "$externalLabels": "external_labels",
    ".ExternalLabels": "external_labels",
}


def _operand(token: str) -> Operand:
    if token in ("$value", ".Value"):
        return lambda d: d.value
    if token in _MAPS:
        attr = _MAPS[token]
        return lambda d: go_map(getattr(d, attr))
    for name, attr in _MAPS.items():
        if token.startswith(name + "."):
            return _lookup(attr, token[len(name) + 1 :])
    if token.startswith(('"', "`")):
        text = token[1:-1]
        return lambda d: text
    if _NUMBER.fullmatch(token):
        number = float(token)
        return lambda d: number
    raise TemplateError(f"unsupported template term {token!r}")


def _command(words: list[str], piped: bool) -> Callable[[TemplateData, Arg | None], Arg]:
    head = words[0]
    if head in FUNCTIONS:
        fn = FUNCTIONS[head]
        operands = [_operand(w) for w in words[1:]]
        if not operands and not piped:
            raise TemplateError(f"{head} needs an argument")

        def apply(d: TemplateData, prev: Arg | None) -> Arg:
            args = [o(d) for o in operands]
            if prev is not None:
                args.append(prev)
            return fn(*args)

        return apply
    if len(words) != 1 or piped:
        raise TemplateError(f"unsupported template action {' '.join(words)!r}")
    operand = _operand(head)
    return lambda d, prev: operand(d)


def _split_words(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=False)
    lexer.whitespace_split = True
    lexer.quotes = '"`'
    try:
        return list(lexer)
    except ValueError as exc:
        raise TemplateError(f"{text.strip()!r}: {exc}") from None


def _pipeline(text: str) -> Callable[[TemplateData], str]:
    words = _split_words(text)
    commands: list[list[str]] = [[]]
    for word in words:
        if word == "|":
            commands.append([])
        else:
            commands[-1].append(word)
    if any(not c for c in commands):
        raise TemplateError(f"empty command in {{{{{text}}}}}")
    steps = [_command(c, piped=i > 0) for i, c in enumerate(commands)]

    def run(d: TemplateData) -> str:
        result: Arg | None = None
        for step in steps:
            result = step(d, result)
        return _text(result) if result is not None else ""

    return run


class Template:
    """A compiled template; expand() never raises for data it is given."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._parts: list[str | Callable[[TemplateData], str]] = []
        pos = 0
        for match in _ACTION.finditer(source):
            text = source[pos : match.start()]
            if match.group(1):
                text = text.rstrip()
            self._parts.append(text)
            body = match.group(2).strip()
            if not (body.startswith("/*") and body.endswith("*/")):
                self._parts.append(_pipeline(body))
            pos = match.end()
            if match.group(3):
                rest = source[pos:]
                pos += len(rest) - len(rest.lstrip())
        tail = source[pos:]
        if "{{" in tail:
            raise TemplateError("unclosed action: '{{' without '}}'")
        self._parts.append(tail)
        self.is_static = all(isinstance(p, str) for p in self._parts)

    def expand(self, data: TemplateData) -> str:
        out: list[str] = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
                continue
            try:
                out.append(part(data))
            except TemplateError as exc:
                return f"<error expanding template: {exc}>"
        return "".join(out)
