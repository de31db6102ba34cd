"""The three providers' notices, read from answers shaped as each provider documents them."""

from __future__ import annotations

import json

import pytest

from gpuwatch.cloud.config import parse_cloud
from gpuwatch.cloud.notices import (
    GCP_GPU_MAINTENANCE_S,
    GCP_PREEMPTION_S,
    Notice,
    NoticeError,
    aws_instance_action,
    azure_notices,
    gcp_notices,
)
from gpuwatch.text.timefmt import parse_rfc3339
from gpuwatch.text.yamlfile import Checker, parse

NOW = 1_800_000_000.0


def test_an_aws_instance_action_is_a_notice_at_its_time() -> None:
    # The documented shape: {"action": "terminate", "time": "2017-09-18T08:22:00Z"}
    found = aws_instance_action(b'{"action": "terminate", "time": "2017-09-18T08:22:00Z"}')
    assert found == Notice("aws", "terminate", parse_rfc3339("2017-09-18T08:22:00Z"))
    assert aws_instance_action(b'{"action": "Stop", "time": "2017-09-18T08:22:00Z"}').event == (
        "stop"
    )
    for bad in (
        b"<html>",
        b"[]",
        b'{"action": "terminate"}',
        b'{"action": 1, "time": "x"}',
        b'{"action": "stop", "time": "soon"}',
    ):
        with pytest.raises(NoticeError):
            aws_instance_action(bad)


def test_gcp_preempted_and_gpu_maintenance_get_their_documented_notice_periods() -> None:
    seen = {"preempted": NOW, "terminate_on_host_maintenance": NOW + 5}
    assert gcp_notices("FALSE", "NONE", seen) == []
    assert gcp_notices("FALSE", "MIGRATE_ON_HOST_MAINTENANCE", seen) == []
    assert gcp_notices("TRUE\n", "NONE", seen) == [
        Notice("gcp", "preempted", NOW + GCP_PREEMPTION_S)
    ]
    assert gcp_notices("FALSE", "TERMINATE_ON_HOST_MAINTENANCE", seen) == [
        Notice("gcp", "terminate_on_host_maintenance", NOW + 5 + GCP_GPU_MAINTENANCE_S)
    ]
    with pytest.raises(NoticeError, match="unknown value"):
        gcp_notices("FALSE", "SOMETHING_NEW", seen)


def azure(*events: dict[str, object]) -> bytes:
    return json.dumps({"DocumentIncarnation": 2, "Events": list(events)}).encode()


def test_azure_events_that_take_this_vm_away_and_none_else() -> None:
    spot = {
        "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": ["gpu-vm-7"],
        "EventStatus": "Scheduled",
        "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    at = parse_rfc3339("2016-09-19T18:29:47Z")
    assert azure_notices(azure(spot), "gpu-vm-7", NOW) == [
        Notice("azure", "preempt", at, "602d9444-d2cd-49c7-8624-8643e7171297")
    ]
    assert azure_notices(azure(spot), "another-vm", NOW) == []  # a neighbour's
    freeze = {**spot, "EventType": "Freeze"}  # a pause of seconds: nothing goes away
    assert azure_notices(azure(freeze), "gpu-vm-7", NOW) == []
    started = {
        **spot,
        "EventType": "Reboot",
        "EventStatus": "Started",
        "NotBefore": "",
        "Resources": [],
        "Description": "Host server is undergoing maintenance.",
    }
    assert azure_notices(azure(started), "gpu-vm-7", NOW) == [
        Notice("azure", "reboot", NOW, "Host server is undergoing maintenance.")
    ]
    assert azure_notices(azure(), "gpu-vm-7", NOW) == []
    for bad in (b"{}", b'{"Events": [1]}', azure({**spot, "NotBefore": "tomorrow"}), b"x"):
        with pytest.raises(NoticeError):
            azure_notices(bad, "gpu-vm-7", NOW)


def test_the_config_takes_a_provider_and_its_documented_address_by_default() -> None:
    def read(text: str) -> tuple[object, list[str]]:
        r = Checker(parse(text, "gpuwatch.yaml"))
        return parse_cloud(r, r.doc.data.get("cloud")), [p.message for p in r.problems]

    assert read("cloud: {provider: aws}\n")[0] == parse_cloud(
        Checker(parse("{}", "x")), {"provider": "aws", "address": "http://169.254.169.254"}
    )
    config, problems = read("cloud: {provider: gcp, interval: 10s}\n")
    assert problems == [] and config is not None
    assert (config.address, config.interval) == ("http://metadata.google.internal", 10.0)  # type: ignore[attr-defined]
    assert read("cloud: {provider: oracle}\n")[1] == [
        "expected one of aws, gcp, azure, got 'oracle'"
    ]
    assert read("cloud: {address: http://x}\n")[1] == [
        "missing 'provider' (one of aws, gcp, azure)"
    ]
    assert read("cloud: {provider: aws, address: 169.254.169.254}\n")[1] == [
        "must be an http:// or https:// URL"
    ]
