"""What `gpuwatch config check` prints: the config in effect as a file that loads again to the
same config, in the words an operator writes it (durations as `30d`, not 2592000.0), and
for each key left unset on purpose, a comment saying what applies instead."""

from __future__ import annotations

from typing import Any

import yaml

from gpuwatch.config import Config

# The config's durations, wherever they sit (receivers, nested routes): every key so named
# is a duration in seconds, and none of another kind is.
DURATION_KEYS = frozenset({
    "interval", "timeout", "slow_interval", "retention", "stale_after", "resume_after",
    "group_wait", "group_interval", "repeat_interval", "drain_grace",
})  # fmt: skip
# A key whose value is none means another thing applies; said, not printed as `null`.
UNSET_MEANS: dict[tuple[str, ...], str] = {
    ("sampling", "timeout"): "one sampling interval",
    ("rules", "files"): "the packs shipped with gpuwatch",
    ("rules", "interval"): "the sampling interval, but at least 1s",
    ("push", "token"): "no pushes over TCP",
    ("push", "textfile_dir"): "no textfiles are read",
    ("push", "socket"): "push.sock beside the control socket",
    ("push", "socket_group"): "the daemon's own group",
    ("actions", "slurm", "node"): "node_name",
    ("actions", "slurm", "max_drains_per_hour"): "no limit",
    ("actions", "checkpoint", "signal"): "no signal is sent",
    ("sources", "cloud"): "no cloud metadata service is asked",
    ("web_config",): "plain HTTP, no passwords",
    ("notify", "external_url"): "the daemon's own URL",
}
_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def duration_text(seconds: float) -> str:
    """Exactly `seconds`, as the config's durations are written: 1d2h, 1s500ms, 0s."""
    millis = round(seconds * 1000)
    rest, ms = divmod(millis, 1000)
    out = ""
    for unit, size in _UNITS:
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out + (f"{ms}ms" if ms else "") or "0s"


def config_text(config: Config) -> str:
    data = config.as_dict()
    _durations_as_text(data)
    unset = []
    for path, means in UNSET_MEANS.items():
        parent = _parent(data, path)
        if parent is not None and path[-1] in parent and parent[path[-1]] is None:
            del parent[path[-1]]
            unset.append(f"#   {'.'.join(path)}: {means}")
    text = yaml.safe_dump(data, sort_keys=False).rstrip()
    if unset:
        text += "\n# Not set, so what applies instead:\n" + "\n".join(unset)
    return text


def _parent(data: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    for key in path[:-1]:
        data = data.get(key)  # type: ignore[assignment]
        if not isinstance(data, dict):
            return None
    return data


def _durations_as_text(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _durations_as_text(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in DURATION_KEYS and isinstance(value, float | int) and value is not True:
                node[key] = duration_text(float(value))
            else:
                _durations_as_text(value)
