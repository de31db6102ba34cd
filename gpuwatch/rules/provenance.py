"""Which rules speak for the hardware, decided from what their expressions read.

A series is the hardware's when its name is in the daemon's own namespace (`gpuwatch_`, which
no push or textfile may use), a job's otherwise. A rule is the hardware's when every selector
it has, in its expression and in its label templates, names a hardware series; anything else (a
job's metric, a selector with no plain name, a template that queries the store) makes it a
job's, as does its own label `provenance: job`. Recording rules pass their provenance on to the
name they record, so a record over a job's series cannot launder it into a hardware-looking
name, and `gpuwatch_alerts`, which carries every alert's labels, is read as a job's.

Decided when the files load, not per evaluation: the same rule has the same power whatever
the jobs on the node push, and /api/v1/rules shows each rule's."""

from __future__ import annotations

from collections.abc import Iterable

import promql_parser as pp

from gpuwatch import metrics as m
from gpuwatch.model import HARDWARE_PREFIXES, Provenance
from gpuwatch.promql.walk import nodes
from gpuwatch.rules.files import GroupDef, RuleDef

# Names in the daemon's namespace whose series carry what jobs sent.
MIXED = frozenset({m.ALERTS})


def selected_names(expr: pp.Expr) -> list[str | None]:
    """The metric name each selector of `expr` reads; None where it names none plainly."""
    out: list[str | None] = []
    for node, _ in nodes(expr):
        if isinstance(node, pp.VectorSelector):
            out.append(_plain_name(node))
    return out


def _plain_name(selector: pp.VectorSelector) -> str | None:
    if selector.name:
        return str(selector.name)
    for matcher in selector.matchers.matchers:
        if matcher.name == "__name__" and matcher.op == pp.MatchOp.Equal:
            return str(matcher.value)
    return None


def _queries_the_store(rule: RuleDef) -> bool:
    """A label template with `query` reads whatever its text names, which is not known until
    it runs; annotations only word the message."""
    return any("query" in template.source for _, template in rule.labels)


def rule_provenance(groups: Iterable[GroupDef]) -> dict[tuple[str, int], Provenance]:
    """Each rule's provenance, by (group key, index in the group)."""
    rules = [(g.key, i, r) for g in groups for i, r in enumerate(g.rules)]
    reads = {(k, i): selected_names(r.expr) for k, i, r in rules}
    job_names: set[str] = set(MIXED)
    # A record over a job's series makes its name a job's; that can make another record a
    # job's in turn, so go round until nothing changes (each round adds a name or stops).
    while True:
        more = {
            r.name
            for k, i, r in rules
            if r.kind == "record"
            and r.name not in job_names
            and not _hardware(reads[k, i], r, job_names)
        }
        if not more:
            break
        job_names |= more
    return {
        (k, i): Provenance.HARDWARE if _hardware(reads[k, i], r, job_names) else Provenance.JOB
        for k, i, r in rules
    }


def declares_a_job(rule: RuleDef) -> bool:
    """A rule may give up the hardware's power with `provenance: job` (a warning about how a
    job uses its GPU, for the job's owner); no label can claim the hardware's."""
    return any(name == "provenance" and t.source.strip() == "job" for name, t in rule.labels)


def _hardware(names: list[str | None], rule: RuleDef, job_names: set[str]) -> bool:
    """Only names in the daemon's namespace can be the hardware's: a job may push any other
    name, a record's included, and its series would sit beside the record's."""
    if _queries_the_store(rule) or declares_a_job(rule):
        return False
    return all(
        name is not None and name.startswith(HARDWARE_PREFIXES) and name not in job_names
        for name in names
    )
