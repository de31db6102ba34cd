"""The `sources.cloud` section: which provider's metadata service to ask for notices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwatch.text.yamlfile import Checker, http_url, one_of, positive_duration

PROVIDERS = ("aws", "gcp", "azure")
# Where each provider's metadata service answers (GCP's name resolves to the same address).
DEFAULT_ADDRESS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
INTERVAL_S = 5.0  # AWS asks to be checked every 5 seconds; its notice is two minutes


@dataclass(frozen=True, slots=True)
class CloudConfig:
    provider: str
    address: str
    interval: float = INTERVAL_S


def parse_cloud(r: Checker, raw: Any) -> CloudConfig | None:
    path = ("sources", "cloud")
    data = r.section(raw, path, ("provider", "address", "interval"))
    if not data:
        return None
    if not r.require(data, path, "provider", f"one of {', '.join(PROVIDERS)}"):
        return None
    provider = r.value(data, path, "provider", one_of(PROVIDERS), "")
    if not provider:
        return None
    return CloudConfig(
        provider,
        r.value(data, path, "address", http_url, DEFAULT_ADDRESS[provider]).rstrip("/"),
        r.value(data, path, "interval", positive_duration, INTERVAL_S),
    )
