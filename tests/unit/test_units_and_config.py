from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpuwatch.cli import main
from gpuwatch.config import Config, default_rule_interval, load_config
from gpuwatch.rules.files import load_rule_files
from gpuwatch.text.units import parse_duration, parse_listen
from gpuwatch.text.yamlfile import FileError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        (2, 2.0),
        ("1d", 86400.0),
        ("0", 0.0),
        ("2w", 1209600.0),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["fast", "1x", "", "s", -1, True, "1s 2m"])
def test_bad_durations_say_what_was_expected(bad: object) -> None:
    with pytest.raises(ValueError, match=r"duration|negative"):
        parse_duration(bad)


def test_listen_addresses() -> None:
    assert parse_listen("0.0.0.0:10040") == ("0.0.0.0", 10040)
    assert parse_listen("[::1]:9") == ("::1", 9)
    for bad in ("10040", "host:", "host:99999", ":80"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_no_file_means_working_defaults() -> None:
    config = load_config(None)
    assert config == Config(state_dir=config.state_dir, node_name=config.node_name)
    assert config.listen == "0.0.0.0:10040"
    assert config.sampling.interval == 1.0
    assert config.sampling.deadline == 1.0
    assert config.store.retention == 3600.0


def test_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "gpuwatch.yaml"
    path.write_text("listen: 127.0.0.1:9000\nsampling:\n  interval: 2s\n  timeout: 500ms\n")
    config = load_config(path)
    assert config.listen == "127.0.0.1:9000"
    assert config.sampling.interval == 2.0
    assert config.sampling.deadline == 0.5


def test_every_bad_value_is_reported_with_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "gpuwatch.yaml"
    path.write_text(
        "listen: everywhere\n"
        "sampling:\n"
        "  interval: fast\n"
        "  max_abandoned_workers: 0\n"
        "stroe:\n"
        "  retention: 1h\n"
        "log:\n"
        "  level: loud\n"
    )
    with pytest.raises(FileError) as caught:
        load_config(path)
    lines = str(caught.value).splitlines()
    assert lines == [
        f"{path}:5: stroe: unknown key; expected one of: "
        "listen, state_dir, node_name, sampling, store, log, rules, journal, notify, push, "
        "sources, web_config, actions",
        f"{path}:3: sampling.interval: expected a duration such as 1s, 500ms or 5m, got 'fast'",
        f"{path}:4: sampling.max_abandoned_workers: expected a whole number from 1 to 1024, got 0",
        f"{path}:8: log.level: expected one of debug, info, warning, error, got 'loud'",
        f"{path}:1: listen: expected HOST:PORT such as 0.0.0.0:10040, got 'everywhere'",
    ]


def test_timeout_longer_than_the_interval_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sampling:\n  interval: 1s\n  timeout: 5s\n")
    with pytest.raises(FileError, match=r"c.yaml:3: sampling.timeout: must not exceed"):
        load_config(path)


def test_fast_sampling_reads_slow_fields_every_5s_and_rules_run_at_most_once_a_second(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sampling: {interval: 100ms}\n")
    config = load_config(path)
    assert config.sampling.slow_interval == 5.0
    assert default_rule_interval(config.rules, config.sampling) == 1.0
    path.write_text("sampling: {interval: 100ms, slow_interval: 2s}\nrules: {interval: 200ms}\n")
    config = load_config(path)
    assert config.sampling.slow_interval == 2.0
    assert default_rule_interval(config.rules, config.sampling) == 0.2  # as asked
    path.write_text("sampling: {interval: 30s}\n")
    config = load_config(path)
    assert default_rule_interval(config.rules, config.sampling) == 30.0
    path.write_text("sampling: {slow_interval: never}\n")
    with pytest.raises(FileError, match=r"c.yaml:1: sampling.slow_interval: expected a duration"):
        load_config(path)


def test_config_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("store: {retention: 2h}\n")
    assert main(["config", "check", "-c", str(good)]) == 0
    out = capsys.readouterr().out
    assert f"{good}: OK" in out and "retention: 2h" in out and "retention: 7200" not in out

    bad = tmp_path / "bad.yaml"
    bad.write_text("sampling: [1, 2]\n")
    assert main(["config", "check", str(bad)]) == 2
    assert f"{bad}:1: sampling: expected a mapping, got [1, 2]" in capsys.readouterr().err

    broken = tmp_path / "broken.yaml"
    broken.write_text("listen: [\n")
    assert main(["config", "check", str(broken)]) == 2
    assert "not valid YAML" in capsys.readouterr().err

    assert main(["config", "check", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_config_check_prints_a_config_that_loads_as_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GW_HOOK", "https://hooks.example/T0/B0/secret")
    (tmp_path / "pd.key").write_text("routing-key\n")
    (tmp_path / "token").write_text("push-token\n")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "node.yaml").write_text("groups: []\n")
    given = tmp_path / "given.yaml"
    given.write_text(
        "node_name: gpu-node-07\nsampling: {interval: 500ms}\nstore: {retention: 2h}\n"
        "rules: {files: [rules/*.yaml], interval: 5s}\n"
        "sources: {dcgm: {url: 'http://127.0.0.1:9400/metrics'}}\n"
        "push: {token: {file: token}, textfile_dir: /var/lib/node_exporter}\n"
        "notify:\n"
        "  receivers:\n"
        "    - {name: chat, type: slack, url: {env: GW_HOOK}, rate_limit: 0.5}\n"
        "    - {name: pager, type: pagerduty, routing_key: {file: pd.key}, timeout: 3s}\n"
        "  route:\n"
        "    receiver: chat\n"
        "    group_by: [node, alertname]\n"
        "    routes:\n"
        "      - {receiver: pager, matchers: ['severity=\"critical\"'], continue: true}\n"
        "      - {matchers: ['alertname=~\"Xid.*\"'], group_wait: 0s}\n"
        "  external_url: https://grafana.example/d/gpuwatch\n"
    )
    assert main(["config", "check", str(given)]) == 0
    printed = capsys.readouterr().out.split("\n", 1)[1]
    assert "routing-key" not in printed and "push-token" not in printed and "B0" not in printed
    again = tmp_path / "again.yaml"
    again.write_text(printed)  # beside the secret files it names
    assert main(["config", "check", str(again)]) == 0
    assert capsys.readouterr().out.split("\n", 1)[1] == printed
    assert replace(load_config(again), source=None) == replace(load_config(given), source=None)
    # With no file at all, the defaults print as a config that loads as the defaults.
    assert main(["config", "check"]) == 0
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text(capsys.readouterr().out.split("\n", 1)[1])
    assert replace(load_config(defaults), source=None) == load_config(None)


def test_an_inline_secret_printed_by_config_check_does_not_load_as_the_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = tmp_path / "given.yaml"
    given.write_text("push: {token: s3cr3t, socket_group: '4242'}\n")
    assert main(["config", "check", str(given)]) == 0
    printed = capsys.readouterr().out.split("\n", 1)[1]
    assert "s3cr3t" not in printed and "socket_group: 4242" in printed
    again = tmp_path / "again.yaml"
    again.write_text(printed)
    assert main(["config", "check", str(again)]) == 2
    err = capsys.readouterr().err
    assert "push.token" in err and "is the placeholder `config check` prints" in err


def test_run_refuses_a_bad_config_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("sampling: {interval: 0s}\n")
    assert main(["run", "-c", str(bad), "--simulate", "healthy"]) == 2
    assert "sampling.interval: must be greater than zero" in capsys.readouterr().err
    assert main(["run", "--simulate", "no-such-scenario"]) == 2
    assert "no such scenario" in capsys.readouterr().err
    assert main(["run", "--speed", "10"]) == 2
    assert "--speed only applies with --simulate" in capsys.readouterr().err


def test_status_of_an_unreachable_daemon_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "http://127.0.0.1:9"]) == 3
    assert "unreachable" in capsys.readouterr().err


def test_a_zero_interval_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpuwatch.yaml"
    path.write_text('sampling:\n  interval: "0"\n')
    with pytest.raises(FileError, match=r"sampling\.interval: must be greater than zero"):
        load_config(path)


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    # PyYAML keeps the second silently; Prometheus and promtool refuse the file
    path = tmp_path / "rules.yaml"
    path.write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        expr: down\n"
    )
    with pytest.raises(FileError) as caught:
        load_rule_files([str(path)])
    assert str(caught.value.problems[0]).endswith(
        ':6: mapping key "expr" already defined at line 5'
    )


def test_the_node_name_can_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a pod the host name is the pod's: the downward API puts the node's in a variable."""
    path = tmp_path / "c.yaml"
    path.write_text("node_name: {env: NODE_NAME}\n")
    monkeypatch.setenv("NODE_NAME", "gpu-node-07")
    assert load_config(path).node_name == "gpu-node-07"
    monkeypatch.delenv("NODE_NAME")
    with pytest.raises(FileError, match=r"c\.yaml:1: node_name: environment variable NODE_NAME"):
        load_config(path)
    path.write_text("node_name: [a, b]\n")
    with pytest.raises(FileError, match=r"c\.yaml:1: node_name: expected a string"):
        load_config(path)


def test_a_path_with_a_nul_byte_is_refused_where_it_is_written(tmp_path: Path) -> None:
    # Every system call refuses such a path; the daemon would stop at start, or fail each cycle.
    bad = tmp_path / "nul.yaml"
    bad.write_text(
        'state_dir: "/var/lib/gw\\0"\n'
        'sources: {kmsg: {path: "/dev/kmsg\\0"}, host: {sysfs_root: "/sys\\0"}}\n'
        'rules: {files: ["rules/\\0*.yaml"]}\n'
    )
    with pytest.raises(FileError) as raised:
        load_config(bad)
    assert sorted((p.line, p.field) for p in raised.value.problems) == [
        (1, "state_dir"),
        (2, "sources.host.sysfs_root"),
        (2, "sources.kmsg.path"),
        (3, "rules.files"),
    ]
