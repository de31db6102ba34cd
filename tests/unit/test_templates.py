"""Template behaviour newer than Debian's promtool 2.42, so no conformance file can check it;
each expectation is Prometheus 3's (Go 1.23 text/template) as its source defines it."""

from __future__ import annotations

import pytest

from gpuwatch.rules.template import Template, TemplateData, TemplateError
from gpuwatch.rules.template.execute import MAX_OUTPUT

DATA = TemplateData(
    {"__name__": "gpu_temp", "gpu": "3", "q": "a b&c=d/é~x_y.z-1"},
    85.0,
    {"cluster": "c1"},
    "http://prom.example:9090/prefix",
    lambda expr, t: [({"gpu": "0"}, 1.0), ({"gpu": "1"}, 2.0)],
    1700000000.0,
)


def expand(source: str) -> str:
    return Template(source, "__alert_T").expand(DATA)


def test_url_query_escape_escapes_as_go_does() -> None:
    # space as +, only A-Z a-z 0-9 - _ . ~ kept, UTF-8 bytes in upper-case hex
    assert expand("{{ $labels.q | urlQueryEscape }}") == "a+b%26c%3Dd%2F%C3%A9~x_y.z-1"


def test_title_upper_cases_word_starts_and_lowers_nothing() -> None:
    # cases.Title(language.AmericanEnglish, cases.NoLower); Go's old strings.Title gave It'S
    assert expand('{{ title "hello wORLD it\'s gpu-node_a" }}') == "Hello WORLD It's Gpu-Node_a"


def test_durations_print_as_go_prints_them() -> None:
    assert expand("{{ toDuration 3723.5 }}|{{ toDuration 0.0015 }}|{{ toDuration 0 }}") == (
        "1h2m3.5s|1.5ms|0s"
    )
    assert expand('{{ parseDuration "1h30m" }} {{ parseDuration "-1d" }}') == "5400 -86400"
    assert "not a valid duration string" in expand('{{ parseDuration "5 minutes" }}')


def test_now_external_url_and_path_prefix_come_from_the_evaluation() -> None:
    assert expand("{{ now }}|{{ externalURL }}|{{ pathPrefix }}|{{ $externalURL }}") == (
        "1.7e+09|http://prom.example:9090/prefix|/prefix|http://prom.example:9090/prefix"
    )


def test_range_over_an_integer_and_else_with() -> None:
    assert expand("{{ range 3 }}{{ . }}{{ end }}") == "012"
    source = "{{ with $labels.none }}a{{ else with $labels.gpu }}gpu {{ . }}{{ end }}"
    assert expand(source) == "gpu 3"


def test_value_is_an_interface_in_the_data() -> None:
    assert "Value interface {} }" in expand("{{ .Foo }}")


def test_query_runs_at_the_evaluation_time_and_results_are_samples() -> None:
    seen: list[tuple[str, float]] = []

    def query(expr: str, t: float) -> list[tuple[dict[str, str], float]]:
        seen.append((expr, t))
        return [({"gpu": "1"}, 2.0), ({"gpu": "0"}, 1.0)]

    data = TemplateData({}, 0.0, {}, "", query, 42.0)
    text = '{{ range query "up" | sortByLabel "gpu" }}{{ .Labels.gpu }}={{ .Value }} {{ end }}'
    assert Template(text).expand(data) == "0=1 1=2 "
    assert seen == [("up", 42.0)]


def test_an_unknown_function_is_refused_when_parsed() -> None:
    with pytest.raises(TemplateError, match='function "nosuch" not defined'):
        Template("{{ nosuch }}")


def test_output_and_work_are_bounded() -> None:
    huge = expand("{{ range 2000000 }}{{ end }}x")
    assert huge.startswith("<error expanding template:") and "steps" in huge
    wide = expand("{{ range 300000 }}abcd{{ end }}")
    assert wide.startswith("<error expanding template:") and str(MAX_OUTPUT) in wide


def test_replacement_references_expand_as_gos_regexp_expand() -> None:
    source = '{{ reReplaceAll "(?P<host>[a-z]+)-(\\\\d+)" "${host}/$2/$$/${a-b}/$9" "node-42" }}'
    assert expand(source) == "node/42/$/${a-b}/"


def test_deep_nesting_is_refused_at_load_not_a_crash() -> None:
    with pytest.raises(TemplateError, match="max expression depth exceeded"):
        Template("{{ " + "(" * 300 + "1" + ")" * 300 + " }}")
    with pytest.raises(TemplateError, match="max expression depth exceeded"):
        Template("{{ if true }}" * 300 + "{{ end }}" * 300)
    assert Template("{{ " + "(" * 50 + "1" + ")" * 50 + " }}").expand(DATA) == "1"
