"""Reloading a running daemon (SIGHUP, `systemctl reload`, or POST /-/reload on the control
socket): the config file and the rule files are read again and applied only when all of them
are good; otherwise everything keeps running as it was and the error is logged and returned.

Each component applies its own part (the rules engine its files, the notifier its receivers,
the listener's guard its web config, the daemon the rest); the Reloader only reads the files
and sequences those steps, one reload at a time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

from gpuwatch import logs
from gpuwatch.config import Config, default_rule_interval, load_config
from gpuwatch.daemon import Daemon
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
        daemon: Daemon,
        rules: RuleEngine | None,
        notifier: Notifier | None,
        guard: WebGuard | None,
        reread: Callable[[], Config] | None = None,
    ) -> None:
        self.daemon = daemon
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
        old = self.daemon.config
        return load_config(old.source).with_overrides(old.listen, old.state_dir)

    async def _reload(self) -> str:
        old = self.daemon.config
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
        if self.rules is not None:
            files = list(new.rules.files) if new.rules.files is not None else None
            async with self.rules.evaluating:
                error = self.rules.apply(
                    files,
                    default_rule_interval(new.rules, old.sampling),
                    new.rules.allow_empty_globs,
                )
            if error:
                return error  # the engine logged why and kept its rules
            for warning in config_warnings(new, self.rules):
                log.warning("%s", warning)
        applied = _applicable(old, new)
        if self.notifier is not None and applied.notify != old.notify:
            await self.notifier.apply(applied.notify)
        self.daemon.apply(applied)
        if web is not None and self.guard is not None:
            self.guard.reload(web)
        if new.log != old.log:
            logs.setup(new.log.level, new.log.format)
        log.info("reloaded %s", old.source or "the defaults")
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
