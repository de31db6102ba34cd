"""The fault-injection suite: hostile or clumsy input, files and receivers, one test each, run
against the real daemon or the component that meets them.

    test_rendering.py         a label int() refuses (xid="²", gpu="²"); a group no format renders
    test_full_disk.py         a full state disk, then freed: outbox and journal
    test_damaged_state.py     corrupt journal.db / notify.db / state JSON; state dir deleted
    test_chat_escaping.py     <!channel>, <@U123>, <url|text> and @-mentions in chat formats
    test_terminal_escapes.py  ESC sequences and newlines from a process or label, CLI and dashboard
    test_bad_requests.py      400-digit ranges, nested JSON, 73-byte passwords, a password flood
    test_textfiles.py         FIFOs, /dev/zero, links out, 10,000 files and jobs
    test_regex.py             catastrophic patterns in silences and rules; RE2 syntax
    test_connections.py       1,100 idle connections, slow requests, 200 SSE readers; unit limits

Elsewhere, for the component they test: Retry-After and receiver answers
(tests/unit/test_notify_parts.py), silences for ever (tests/unit/test_notify_dispatch.py),
private state files and a second daemon (tests/integration/test_state_dir.py), a 100k-series
push (tests/integration/test_push.py), a burst of connects (tests/unit/test_connlimit.py),
guesses from many addresses (tests/unit/test_webconfig.py), label sets of series gone
(tests/unit/test_promql_memo.py). bench/flood.py measures the floods.
"""
