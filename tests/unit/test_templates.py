"""urlQueryEscape is newer than Debian's promtool 2.42, so no conformance file can check it:
it must escape as Go's url.QueryEscape does (space as +, only A-Z a-z 0-9 - _ . ~ kept,
UTF-8 bytes in upper-case hex)."""

from __future__ import annotations

from gpuwatch.rules.templates import Template, TemplateData


def test_url_query_escape_escapes_as_go_does() -> None:
    template = Template("{{ $labels.q | urlQueryEscape }}")
    data = TemplateData({"q": "a b&c=d/é~x_y.z-1"}, 0.0, {})
    assert template.expand(data) == "a+b%26c%3Dd%2F%C3%A9~x_y.z-1"
