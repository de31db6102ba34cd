"""Rule files in the Prometheus schema, checked strictly, with errors naming file, line and rule."""

from __future__ import annotations

import glob
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser as pp

from gpuwatch.promql.parse import QueryError, parse
from gpuwatch.rules.template import Template, TemplateError
from gpuwatch.text.units import parse_duration
from gpuwatch.text.yamlfile import FileError, PathKey, Problem, YamlDoc, load

GROUP_KEYS = ("name", "interval", "limit", "labels", "rules")
RULE_KEYS = ("alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
RESERVED_LABELS = ("__name__", "alertname", "alertstate")


@dataclass(frozen=True, slots=True, eq=False)
class RuleDef:
    kind: str  # "alert" or "record"
    name: str
    expr_text: str
    expr: pp.Expr
    file: str
    line: int | None
    group: str
    hold: float = 0.0  # for:
    keep_firing_for: float = 0.0
    labels: tuple[tuple[str, Template], ...] = ()
    annotations: tuple[tuple[str, Template], ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class GroupDef:
    name: str
    file: str
    interval: float | None
    limit: int
    labels: tuple[tuple[str, str], ...]
    rules: tuple[RuleDef, ...] = field(default=())

    @property
    def key(self) -> str:
        """Groups are identified by file and name, as Prometheus does."""
        return f"{self.file};{self.name}"


def shipped_packs() -> list[str]:
    # The package's folder, not importlib.resources (which brings tempfile and random, half a
    # MiB the daemon would hold): gpuwatch is installed as files, never run from a zip.
    spec = importlib.util.find_spec("gpuwatch.packs")
    places = spec.submodule_search_locations if spec is not None else None
    if not places:
        return []
    return sorted(str(p) for p in Path(places[0]).iterdir() if p.name.endswith(".yaml"))


def expand_paths(patterns: list[str], base: Path | None = None) -> list[str]:
    """Paths and globs, relative to `base`, in order, each file once."""
    out: list[str] = []
    for pattern in patterns:
        full = (
            str(base / pattern) if base is not None and not Path(pattern).is_absolute() else pattern
        )
        matches = sorted(glob.glob(full)) if glob.has_magic(full) else [full]
        for m in matches:
            if m not in out:
                out.append(m)
    return out


def unmatched_globs(patterns: list[str]) -> list[Problem]:
    """A glob that matches no file, each as a problem: `rules/*.yml` written for `.yaml`
    files would otherwise start the daemon with none of its rules."""
    return [
        Problem(
            pattern,
            None,
            "",
            "no file matches this glob in rules.files; correct it, or set "
            "rules.allow_empty_globs: true where a directory may be empty",
        )
        for pattern in patterns
        if glob.has_magic(pattern) and not glob.glob(pattern)
    ]


def load_rule_files(paths: list[str]) -> list[GroupDef]:
    """Load every file; raise FileError with every problem in every file."""
    groups: list[GroupDef] = []
    problems: list[Problem] = []
    for path in paths:
        try:
            groups.extend(load_rule_file(path))
        except FileError as exc:
            problems.extend(exc.problems)
    if problems:
        raise FileError(problems)
    return groups


def load_rule_file(path: str) -> list[GroupDef]:
    doc = load(path)
    checker = _RuleChecker(doc)
    groups = checker.file()
    if checker.problems:
        raise FileError(checker.problems)
    return groups


class _RuleChecker:
    def __init__(self, doc: YamlDoc) -> None:
        self.doc = doc
        self.problems: list[Problem] = []

    def fail(self, path: PathKey, what: str, message: str) -> None:
        self.problems.append(Problem(self.doc.file, self.doc.line(path), what, message))

    def file(self) -> list[GroupDef]:
        data = self.doc.data
        if data is None:
            return []
        if not isinstance(data, dict):
            self.fail((), "", "a rule file must be a mapping with a 'groups' list")
            return []
        for key in data:
            if key != "groups":
                self.fail((str(key),), str(key), "unknown key; a rule file has only 'groups'")
        raw_groups = data.get("groups") or []
        if not isinstance(raw_groups, list):
            self.fail(("groups",), "groups", "must be a list")
            return []
        seen: set[str] = set()
        groups = []
        for i, raw in enumerate(raw_groups):
            group = self.group(raw, ("groups", i))
            if group is None:
                continue
            if group.name in seen:
                self.fail(("groups", i, "name"), f'group "{group.name}"', "repeated group name")
            seen.add(group.name)
            groups.append(group)
        return groups

    def _mapping(
        self, raw: Any, path: PathKey, what: str, known: tuple[str, ...]
    ) -> dict[str, Any]:
        if not isinstance(raw, dict):
            self.fail(path, what, "must be a mapping")
            return {}
        for key in raw:
            if key not in known:
                self.fail(
                    (*path, str(key)),
                    what,
                    f"unknown field {key!r}; expected one of: {', '.join(known)}",
                )
        return raw

    def group(self, raw: Any, path: PathKey) -> GroupDef | None:
        data = self._mapping(raw, path, f"groups[{path[-1]}]", GROUP_KEYS)
        name = data.get("name")
        if not isinstance(name, str) or not name:
            self.fail(path, f"groups[{path[-1]}]", "missing 'name' (each group needs a name)")
            return None
        what = f'group "{name}"'
        interval = None
        if data.get("interval") is not None:
            interval = self.duration(data["interval"], (*path, "interval"), f"{what}: interval")
            if interval is not None and interval <= 0:
                self.fail((*path, "interval"), f"{what}: interval", "must be positive")
        limit = data.get("limit") or 0
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            self.fail(
                (*path, "limit"), f"{what}: limit", f"expected a whole number >= 0, got {limit!r}"
            )
            limit = 0
        labels = self.label_map(data.get("labels"), (*path, "labels"), f"{what}: labels")
        raw_rules = data.get("rules") or []
        if not isinstance(raw_rules, list):
            self.fail((*path, "rules"), f"{what}: rules", "must be a list")
            raw_rules = []
        rules = []
        for i, raw_rule in enumerate(raw_rules):
            rule = self.rule(raw_rule, (*path, "rules", i), name)
            if rule is not None:
                rules.append(rule)
        static_labels = tuple(sorted(labels.items()))
        return GroupDef(name, self.doc.file, interval, limit, static_labels, tuple(rules))

    def duration(self, raw: Any, path: PathKey, what: str) -> float | None:
        try:
            return parse_duration(str(raw))
        except ValueError as exc:
            self.fail(path, what, str(exc))
            return None

    def label_map(self, raw: Any, path: PathKey, what: str) -> dict[str, str]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self.fail(path, what, "must be a mapping of names to values")
            return {}
        out = {}
        for key, value in raw.items():
            if not isinstance(key, str) or not _LABEL_NAME.fullmatch(key):
                self.fail((*path, str(key)), what, f"invalid label name {key!r}")
                continue
            out[key] = "" if value is None else str(value)
        return out

    def templates(
        self, raw: Any, path: PathKey, what: str, alert: str | None
    ) -> tuple[tuple[str, Template], ...]:
        """Labels and annotations; an alert's are templates, a recording rule's plain text."""
        out = []
        for key, value in sorted(self.label_map(raw, path, what).items()):
            if alert is None:
                out.append((key, Template.literal(value)))
                continue
            try:
                out.append((key, Template(value, f"__alert_{alert}")))
            except TemplateError as exc:
                self.fail((*path, key), f"{what}.{key}", f"template: {exc}")
        return tuple(out)

    def rule(self, raw: Any, path: PathKey, group: str) -> RuleDef | None:
        where = f'group "{group}" rules[{path[-1]}]'
        data = self._mapping(raw, path, where, RULE_KEYS)
        alert, record = data.get("alert"), data.get("record")
        if (alert is None) == (record is None):
            self.fail(path, where, "a rule needs exactly one of 'alert' or 'record'")
            return None
        kind = "alert" if alert is not None else "record"
        name = str(alert if alert is not None else record)
        what = f'group "{group}" {kind} "{name}"'
        if kind == "record":
            if not _METRIC_NAME.fullmatch(name):
                self.fail((*path, "record"), what, f"invalid metric name {name!r}")
            for key in ("for", "keep_firing_for", "annotations"):
                if key in data:
                    self.fail((*path, key), what, f"'{key}' is only valid on alerting rules")
        elif not name:
            self.fail((*path, "alert"), what, "the alert name is empty")
        expr_text = data.get("expr")
        if expr_text is None or not str(expr_text).strip():
            self.fail(path, what, "missing 'expr'")
            return None
        try:
            expr = parse(str(expr_text))
        except QueryError as exc:
            # At the expression's first character, and the message says where in it.
            line, column = self.doc.values.get((*path, "expr"), (None, None))
            line = line or self.doc.line((*path, "expr"))
            self.problems.append(Problem(self.doc.file, line, f"{what}: expr", str(exc), column))
            return None
        hold = self.duration(data["for"], (*path, "for"), f"{what}: for") if "for" in data else 0.0
        keep = 0.0
        if "keep_firing_for" in data:
            keep = self.duration(data["keep_firing_for"], (*path, "keep_firing_for"), what) or 0.0
        alert_name = name if kind == "alert" else None
        labels = self.templates(
            data.get("labels"), (*path, "labels"), f"{what}: labels", alert_name
        )
        for key, _ in labels:
            if key in RESERVED_LABELS:
                self.fail((*path, "labels", key), f"{what}: labels", f"{key!r} is reserved")
        annotations = self.templates(
            data.get("annotations"), (*path, "annotations"), f"{what}: annotations", alert_name
        )
        return RuleDef(
            kind,
            name,
            str(expr_text),
            expr,
            self.doc.file,
            self.doc.line(path),
            group,
            hold or 0.0,
            keep,
            labels,
            annotations,
        )
