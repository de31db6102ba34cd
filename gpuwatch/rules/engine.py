"""The rules engine inside the daemon: loads the rule files, evaluates each group on its
interval (and every group at once when a fault event arrives), keeps alert state on disk,
and reloads without losing state or, on a bad file, without losing the old rules."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from gpuwatch import metrics as m
from gpuwatch.logs import RECORD_KEYS, logfmt_value
from gpuwatch.logs import fields as log_fields
from gpuwatch.model import Sample
from gpuwatch.promql.evaluator import Evaluator, SeriesView
from gpuwatch.promql.history import history_needed
from gpuwatch.rules import statefile
from gpuwatch.rules.alerting import ALERT_SOURCE_PREFIX, AlertingRule, RuleGroup, Transition
from gpuwatch.rules.files import (
    GroupDef,
    expand_paths,
    load_rule_files,
    shipped_packs,
    unmatched_globs,
)
from gpuwatch.rules.provenance import rule_provenance
from gpuwatch.store.runs import DEFAULT_LOOKBACK_S
from gpuwatch.store.tsdb import Store
from gpuwatch.text.units import format_duration
from gpuwatch.text.yamlfile import FileError
from gpuwatch.web.foreground import StepAside, StepAsideFn, never

log = logging.getLogger(__name__)

SELF_SOURCE = "rules:self"
Write = tuple[str, float, list[Sample]]  # (source, time, samples) for the shared store
EARLY_TOLERANCE = 0.05  # a group due within this fraction of its interval is evaluated now
# How long one evaluation may wait, in all, for /metrics pages being written: a few pages' worth
# at 64 GPUs (8-14 ms each), and nothing a client asking without end can stretch. The sampling
# cycle awaits the evaluation before the verdict and the alerts, so this is also the most a
# scraper can delay them: a twentieth of the default 1 s cycle.
STEP_ASIDE_S = 0.05


class _Querier:
    """The store the rules read: sampled series plus recording-rule results."""

    def __init__(self, stores: tuple[Store, ...]) -> None:
        self._stores = stores

    @property
    def layout(self) -> int:
        return sum(s.layout for s in self._stores)  # each only grows

    def select(
        self, name: str | None, match: Callable[[SeriesView], bool] | None = None
    ) -> Iterator[SeriesView]:
        for store in self._stores:
            yield from store.select(name, match)


class RuleEngine:
    def __init__(
        self,
        store: Store,
        files: Iterable[str] | None,
        default_interval: float,
        state_dir: Path | None,
        external_url: str = "",
        *,
        allow_empty_globs: bool = False,
        step_aside: StepAsideFn = never,
    ) -> None:
        """`step_aside` waits while a client is served (the /metrics page being written);
        each evaluation calls it between rules and every few hundred series its selections
        read, for at most STEP_ASIDE_S in all."""
        self.store = store
        self.aside = StepAside(step_aside, STEP_ASIDE_S)
        self.external_url = external_url  # what templates' externalURL and pathPrefix answer
        self.configured_retention = store.retention
        # Recording-rule results live apart so that /metrics exports only what was sampled.
        self.recorded = Store(store.retention)
        self.evaluator = Evaluator(
            _Querier((store, self.recorded)), subquery_step=default_interval, pace=self.aside
        )
        self.patterns = list(files) if files is not None else None
        self.allow_empty_globs = allow_empty_globs
        self.default_interval = default_interval
        self.state_path = state_dir / statefile.FILE_NAME if state_dir is not None else None
        self.groups: list[RuleGroup] = []
        self.files: list[str] = []  # the files the running rules were loaded from
        # Held while a worker thread evaluates: a reload waits for it rather than swap the
        # rules (and hand their alert state over) under an evaluation in progress.
        self.evaluating = asyncio.Lock()
        self.failures: dict[str, int] = {}
        self.last_reload_error = ""
        self._saved: tuple[object, ...] = ()

    # -- loading ---------------------------------------------------------------------------
    def paths(self) -> list[str]:
        return shipped_packs() if self.patterns is None else expand_paths(self.patterns)

    def load(self) -> None:
        """First load: a bad file is fatal here (the daemon refuses to start with it)."""
        definitions = self._definitions()
        self.groups = self._built(definitions)
        self._keep_enough_history()
        if self.state_path is not None:
            restored = statefile.restore(self.state_path, self.alerting_rules())
            if restored:
                log.info("restored %d alerts from %s", restored, self.state_path)
        self._saved = statefile.signature(self.alerting_rules())
        log.info("loaded %d rule groups from %d files", len(self.groups), len(self.files))

    def _built(self, definitions: list[GroupDef]) -> list[RuleGroup]:
        provenance = rule_provenance(definitions)
        return [
            RuleGroup.build(
                d, alerts_metric=m.ALERTS, external_url=self.external_url, provenance=provenance
            )
            for d in definitions
        ]

    def _definitions(self) -> list[GroupDef]:
        if self.patterns is not None and not self.allow_empty_globs:
            unmatched = unmatched_globs(self.patterns)
            if unmatched:
                raise FileError(unmatched)
        paths = self.paths()
        definitions = load_rule_files(paths)
        self.files = paths
        return definitions

    def apply(
        self, patterns: list[str] | None, default_interval: float, allow_empty_globs: bool = False
    ) -> str:
        """A reload's step for the rules: the files `patterns` names (None: the shipped
        packs) at `default_interval` replace the running ones, or nothing changes and the
        reason is returned."""
        previous = (self.patterns, self.default_interval, self.allow_empty_globs)
        self.patterns, self.default_interval = patterns, default_interval
        self.allow_empty_globs = allow_empty_globs
        error = self.reload()
        if error:
            self.patterns, self.default_interval, self.allow_empty_globs = previous
        return error

    def reload(self) -> str:
        """Load the files again; returns "" on success, else why (the old rules keep running)."""
        try:
            definitions = self._definitions()
        except FileError as exc:
            self.last_reload_error = str(exc)
            log.error("rule reload failed, keeping the old rules: %s", self.last_reload_error)
            return self.last_reload_error
        old = {statefile.rule_key(r): r for r in self.alerting_rules()}
        kept = {g.definition.key: g for g in self.groups}
        groups = self._built(definitions)
        for group in groups:
            # As Prometheus: a group that stays keeps its schedule and its last evaluation.
            if (before := kept.get(group.definition.key)) is not None:
                group.last_evaluation = before.last_evaluation
                group.evaluation_seconds = before.evaluation_seconds
        self.groups = groups
        for rule in self.alerting_rules():
            previous = old.get(statefile.rule_key(rule))
            if previous is not None:
                rule.active = previous.active  # the same rule keeps its alerts across reloads
        self.last_reload_error = ""
        self._keep_enough_history()
        log.info("rules reloaded: %d groups", len(groups))
        return ""

    def _keep_enough_history(self) -> None:
        """Make the store keep what the rules read back (`increase(x[1h])`, `offset 10m`), name
        by name, so that one rule reading an hour back does not keep an hour of everything.
        With less, a rule would see a series "appear" when its old samples were trimmed, and an
        alert on an XID counter would fire and resolve every trim."""
        needed: dict[str | None, float] = {}
        for group in self.groups:
            for rule in group.definition.rules:
                for name, reach in history_needed(rule.expr, DEFAULT_LOOKBACK_S).items():
                    needed[name] = max(needed.get(name, 0.0), reach + self.interval(group))
        unnamed = needed.get(None, 0.0)  # a selector without a name could read any series
        for store in (self.store, self.recorded):
            store.read_back_by_name = {n: t for n, t in needed.items() if n is not None}
            store.read_back_any = unnamed
            store.retention = max(self.configured_retention, unnamed)
        retention = self.store.retention
        longer = {n: t for n, t in self.store.read_back_by_name.items() if t > retention}
        if self.store.retention > self.configured_retention:
            log.info(
                "store.retention %s is shorter than the rules read back; keeping %s",
                format_duration(self.configured_retention),
                format_duration(self.store.retention),
            )
        if longer:
            log.info(
                "kept longer than store.retention, as rules read them back: %s",
                ", ".join(f"{n} {format_duration(t)}" for n, t in sorted(longer.items())),
            )

    def alerting_rules(self) -> Iterator[AlertingRule]:
        for group in self.groups:
            for rule in group.rules:
                if isinstance(rule, AlertingRule):
                    yield rule

    def interval(self, group: RuleGroup) -> float:
        return group.definition.interval or self.default_interval

    # -- evaluation ------------------------------------------------------------------------
    def evaluate(
        self, now: float, everything: bool = False, blind: bool = False
    ) -> list[Transition]:
        """Evaluate the groups that are due (all of them when `everything`); `blind`: the
        GPU backend is down, and GPUs' firing alerts hold (AlertingRule.evaluate). Here, on
        the caller's thread, nothing steps aside: on the event loop, waiting for a page that
        the loop itself writes would only stall it."""
        transitions, writes = self.compute(now, everything, blind, step_aside=False)
        self.commit(now, transitions, writes)
        return transitions

    async def evaluate_off_loop(
        self, now: float, everything: bool = False, blind: bool = False
    ) -> list[Transition]:
        """evaluate() with the PromQL work in a worker thread, so the event loop keeps serving.

        The caller must not ingest into the store until this returns (the daemon's sampling
        loop awaits it); the thread writes only to the rules' own store, and the alert series
        are written to the shared store back on the loop.
        """
        async with self.evaluating:
            transitions, writes = await asyncio.to_thread(self.compute, now, everything, blind)
            self.commit(now, transitions, writes)
        return transitions

    def compute(
        self, now: float, everything: bool, blind: bool = False, step_aside: bool = True
    ) -> tuple[list[Transition], list[Write]]:
        """Run the due groups; the alert series to write to the shared store are returned.
        `step_aside`: wait, for STEP_ASIDE_S at most, while a /metrics page is written."""
        transitions: list[Transition] = []
        writes: list[Write] = []

        def sink(source: str, t: float, samples: list[Sample]) -> None:
            if source.startswith(ALERT_SOURCE_PREFIX):
                writes.append((source, t, samples))
            else:
                self.recorded.ingest(source, t, samples)

        self.aside.renew(None if step_aside else 0.0)
        for group in self.groups:
            last = group.last_evaluation
            due = last is None or now - last >= self.interval(group) * (1 - EARLY_TOLERANCE)
            if not (everything or due):
                continue
            transitions += group.evaluate(self.evaluator, now, sink, blind, self.aside)
            failed = sum(1 for r in group.rules if r.status.health == "err")
            if failed:
                key = group.definition.key
                self.failures[key] = self.failures.get(key, 0) + failed
        return transitions, writes

    def commit(self, now: float, transitions: list[Transition], writes: list[Write]) -> None:
        for source, at, samples in writes:
            self.store.ingest(source, at, samples)
        self.store.ingest(SELF_SOURCE, now, self.collect())
        for t in transitions:
            # The alert's labels are fields, to filter on; one named like a field of the
            # record itself (a label `level`) stays in the text instead.
            labels = dict(t.alert.labels)
            kept = {k: v for k, v in labels.items() if k in RECORD_KEYS}
            log.info(
                "alert %s %s -> %s%s",
                t.rule,
                t.old.value,
                t.new.value,
                "".join(f" {k}={logfmt_value(v)}" for k, v in kept.items()),
                extra=log_fields(**{k: v for k, v in labels.items() if k not in kept}),
            )
        self._persist()

    def collect(self) -> list[Sample]:
        out = [Sample(m.RULES_LAST_RELOAD_SUCCESSFUL, (), 0.0 if self.last_reload_error else 1.0)]
        for group in self.groups:
            labels = (("group", group.definition.name), ("file", group.definition.file))
            out.append(Sample(m.RULE_EVALUATION_DURATION, labels, group.evaluation_seconds))
            out.append(
                Sample(
                    m.RULE_EVALUATION_FAILURES,
                    labels,
                    float(self.failures.get(group.definition.key, 0)),
                )
            )
        return out

    def _persist(self) -> None:
        if self.state_path is None:
            return
        signature = statefile.signature(self.alerting_rules())
        if signature == self._saved:
            return
        try:
            statefile.save(self.state_path, self.alerting_rules())
            self._saved = signature
        except OSError as exc:
            log.error("cannot save alert state to %s: %s", self.state_path, exc)
