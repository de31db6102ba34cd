"""Matchers, secrets, the notify config and the sender's retry rules."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from gpuwatch.cli import main
from gpuwatch.config import load_config
from gpuwatch.notify.matchers import parse_matcher
from gpuwatch.notify.sender import (
    BACKOFF_CAP_S,
    RETRY_AFTER_CAP_S,
    RETRY_AFTER_MIN_S,
    backoff,
    retry_after,
    wait_for_head,
)
from gpuwatch.text.secrets import Secret
from gpuwatch.text.yamlfile import FileError


def test_matchers_follow_alertmanager() -> None:
    labels = {"alertname": "GpuXidCritical", "gpu": "3", "severity": "critical"}
    assert parse_matcher('severity="critical"').matches(labels)
    assert parse_matcher("alertname=~GpuXid.*").matches(labels)
    assert not parse_matcher('alertname=~"Xid"').matches(labels)  # anchored
    assert parse_matcher('gpu!~"[0-2]"').matches(labels)
    assert parse_matcher('job=""').matches(labels)  # absent is empty
    assert str(parse_matcher('summary="say \\"hi\\""')) == 'summary="say \\"hi\\""'
    with pytest.raises(ValueError, match="bad regular expression"):
        parse_matcher('gpu=~"("')
    with pytest.raises(ValueError, match="not a matcher"):
        parse_matcher("gpu")


def test_retry_after_in_seconds_as_a_date_or_in_discords_body() -> None:
    assert retry_after({"Retry-After": "7"}, b"", 0.0) == 7.0
    assert retry_after({"Retry-After": "Thu, 01 Jan 1970 00:00:30 GMT"}, b"", 10.0) == 20.0
    assert retry_after({}, b'{"retry_after": 0.25, "global": false}', 0.0) == 0.25
    assert retry_after({}, b"slow down", 0.0) is None


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({"Retry-After": "1e12"}, b"", RETRY_AFTER_CAP_S),
        ({"Retry-After": "inf"}, b"", None),
        ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, b"", RETRY_AFTER_CAP_S),
        ({}, b'{"retry_after": 1e300}', RETRY_AFTER_CAP_S),
        ({"Retry-After": "-5"}, b"", None),
        ({"Retry-After": "nan"}, b"", None),
        ({"Retry-After": "0"}, b"", RETRY_AFTER_MIN_S),
        ({"Retry-After": "soon"}, b'{"retry_after": 2}', 2.0),
        ({}, b"[" * 100_000, None),
    ],
)
def test_a_retry_after_out_of_bounds_is_capped_or_ignored(
    headers: dict[str, str], body: bytes, expected: float | None
) -> None:
    """A service answering "in a year" must not silence its receiver for good; one answering
    -5 or NaN must not draw a request every few milliseconds (None: back off as for an error)."""
    assert retry_after(headers, body, 1_800_000_000.0) == expected


def test_an_outbox_row_scheduled_for_ever_is_tried_again_within_the_cap() -> None:
    assert wait_for_head(math.inf, 100.0) == RETRY_AFTER_CAP_S
    assert wait_for_head(1e15, 100.0) == RETRY_AFTER_CAP_S
    assert wait_for_head(130.0, 100.0) == 30.0
    assert wait_for_head(90.0, 100.0) == -10.0


def test_backoff_doubles_with_jitter_up_to_a_cap() -> None:
    rng = random.Random(1)
    for attempt in range(12):
        delay = backoff(attempt, rng)
        full = min(BACKOFF_CAP_S, 2.0**attempt)
        assert full / 2 <= delay <= full
    assert backoff(1000, rng) <= BACKOFF_CAP_S


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpuwatch.yaml"
    path.write_text(text)
    return path


def test_secrets_come_from_env_or_file_and_never_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GW_SLACK", "https://hooks.slack.com/services/T0/B0/TOPSECRET1")
    (tmp_path / "pd.key").write_text("TOPSECRET2\n")
    path = write(
        tmp_path,
        "notify:\n  receivers:\n"
        "    - {name: chat, type: slack, url: {env: GW_SLACK}}\n"
        "    - {name: pager, type: pagerduty, routing_key: {file: pd.key}}\n",
    )
    config = load_config(path)
    chat, pager = config.notify.receivers
    assert chat.url.reveal().endswith("TOPSECRET1")
    assert pager.routing_key is not None and pager.routing_key.reveal() == "TOPSECRET2"
    assert "TOPSECRET" not in repr(config) and "TOPSECRET" not in str(config.as_dict())
    assert main(["config", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "TOPSECRET" not in out
    assert "url:\n      env: GW_SLACK" in out
    assert f"routing_key:\n      file: {tmp_path / 'pd.key'}" in out
    assert repr(Secret("x", "inline")) == "<secret from inline>"
    assert Secret("x", "inline").as_config() == "<not shown: given inline>"


def test_bad_notify_config_is_reported_with_line_and_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "notify:\n"
        "  receivers:\n"
        "    - {name: ops, type: webhook, url: 'ftp://x'}\n"
        "    - {name: chat, type: slack, url: {env: GW_NOT_SET_ANYWHERE}}\n"
        "    - {name: ops, type: telegram, url: 'http://x'}\n"
        "  route:\n"
        "    receiver: nobody\n"
        "    group_wait: soon\n"
        "    routes:\n"
        "      - matchers: ['severity=~\"(\"']\n",
    )
    with pytest.raises(FileError) as caught:
        load_config(path)
    where = [line.split(": ", 1)[0] for line in str(caught.value).splitlines()]
    assert where == [f"{path}:{n}" for n in (3, 4, 5, 5, 7, 8, 10)]
    messages = [line.split(": ", 1)[1] for line in str(caught.value).splitlines()]
    assert messages == [
        "notify.receivers[0].url: must be an http:// or https:// URL",
        "notify.receivers[1].url: environment variable GW_NOT_SET_ANYWHERE is not set or empty",
        "notify.receivers[2].type: expected one of webhook, slack, mattermost, teams, discord, "
        "pagerduty, alertmanager, got 'telegram'",
        "notify.receivers[2].name: receiver 'ops' defined twice",
        "notify.route.receiver: no receiver named 'nobody'",
        "notify.route.group_wait: expected a duration such as 1s, 500ms or 5m, got 'soon'",
        "notify.route.routes[0].matchers: 'severity=~\"(\"': bad regular expression: "
        "missing ): ( (RE2 syntax)",
    ]
