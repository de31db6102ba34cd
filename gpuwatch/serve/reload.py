"""Reloading a running daemon (SIGHUP, `systemctl reload`, or POST /-/reload on the control
socket): the config file and the rule files are read again and applied only when all of them
are good; otherwise everything keeps running as it was and the error is logged and returned.

Each component applies its own part, a named step (the rules engine its files, the notifier
its receivers, the daemon the rest, the listener's guard its web config, the log its level);
the Reloader only reads the files and runs those steps in order, one reload at a time, and
logs how long each took, as Prometheus's reloaders do."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from gpuwatch import logs
from gpuwatch.config import Config, default_rule_interval, load_config
from gpuwatch.notify.notifier import Notifier
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.serve.preflight import config_warnings
from gpuwatch.serve.webconfig import WebConfig, WebGuard, load_web_config
from gpuwatch.text.yamlfile import FileError

log = logging.getLogger(__name__)

# What a reload cannot change under a running daemon: listeners, files held open, the loop.
RESTART_ONLY = (
    "listen", "state_dir", "node_name", "sampling", "store", "journal", "web_config", "sources",
    "actions",
)  # fmt: skip
RESTART_ONLY_PUSH = (
    "max_body_bytes", "max_series_per_job", "max_series", "stale_after", "textfile_dir",
    "socket", "socket_mode", "socket_group",
)  # fmt: skip


class Reloader:
    def __init__(
        self,
        running: Callable[[], Config],
        apply: Callable[[Config], None],
        *,
        rules: RuleEngine | None,
        notifier: Notifier | None,
        guard: WebGuard | None,
        reread: Callable[[], Config] | None = None,
    ) -> None:
        self._running = running  # the config the daemon runs with now
        self._apply = apply  # the daemon's own step: the new config, less what takes a restart
        # The config as the daemon was started with it, read again: the file with what the
        # command line (or the simulated node) puts over it. Without that, the listener or
        # the simulated node's paths would read as changes that take a restart.
        self._reread = reread or self._file_again
        self.rules = rules
        self.notifier = notifier
        self.guard = guard
        # One reload at a time: a second (SIGHUP during POST /-/reload) waits, then compares
        # with what the first applied, so it never restarts the notifier for nothing.
        self._lock = asyncio.Lock()

    async def reload(self) -> str:
        """Empty when the new config and rules now run; otherwise why not (then nothing
        changed)."""
        async with self._lock:
            return await self._reload()

    def _file_again(self) -> Config:
        old = self._running()
        return load_config(old.source).with_overrides(old.listen, old.state_dir)

    async def _reload(self) -> str:
        old = self._running()
        try:
            new = self._reread()
        except (FileError, ValueError) as exc:
            return _refused(f"config {old.source}: {exc}")
        web: WebConfig | None = None
        if self.guard is not None and old.web_config is not None:
            try:
                web = load_web_config(old.web_config)  # the file the listener was started with
            except FileError as exc:
                return _refused(f"web config {old.web_config}: {exc}")
        timings: list[str] = []

        async def timed(name: str, step: Awaitable[str]) -> str:
            started = time.perf_counter()
            error = await step
            timings.append(f"{name}={(time.perf_counter() - started) * 1000:.1f}ms")
            return error

        # The rules' step alone can refuse (it logs why and keeps its rules): it goes first, so
        # a refusal changes nothing.
        if self.rules is not None and (error := await timed("rules", self._rules(old, new))):
            return error
        applied = _applicable(old, new)
        if self.notifier is not None:
            await timed("notify", self._notify(old, applied))
        await timed("daemon", self._daemon(applied))
        if web is not None and self.guard is not None:
            await timed("web_config", self._web(self.guard, web))
        await timed("log", self._log(old, new))
        log.info("reloaded %s: %s", old.source or "the defaults", " ".join(timings))
        return ""

    async def _rules(self, old: Config, new: Config) -> str:
        assert self.rules is not None
        files = list(new.rules.files) if new.rules.files is not None else None
        interval = default_rule_interval(new.rules, old.sampling)
        async with self.rules.evaluating:
            error = self.rules.apply(files, interval, new.rules.allow_empty_globs)
        if not error:
            for warning in config_warnings(new, self.rules):
                log.warning("%s", warning)
        return error

    async def _notify(self, old: Config, applied: Config) -> str:
        if self.notifier is not None and applied.notify != old.notify:
            await self.notifier.apply(applied.notify)
        return ""

    async def _daemon(self, applied: Config) -> str:
        self._apply(applied)
        return ""

    @staticmethod
    async def _web(guard: WebGuard, web: WebConfig) -> str:
        guard.reload(web)
        return ""

    @staticmethod
    async def _log(old: Config, new: Config) -> str:
        if new.log != old.log:
            logs.setup(new.log.level, new.log.format)
        return ""


def _applicable(old: Config, new: Config) -> Config:
    """The new config less what only a restart can change (logged as such)."""
    later = [f for f in RESTART_ONLY if getattr(new, f) != getattr(old, f)]
    later += [
        f"push.{f}" for f in RESTART_ONLY_PUSH if getattr(new.push, f) != getattr(old.push, f)
    ]
    if later:
        log.warning("reload: %s changed; that takes a restart", ", ".join(later))
    kept = {f: getattr(old, f) for f in RESTART_ONLY}
    return replace(new, push=replace(old.push, token=new.push.token), **kept)


def _refused(error: str) -> str:
    log.error("reload failed, everything keeps running as it was: %s", error)
    return error
