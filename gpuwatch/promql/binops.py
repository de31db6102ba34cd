"""Binary operators: arithmetic, comparisons (with and without bool), and/or/unless, and
vector matching with on/ignoring and group_left/group_right, as Prometheus does them."""

from __future__ import annotations

import math
from collections.abc import Callable

import promql_parser as pp

from gpuwatch.promql.values import (
    NAME,
    EvalError,
    Labels,
    Scalar,
    Value,
    Vector,
    VSample,
    drop_name,
    format_labels,
)


def _div(a: float, b: float) -> float:
    if b == 0:
        if math.isnan(a) or a == 0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _mod(a: float, b: float) -> float:
    if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan
    if math.isinf(b):
        return a
    return math.fmod(a, b)


def _pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except OverflowError:
        return math.inf if a > 0 or (b == int(b) and int(b) % 2 == 0) else -math.inf
    except ValueError:
        if a == 0 and b < 0:
            return math.inf
        return math.nan


def _atan2(a: float, b: float) -> float:
    return math.atan2(a, b)


ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": _div,
    "%": _mod,
    "^": _pow,
    "atan2": _atan2,
}
COMPARISON: dict[str, Callable[[float, float], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
}
SET_OPS = ("and", "or", "unless")


def _apply(op: str, a: float, b: float) -> tuple[float, bool]:
    """(value, keep): a comparison keeps the left value when it holds."""
    arith = ARITHMETIC.get(op)
    if arith is not None:
        return arith(a, b), True
    return a, COMPARISON[op](a, b)


def negate(value: Value) -> Value:
    if isinstance(value, Scalar):
        return Scalar(-value.value)
    if isinstance(value, list):
        return [VSample(drop_name(s.metric), -s.value, s.time) for s in value]  # type: ignore[union-attr]
    raise EvalError("unary minus needs a scalar or an instant vector")


def evaluate(expr: pp.BinaryExpr, lhs: Value, rhs: Value, t: float) -> Value:
    op = str(expr.op)
    modifier = expr.modifier
    return_bool = bool(modifier and modifier.return_bool)
    if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
        value, keep = _apply(op, lhs.value, rhs.value)
        return Scalar((1.0 if keep else 0.0) if return_bool else value)
    if isinstance(lhs, list) and isinstance(rhs, Scalar):
        return _vector_scalar(op, lhs, rhs.value, swap=False, return_bool=return_bool)  # type: ignore[arg-type]
    if isinstance(lhs, Scalar) and isinstance(rhs, list):
        return _vector_scalar(op, rhs, lhs.value, swap=True, return_bool=return_bool)  # type: ignore[arg-type]
    if isinstance(lhs, list) and isinstance(rhs, list):
        if op in SET_OPS:
            return _set_op(op, lhs, rhs, modifier)  # type: ignore[arg-type]
        return _vector_vector(op, lhs, rhs, modifier, return_bool)  # type: ignore[arg-type]
    raise EvalError(f"operator {op} needs scalars or instant vectors")


def _vector_scalar(op: str, vector: Vector, scalar: float, swap: bool, return_bool: bool) -> Vector:
    compare = COMPARISON.get(op)
    if compare is not None and not return_bool:
        # A filter (`gpuwatch_gpu_nvlink_link_up == 0`): the samples that pass, as they are.
        if swap:
            return [s for s in vector if compare(scalar, s.value)]
        return [s for s in vector if compare(s.value, scalar)]
    out: Vector = []
    comparison = compare is not None
    for s in vector:
        a, b = (scalar, s.value) if swap else (s.value, scalar)
        value, keep = _apply(op, a, b)
        if comparison and swap:
            value = s.value  # the vector's own value survives a scalar-vector comparison
        if return_bool:
            value, keep = (1.0 if keep else 0.0), True
        if keep:
            metric = drop_name(s.metric) if (not comparison or return_bool) else s.metric
            out.append(VSample(metric, value, s.time))
    return out


def _signature(metric: Labels, modifier: pp.BinModifier | None) -> tuple[tuple[str, str], ...]:
    matching = modifier.matching if modifier is not None else None
    if matching is None:
        return tuple(pair for pair in metric if pair[0] != NAME)
    names = set(matching.labels)
    if matching.type == pp.LabelModifierType.Include:
        return tuple(pair for pair in metric if pair[0] in names)
    return tuple(pair for pair in metric if pair[0] not in names and pair[0] != NAME)


def _set_op(op: str, lhs: Vector, rhs: Vector, modifier: pp.BinModifier | None) -> Vector:
    rhs_sigs = {_signature(s.metric, modifier) for s in rhs}
    if op == "and":
        return [s for s in lhs if _signature(s.metric, modifier) in rhs_sigs]
    if op == "unless":
        return [s for s in lhs if _signature(s.metric, modifier) not in rhs_sigs]
    lhs_sigs = {_signature(s.metric, modifier) for s in lhs}
    return lhs + [s for s in rhs if _signature(s.metric, modifier) not in lhs_sigs]


def _vector_vector(
    op: str, lhs: Vector, rhs: Vector, modifier: pp.BinModifier | None, return_bool: bool
) -> Vector:
    card = modifier.card if modifier is not None else pp.VectorMatchCardinality.OneToOne
    one_to_many = card == pp.VectorMatchCardinality.OneToMany
    many, one = (rhs, lhs) if one_to_many else (lhs, rhs)
    one_side: dict[Labels, VSample] = {}
    for s in one:
        sig = _signature(s.metric, modifier)
        if sig in one_side:
            side = "left" if one_to_many else "right"
            raise EvalError(
                f"found duplicate series for the match group {format_labels(sig)} on the "
                f"{side} hand-side of the operation: [{format_labels(one_side[sig].metric)}, "
                f"{format_labels(s.metric)}];many-to-many matching not allowed: "
                "matching labels must be unique on one side"
            )
        one_side[sig] = s
    comparison = op in COMPARISON
    drop = not comparison or return_bool
    matched: dict[Labels, Labels] = {}
    seen: set[Labels] = set()
    out: Vector = []
    for s in many:
        sig = _signature(s.metric, modifier)
        other = one_side.get(sig)
        if other is None:
            continue
        a, b = (other.value, s.value) if one_to_many else (s.value, other.value)
        value, keep = _apply(op, a, b)
        if return_bool:
            value, keep = (1.0 if keep else 0.0), True
        if not keep:
            continue
        metric = _result_metric(s.metric, other.metric, modifier, card, drop)
        if card == pp.VectorMatchCardinality.OneToOne:
            if sig in matched:
                raise EvalError(
                    "multiple matches for labels: many-to-one matching must be explicit "
                    "(group_left/group_right)"
                )
            matched[sig] = metric
        elif metric in seen:
            raise EvalError(
                "multiple matches for labels: grouping labels must ensure unique matches"
            )
        seen.add(metric)
        out.append(VSample(metric, value, s.time))
    return out


def _result_metric(
    metric: Labels,
    other: Labels,
    modifier: pp.BinModifier | None,
    card: pp.VectorMatchCardinality,
    drop: bool,
) -> Labels:
    labels = dict(metric)
    if drop:
        labels.pop(NAME, None)
    matching = modifier.matching if modifier is not None else None
    if card == pp.VectorMatchCardinality.OneToOne and matching is not None:
        names = set(matching.labels)
        if matching.type == pp.LabelModifierType.Include:
            labels = {k: v for k, v in labels.items() if k in names}
        else:
            labels = {k: v for k, v in labels.items() if k not in names}
    if modifier is not None and modifier.group_labels:
        other_labels = dict(other)
        for name in modifier.group_labels:
            value = other_labels.get(name, "")
            if value:
                labels[name] = value
            else:
                labels.pop(name, None)
    return tuple(sorted(labels.items()))
