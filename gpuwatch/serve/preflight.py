"""What `gpuwatch run` loads and checks before it starts anything, in one place, so that
`gpuwatch config check` runs the very same steps: a config the check passes is one the
daemon starts with, and one it refuses is refused by the check with the same message.

Steps that need the running host (binding the listener, the state directory, the sockets)
stay with the daemon's start; what they would trip over and can be foreseen is said here
as a warning."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatch.config import Config, default_rule_interval
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.rules.outgoing import cause_labels, shipped_causes
from gpuwatch.serve.webconfig import WebGuard, load_web_config
from gpuwatch.state.paths import PUSH_SOCKET_NAME, socket_path
from gpuwatch.state.reach import blocked_at
from gpuwatch.store.tsdb import Store
from gpuwatch.text.yamlfile import FileError
from gpuwatch.web.foreground import StepAsideFn, never

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The daemon cannot start as configured; the message says why and what to do."""


class RulesError(StartupError):
    """The rule files have errors; the message lists each with file and line."""


def load_guard(config: Config) -> WebGuard | None:
    """The listener's TLS and basic auth from web_config, or None without one."""
    if config.web_config is None:
        return None
    try:
        return WebGuard(load_web_config(config.web_config))
    except FileError as exc:
        raise StartupError(f"web config:\n{exc}") from exc


def load_rules(
    config: Config,
    state_dir: Path | None,
    store: Store,
    own_url: str,
    step_aside: StepAsideFn = never,
) -> RuleEngine:
    """The rule files loaded and built; with a state directory, their alerts restored.
    `step_aside`: what the evaluation waits on while a client is served."""
    engine = RuleEngine(
        store,
        config.rules.files,
        default_rule_interval(config.rules, config.sampling),
        state_dir,
        # where an alert's reader can look, as the notifier links to it
        config.notify.external_url or own_url,
        allow_empty_globs=config.rules.allow_empty_globs,
        step_aside=step_aside,
    )
    try:
        engine.load()
    except FileError as exc:
        raise RulesError(f"rule files:\n{exc}") from exc
    return engine


def socket_paths(config: Config) -> tuple[Path, Path]:
    """(control, push) sockets; the same path for both is refused."""
    control = socket_path(config.state_dir)
    push = Path(config.push.socket) if config.push.socket else control.with_name(PUSH_SOCKET_NAME)
    if os.path.realpath(push) == os.path.realpath(control):  # `..` and links resolved
        raise StartupError(f"push.socket {push} is the control socket: give it its own path")
    return control, push


def unraised_warning(rules: RuleEngine) -> str:
    """Non-empty when the rules leave the verdict without causes it is documented to have
    (the shipped hardware and thermal packs not listed in rules.files)."""
    loaded = cause_labels(rules.alerting_rules())
    missing = [c for c in shipped_causes() if c not in loaded]
    if not missing:
        return ""
    return (
        f"no loaded rule raises the verdict's causes {', '.join(missing)} (a `cause` label), so "
        "the verdict does not judge them: list the shipped hardware and thermal packs in "
        "rules.files (docs/rules.md)"
    )


def config_warnings(config: Config, rules: RuleEngine) -> list[str]:
    """What would start but not do what the config says."""
    out = [w for w in (unraised_warning(rules),) if w]
    if rules.patterns is not None and not rules.files:
        out.append(f"rules.files {rules.patterns} match no file: no rules are evaluated")
    slurm = config.actions.slurm
    if slurm.enabled:
        import shutil  # here: a node without Slurm actions need not hold it

        for key, program in (("scontrol", slurm.scontrol), ("sinfo", slurm.sinfo)):
            if shutil.which(program) is None:
                out.append(
                    f"actions.slurm.{key}: {program!r} is not found here (PATH "
                    f"{os.environ.get('PATH', '')}): the node cannot be drained"
                )
    return out


def reach_warnings(config: Config, push_socket: Path) -> list[str]:
    """What jobs of other users cannot reach, said at start once the sockets exist: the push
    socket (when its mode lets others in) and the textfile directory."""
    out = []
    push = config.push
    if push.socket_mode & 0o006 or push.socket_group is not None:
        blocked = blocked_at(push_socket, push.socket_group)
        if blocked is not None:
            where, mode = blocked
            out.append(
                f"push socket {push_socket}: other users cannot reach it ({where} is mode "
                f"{mode:04o}), so their jobs cannot push: set push.socket to a path in a "
                "directory they can search, such as /run/gpuwatch/push.sock (under systemd, "
                "its RuntimeDirectory is used)"
            )
    if push.textfile_dir is not None:
        blocked = blocked_at(Path(push.textfile_dir) / "x.prom")
        if blocked is not None:
            where, mode = blocked
            out.append(
                f"push.textfile_dir {push.textfile_dir}: other users cannot reach it ({where} "
                f"is mode {mode:04o}), so their jobs cannot write there: use a directory "
                "outside the state directory, such as /var/lib/gpuwatch-textfiles (docs/jobs.md)"
            )
    return out


@dataclass
class Checked:
    """What `config check` found: errors the daemon would refuse to start with, warnings it
    would start with."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rules: RuleEngine | None = None


def check(config: Config) -> Checked:
    """Every step `run` takes before it binds, on `config`, each error collected."""
    found = Checked()
    for step in (load_guard, socket_paths):
        try:
            step(config)
        except StartupError as exc:
            found.errors.append(str(exc))
    try:
        found.rules = load_rules(config, None, Store(config.store.retention), "")
    except RulesError as exc:
        found.errors.append(str(exc))
    else:
        found.warnings = config_warnings(config, found.rules)
    return found
