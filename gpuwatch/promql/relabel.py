"""label_replace and label_join, and the string arguments they take."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import promql_parser as pp

from gpuwatch.promql.values import (
    EvalError,
    StringValue,
    Vector,
    VSample,
    label_value,
    with_label,
)
from gpuwatch.text.regex import RegexError, compile_regex, expand_replacement

if TYPE_CHECKING:
    from gpuwatch.promql.evaluator import Evaluator

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def string_arg(ev: Evaluator, arg: pp.Expr, t: float) -> str:
    value = ev.eval(arg, t)
    if not isinstance(value, StringValue):
        raise EvalError("expected a string argument")
    return value.value


def label_replace(ev: Evaluator, args: list[pp.Expr], t: float) -> Vector:
    vector = ev.vector(args[0], t)
    dst, replacement, src, regex_text = (string_arg(ev, a, t) for a in args[1:5])
    try:
        regex = compile_regex(regex_text, dot_matches_newline=True)
    except RegexError as exc:
        raise EvalError(
            f"invalid regular expression in label_replace(): {regex_text}: {exc}"
        ) from None
    if not _LABEL_NAME.fullmatch(dst):
        raise EvalError(f"invalid destination label name in label_replace(): {dst}")
    out: Vector = []
    for s in vector:
        match = regex.fullmatch(label_value(s.metric, src))
        metric = s.metric
        if match is not None:
            metric = with_label(metric, dst, expand_replacement(replacement, match))
        out.append(VSample(metric, s.value, s.time))
    return out  # two series left with one label set: the evaluator refuses them


def label_join(ev: Evaluator, args: list[pp.Expr], t: float) -> Vector:
    vector = ev.vector(args[0], t)
    dst, separator = string_arg(ev, args[1], t), string_arg(ev, args[2], t)
    sources = [string_arg(ev, a, t) for a in args[3:]]
    out = [
        VSample(
            with_label(s.metric, dst, separator.join(label_value(s.metric, n) for n in sources)),
            s.value,
            s.time,
        )
        for s in vector
    ]
    return out  # two series left with one label set: the evaluator refuses them
