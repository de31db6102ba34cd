"""Reloading a running daemon (SIGHUP, `systemctl reload`, or POST /-/reload on the control
socket): the config file and the rule files are read again and applied only when all of them
are good; otherwise everything keeps running as it was and the error is logged and returned."""

from __future__ import annotations

import logging
from dataclasses import replace

from gpuwatch import logs
from gpuwatch.config import default_rule_interval, load_config
from gpuwatch.daemon import Daemon
from gpuwatch.webconfig import load_web_config
from gpuwatch.yamlfile import FileError

log = logging.getLogger(__name__)

# What a reload cannot change under a running daemon: listeners, files held open, the loop.
RESTART_ONLY = (
    "listen", "state_dir", "node_name", "sampling", "store", "journal", "web_config", "sources"
)  # fmt: skip
RESTART_ONLY_PUSH = (
    "max_body_bytes", "max_series_per_job", "max_series", "stale_after", "textfile_dir",
    "socket", "socket_mode", "socket_group",
)  # fmt: skip


async def reload_daemon(daemon: Daemon) -> str:
    """Empty when the new config and rules now run; otherwise why not (then nothing changed).
    One reload at a time: a second (SIGHUP during POST /-/reload) waits, then compares with
    what the first applied, so it never starts a second notifier on the same outbox."""
    async with daemon.reload_lock:
        return await _reload(daemon)


async def _reload(daemon: Daemon) -> str:
    old = daemon.config
    try:
        new = load_config(old.source).with_overrides(old.listen, old.state_dir)
    except (FileError, ValueError) as exc:
        return _refused(f"config {old.source}: {exc}")
    web = None
    if daemon.web_guard is not None and old.web_config is not None:
        try:
            web = load_web_config(old.web_config)  # the file the listener was started with
        except FileError as exc:
            return _refused(f"web config {old.web_config}: {exc}")
    rules = daemon.rules
    if rules is not None:
        files = list(new.rules.files) if new.rules.files is not None else None
        async with rules.evaluating:
            error = rules.apply(files, default_rule_interval(new.rules, old.sampling))
        if error:
            return error  # the engine logged why and kept its rules
    later = [f for f in RESTART_ONLY if getattr(new, f) != getattr(old, f)]
    later += [
        f"push.{f}" for f in RESTART_ONLY_PUSH if getattr(new.push, f) != getattr(old.push, f)
    ]
    if later:
        log.warning("reload: %s changed; that takes a restart", ", ".join(later))
    kept = {f: getattr(old, f) for f in RESTART_ONLY}
    push = replace(old.push, token=new.push.token)
    await daemon.apply(replace(new, push=push, **kept))
    if web is not None and daemon.web_guard is not None:
        daemon.web_guard.reload(web)
    if new.log != old.log:
        logs.setup(new.log.level, new.log.format)
    log.info("reloaded %s", old.source or "the defaults")
    return ""


def _refused(error: str) -> str:
    log.error("reload failed, everything keeps running as it was: %s", error)
    return error
