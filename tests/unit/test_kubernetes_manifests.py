"""deploy/kubernetes against Kubernetes' own schemas (kubernetes-validate's, strict: no field
the API server would drop) for two releases, and against gpuwatch itself: the config the
ConfigMap holds loads, and every gpuwatch command the manifests run is one gpuwatch takes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuwatch.clients.parser import build_parser
from gpuwatch.config import load_config
from gpuwatch.serve import verdictfile

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
# The oldest release still patched when these were written, and the newest the validator has.
VERSIONS = ("1.30.0", "1.37.0")
# Custom resources: not in Kubernetes' schemas (the Prometheus Operator defines this one).
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{path.name}#{i}", doc)
        for path in sorted(DEPLOY.glob("*.yaml"))
        for i, doc in enumerate(yaml.safe_load_all(path.read_text()))
        if doc
    ]


def kind(wanted: str, name: str = "gpuwatch") -> dict[str, Any]:
    [found] = [
        doc for _, doc in documents() if doc["kind"] == wanted and doc["metadata"]["name"] == name
    ]
    return found


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "doc"), documents(), ids=[n for n, _ in documents()])
def test_each_manifest_is_valid_kubernetes(name: str, doc: dict[str, Any], version: str) -> None:
    if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(doc, version, strict=True)
        return
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_refuses_a_misspelt_field() -> None:
    daemonset = kind("DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    container["livenessProbe"]["exec"]["comand"] = container["livenessProbe"]["exec"].pop("command")
    with pytest.raises(kubernetes_validate.ValidationError, match="'comand' was unexpected"):
        kubernetes_validate.validate(daemonset, VERSIONS[-1], strict=True)


def test_the_pieces_fit_together() -> None:
    daemonset, service, monitor = kind("DaemonSet"), kind("Service"), kind("ServiceMonitor")
    pod = daemonset["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    [port] = service["spec"]["ports"]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {port["name"]}
    [container] = pod["spec"]["containers"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    assert pod["spec"]["serviceAccountName"] == kind("ServiceAccount")["metadata"]["name"]
    [priority] = [doc for _, doc in documents() if doc["kind"] == "PriorityClass"]
    assert pod["spec"]["priorityClassName"] == priority["metadata"]["name"]
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] != 0
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_configmap_holds_a_config_gpuwatch_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "gpuwatch.yaml"
    config_file.write_text(kind("ConfigMap")["data"]["gpuwatch.yaml"])
    monkeypatch.setenv("NODE_NAME", "gpu-node-17")  # what the downward API gives the pod
    config = load_config(config_file)
    assert config.node_name == "gpu-node-17"
    assert config.sources.kmsg_path is None and config.sources.fabric_manager is None


def test_every_gpuwatch_command_they_run_is_one_gpuwatch_takes() -> None:
    container = kind("DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    run = build_parser().parse_args(container["args"])
    assert (run.command, run.config) == ("run", "/etc/gpuwatch/gpuwatch.yaml")
    probe = container["livenessProbe"]["exec"]["command"]
    assert probe[0] == "gpuwatch"
    alive = build_parser().parse_args(probe[1:])
    assert alive.alive and alive.state_dir == "/var/lib/gpuwatch"


def test_the_npd_plugin_reads_the_verdict_file_gpuwatch_writes() -> None:
    npd = kind("ConfigMap", "npd-gpuwatch")["data"]
    plugin = json.loads(npd["gpuwatch.json"])
    [rule] = plugin["rules"]
    assert rule["condition"] == plugin["conditions"][0]["type"] == "GpuUnhealthy"
    # The script is this ConfigMap's, mounted at /config/gpuwatch in NPD's pod.
    assert rule["path"] == "/config/gpuwatch/gpuwatch-verdict.sh"
    assert npd["gpuwatch-verdict.sh"].startswith("#!/bin/bash\n")
    # The file the daemon renews in the state directory the DaemonSet's hostPath holds.
    [state] = [
        v for v in kind("DaemonSet")["spec"]["template"]["spec"]["volumes"] if v["name"] == "state"
    ]
    assert rule["args"][0] == f"{state['hostPath']['path']}/{verdictfile.FILE_NAME}"
    assert int(rule["args"][1]) > verdictfile.TOUCH_EVERY_S * 3


def test_prometheus_keeps_pushed_job_labels_and_only_it_may_scrape() -> None:
    [endpoint] = kind("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    policy = kind("NetworkPolicy")
    pod_labels = kind("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    [rule] = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [kind("Service")["spec"]["ports"][0]["name"]]


def test_the_image_the_daemonset_names_is_the_one_make_image_builds() -> None:
    root = DEPLOY.parents[1]
    version = re.search(r'^version = "(.+)"', (root / "pyproject.toml").read_text(), re.M)
    assert version is not None
    makefile = (root / "Makefile").read_text()
    assert "IMAGE ?= registry.example.com/gpuwatch:$(VERSION)" in makefile
    spec = kind("DaemonSet")["spec"]["template"]["spec"]
    images = {c["image"] for c in spec["containers"] + spec["initContainers"]}
    assert images == {f"registry.example.com/gpuwatch:{version[1]}"}
    # The user the image runs as is the pod's, and the one the state directory is handed to.
    containerfile = (root / "deploy" / "container" / "Containerfile").read_text()
    [user] = re.findall(r"^USER (\d+):(\d+)$", containerfile, re.M)
    security = spec["securityContext"]
    assert (str(security["runAsUser"]), str(security["runAsGroup"])) == user
    [init] = spec["initContainers"]
    assert init["command"] == ["chown", f"{user[0]}:{user[1]}", "/var/lib/gpuwatch"]
