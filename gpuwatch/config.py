"""The daemon's configuration: defaults that work with no file, and strict checking of a file."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuwatch.actions.config import ActionsConfig, parse_actions
from gpuwatch.cloud.config import CloudConfig, parse_cloud
from gpuwatch.kernel.fabric_manager import DEFAULT_ADDRESS as DEFAULT_FABRIC_MANAGER
from gpuwatch.kernel.fabric_manager import parse_address
from gpuwatch.notify.config import NotifyConfig, parse_notify
from gpuwatch.nvml.config import SamplingConfig
from gpuwatch.push.config import PushConfig, parse_push
from gpuwatch.state.paths import default_state_dir
from gpuwatch.text.secrets import parse_secret
from gpuwatch.text.units import parse_listen
from gpuwatch.text.yamlfile import (
    Checker,
    YamlDoc,
    boolean,
    file_path,
    http_url,
    load,
    one_of,
    plain_path,
    positive_duration,
    relative_to,
    text,
    whole_number,
)

DEFAULT_LISTEN = "0.0.0.0:10040"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("logfmt", "json")


@dataclass(frozen=True, slots=True)
class StoreConfig:
    retention: float = 3600.0


@dataclass(frozen=True, slots=True)
class LogConfig:
    level: str = "info"
    format: str = "logfmt"


@dataclass(frozen=True, slots=True)
class JournalConfig:
    retention: float = 30 * 86400.0


@dataclass(frozen=True, slots=True)
class RulesConfig:
    # Rule files and globs; None means the packs shipped with gpuwatch.
    files: tuple[str, ...] | None = None
    # Evaluation interval of groups that set none; None means the sampling interval, but
    # not more often than once a second (see default_rule_interval).
    interval: float | None = None
    # A glob in `files` that matches nothing is refused, unless this says it may (a
    # directory operators fill later).
    allow_empty_globs: bool = False


MIN_DEFAULT_RULE_INTERVAL_S = 1.0


def default_rule_interval(rules: RulesConfig, sampling: SamplingConfig) -> float:
    """Groups without an interval run at `rules.interval`, else with the sampling cycle, but
    at most once a second: faster sampling is for the dashboards, and a fault event triggers an
    evaluation at once anyway."""
    if rules.interval is not None:
        return rules.interval
    return max(sampling.interval, MIN_DEFAULT_RULE_INTERVAL_S)


@dataclass(frozen=True, slots=True)
class SourcesConfig:
    # sources.dcgm.url: read the GPUs through this dcgm-exporter instead of NVML.
    dcgm_url: str | None = None
    # sources.kmsg: the kernel log, for the NVIDIA driver's lines (XIDs with their text, SXids,
    # a GPU fallen off the bus); a regular file that grows works too. None: not read.
    kmsg_path: str | None = "/dev/kmsg"
    # sources.host.sysfs_root: where sysfs is (PCI devices, InfiniBand ports).
    sysfs_root: str = "/sys"
    # sources.host.fabric_manager: Fabric Manager's command port (HOST:PORT or a Unix socket
    # path), asked on nodes with NVSwitches; None (false in the file): not asked.
    fabric_manager: str | None = DEFAULT_FABRIC_MANAGER
    # sources.cloud: the provider (aws, gcp, azure) whose metadata service is asked for
    # notices (spot reclaims, maintenance), at `address` (its documented one by default),
    # every `interval`. None: not asked.
    cloud: CloudConfig | None = None


@dataclass(frozen=True, slots=True)
class Config:
    listen: str = DEFAULT_LISTEN
    state_dir: str = field(default_factory=default_state_dir)
    node_name: str = field(default_factory=socket.gethostname)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    store: StoreConfig = StoreConfig()
    log: LogConfig = LogConfig()
    rules: RulesConfig = RulesConfig()
    journal: JournalConfig = JournalConfig()
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    push: PushConfig = field(default_factory=PushConfig)
    actions: ActionsConfig = field(default_factory=ActionsConfig)
    sources: SourcesConfig = SourcesConfig()
    web_config: str | None = None  # exporter-toolkit web-config file: TLS, basic auth
    source: str | None = None  # the file it was read from, None for defaults

    def with_overrides(
        self,
        listen: str | None,
        state_dir: str | None,
        web_config: str | None = None,
        dcgm_url: str | None = None,
    ) -> Config:
        return replace(
            self,
            listen=listen if listen is not None else self.listen,
            state_dir=state_dir if state_dir is not None else self.state_dir,
            web_config=web_config if web_config is not None else self.web_config,
            sources=replace(self.sources, dcgm_url=dcgm_url)
            if dcgm_url is not None
            else self.sources,
        )

    def as_dict(self) -> dict[str, Any]:
        """For `config check`: the config in effect in the file's own keys, a config that
        loads again (but for a secret given inline, which is never printed)."""
        out = asdict(replace(self, notify=NotifyConfig(), push=replace(self.push, token=None)))
        out.pop("source")
        out["notify"] = self.notify.as_dict()  # secrets say where they are from, not what
        out["push"]["token"] = self.push.token.as_config() if self.push.token else None
        out["push"]["socket_mode"] = f"{self.push.socket_mode:04o}"
        sources = self.sources
        out["sources"] = {
            **({"dcgm": {"url": sources.dcgm_url}} if sources.dcgm_url is not None else {}),
            "kmsg": {"enabled": sources.kmsg_path is not None}
            | ({"path": sources.kmsg_path} if sources.kmsg_path is not None else {}),
            "host": {
                "sysfs_root": sources.sysfs_root,
                "fabric_manager": sources.fabric_manager or False,
            },
        }
        return out


def _listen(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected HOST:PORT such as 0.0.0.0:10040, got {value!r}")
    parse_listen(value)
    return value


def _paths(config_file: str) -> Callable[[Any], tuple[str, ...]]:
    """A list of paths or globs; relative ones are relative to the config file."""

    def convert(value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(
            isinstance(v, str) and v and "\0" not in v for v in value
        ):
            raise ValueError(f"expected a list of file paths or globs, got {value!r}")
        return tuple(relative_to(config_file, v) for v in value)

    return convert


def _node_name(value: Any, base_dir: Path) -> str:
    """A name, or `{env: VAR}` / `{file: PATH}` as for a secret (in a pod, the downward API's
    spec.nodeName: the pod's host name is not the node's)."""
    return text(value) if isinstance(value, str) else parse_secret(value, base_dir).reveal()


def _fabric_manager(value: Any) -> str | None:
    """HOST:PORT or a Unix socket path; false: not asked."""
    if value is False:
        return None
    if not isinstance(value, str):
        raise ValueError(f"expected HOST:PORT, a Unix socket path or false, got {value!r}")
    parse_address(value)
    return value


def from_doc(doc: YamlDoc) -> Config:
    r = Checker(doc)
    base = Config()
    top = r.section(
        doc.data,
        (),
        (
            "listen",
            "state_dir",
            "node_name",
            "sampling",
            "store",
            "log",
            "rules",
            "journal",
            "notify",
            "push",
            "sources",
            "web_config",
            "actions",
        ),
    )

    s = r.section(
        top.get("sampling"),
        ("sampling",),
        ("interval", "timeout", "max_abandoned_workers", "process_memory_metrics", "slow_interval"),
    )
    sampling = SamplingConfig(
        interval=r.value(s, ("sampling",), "interval", positive_duration, 1.0),
        timeout=r.value(s, ("sampling",), "timeout", positive_duration, None),
        max_abandoned_workers=r.value(
            s, ("sampling",), "max_abandoned_workers", whole_number(1, 1024), 16
        ),
        process_memory_metrics=r.value(s, ("sampling",), "process_memory_metrics", boolean, False),
        slow_interval=r.value(s, ("sampling",), "slow_interval", positive_duration, 5.0),
    )
    st = r.section(top.get("store"), ("store",), ("retention",))
    store = StoreConfig(
        retention=r.value(st, ("store",), "retention", positive_duration, 3600.0),
    )
    lg = r.section(top.get("log"), ("log",), ("level", "format"))
    log = LogConfig(
        level=r.value(lg, ("log",), "level", one_of(LOG_LEVELS), "info"),
        format=r.value(lg, ("log",), "format", one_of(LOG_FORMATS), "logfmt"),
    )
    ru = r.section(top.get("rules"), ("rules",), ("files", "interval", "allow_empty_globs"))
    rules = RulesConfig(
        files=r.value(ru, ("rules",), "files", _paths(doc.file), None),
        interval=r.value(ru, ("rules",), "interval", positive_duration, None),
        allow_empty_globs=r.value(ru, ("rules",), "allow_empty_globs", boolean, False),
    )
    jo = r.section(top.get("journal"), ("journal",), ("retention",))
    journal = JournalConfig(
        retention=r.value(jo, ("journal",), "retention", positive_duration, 30 * 86400.0),
    )
    so = r.section(top.get("sources"), ("sources",), ("dcgm", "kmsg", "host", "cloud"))
    dcgm = r.section(so.get("dcgm"), ("sources", "dcgm"), ("url",))
    km = r.section(so.get("kmsg"), ("sources", "kmsg"), ("enabled", "path"))
    kmsg_path = r.value(km, ("sources", "kmsg"), "path", file_path(doc.file, "file"), "/dev/kmsg")
    kmsg_on = r.value(km, ("sources", "kmsg"), "enabled", boolean, True)
    ho = r.section(so.get("host"), ("sources", "host"), ("sysfs_root", "fabric_manager"))
    sources = SourcesConfig(
        dcgm_url=r.value(dcgm, ("sources", "dcgm"), "url", http_url, None),
        kmsg_path=kmsg_path if kmsg_on else None,
        sysfs_root=r.value(
            ho, ("sources", "host"), "sysfs_root", file_path(doc.file, "directory"), "/sys"
        ),
        fabric_manager=r.value(
            ho, ("sources", "host"), "fabric_manager", _fabric_manager, base.sources.fabric_manager
        ),
        cloud=parse_cloud(r, so.get("cloud")),
    )
    base_dir = Path(doc.file).parent
    config = Config(
        listen=r.value(top, (), "listen", _listen, base.listen),
        state_dir=r.value(top, (), "state_dir", plain_path, base.state_dir),
        node_name=r.value(top, (), "node_name", lambda v: _node_name(v, base_dir), base.node_name),
        sampling=sampling,
        store=store,
        log=log,
        rules=rules,
        journal=journal,
        notify=parse_notify(r, doc, top.get("notify")),
        push=parse_push(r, doc, top.get("push")),
        actions=parse_actions(r, doc, top.get("actions")),
        sources=sources,
        web_config=r.value(top, (), "web_config", file_path(doc.file, "file"), None),
        source=doc.file,
    )
    if sampling.timeout is not None and sampling.timeout > sampling.interval:
        r.problems.append(
            doc.problem(
                ("sampling", "timeout"),
                "must not exceed sampling.interval, or one hung GPU would slow every cycle",
            )
        )
    r.check()
    return config


def load_config(path: str | Path | None) -> Config:
    """The config from `path`, or the defaults when no path is given. Raises FileError."""
    if path is None:
        return Config()
    return from_doc(load(path))
