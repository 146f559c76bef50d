"""Payload format: jids, timestamps in both units, parsing, and the strict-args check."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from limitd.payload import (
    MalformedPayload,
    UnsafeArgument,
    check_args,
    dead_entry_for_malformed,
    find_unsafe,
    new_jid,
    parse,
    to_seconds,
)


def test_jid_is_24_hex_chars_and_unique() -> None:
    jids = {new_jid() for _ in range(1000)}
    assert len(jids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{24}", jid) for jid in jids)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1795305340.25, 1795305340.25),  # float seconds (Sidekiq <= 7, limitd)
        (1795305340, 1795305340.0),  # integer seconds
        (1795305340250, 1795305340.25),  # integer milliseconds (Sidekiq 8)
        (None, None),
        ("soon", None),
        (True, None),
    ],
)
def test_timestamps_read_in_seconds_or_milliseconds(value: object, expected: object) -> None:
    assert to_seconds(value) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON list, not an object"),
        (b'{"args": []}', "no 'class'"),
        (b'{"class": "", "args": []}', "no 'class'"),
        (b'{"class": "X", "args": {}}', "no 'args' list"),
    ],
)
def test_parse_says_why_a_payload_cannot_run(raw: bytes, reason: str) -> None:
    with pytest.raises(MalformedPayload, match=reason):
        parse(raw)


def test_parse_keeps_unknown_fields() -> None:
    data = parse(b'{"class":"X","args":[1],"bid":"b1","custom":{"a":1}}')
    assert data["bid"] == "b1"
    assert data["custom"] == {"a": 1}


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ([1, "a", None, True, 2.5, [1, {"k": "v"}]], None),
        ([(1, 2)], "args[0]"),
        ([1, {"when": dt.datetime(2026, 1, 1)}], "args[1]['when']"),
        ([{"a": [1, {2, 3}]}], "args[0]['a'][1]"),
        ([{1: "x"}], "args[0] key 1"),
        ([float("nan")], "args[0]"),
        ([object()], "args[0]"),
    ],
)
def test_find_unsafe_names_the_path(args: list[object], path: str | None) -> None:
    found = find_unsafe(args)
    assert (found[0] if found else None) == path


def test_check_args_modes() -> None:
    bad = [1, {"at": dt.date(2026, 1, 1)}]
    with pytest.raises(UnsafeArgument, match=r"args\[1\]\['at'\] is datetime.date"):
        check_args("Report", bad, "raise")
    with pytest.warns(UserWarning, match="Report"):
        check_args("Report", bad, "warn")
    check_args("Report", bad, "off")


def test_dead_entry_keeps_the_raw_text_and_the_reason() -> None:
    entry = json.loads(dead_entry_for_malformed(b"\xffoops", "mail", "bad bytes", 10.0))
    assert entry["raw"] == "\\xffoops"
    assert entry["error_message"] == "bad bytes"
    assert entry["queue"] == "mail"
    kept = json.loads(dead_entry_for_malformed(b'{"args":[1],"jid":"j"}', "q", "no class", 1))
    assert kept["jid"] == "j"
    assert kept["args"] == [1]
    assert kept["error_message"] == "no class"
