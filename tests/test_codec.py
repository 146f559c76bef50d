"""limitd.codec: payload JSON through orjson when installed and through the standard
library otherwise, with the same results either way (what each refuses, big integers,
text). Each test runs both ways."""

from __future__ import annotations

import datetime
import enum
import json
import uuid
from collections.abc import Iterator

import pytest

from limitd import codec
from limitd.payload import MalformedPayload, dumps, parse

pytest.importorskip("orjson")  # in the dev extra: both paths are tested in CI


class Colour(enum.Enum):
    RED = "red"


class Size(enum.IntEnum):
    BIG = 3


@pytest.fixture(params=["orjson", "stdlib"], autouse=True)
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "stdlib":
        monkeypatch.setattr(codec, "orjson", None)
    yield request.param


def test_a_payload_round_trips_compact_and_in_order() -> None:
    payload = {"class": "A", "args": [1, "é", None, True, 2.5, {"k": [1]}], "jid": "x"}
    text = dumps(payload)
    assert text.startswith('{"class":"A","args":[1,')
    assert " " not in text.replace("é", "")
    assert json.loads(text) == payload
    assert parse(text) == payload == parse(text.encode())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_floats_that_are_not_finite_are_refused_anywhere(bad: float) -> None:
    for payload in ({"args": [bad]}, {"args": [], "x": {"y": [bad]}}, {"at": bad}):
        with pytest.raises(ValueError, match="Out of range float"):
            dumps(payload)


@pytest.mark.parametrize(
    "value",
    [datetime.datetime(2026, 1, 1), uuid.UUID(int=1), Colour.RED, {1, 2}, b"raw"],
)
def test_types_json_refuses_are_refused(value: object) -> None:
    with pytest.raises(TypeError):
        dumps({"args": [value]})


def test_subclasses_and_int_keys_are_written_as_json_writes_them() -> None:
    assert dumps({"args": [Size.BIG], "m": {1: "a"}}) == '{"args":[3],"m":{"1":"a"}}'
    assert dumps({"args": [(1, 2)]}) == '{"args":[[1,2]]}'


def test_integers_beyond_64_bits_stay_exact() -> None:
    big = 2**70 + 1
    payload = parse(dumps({"class": "A", "args": [big, -big]}))
    assert payload["args"] == [big, -big]
    assert all(type(n) is int for n in payload["args"])


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b'{"class":"A","args":[NaN]}', "not valid JSON"),
        (b'{"class":"A","args":[Infinity]}', "not valid JSON"),
        (b'{"class":"A","args":[1,]}', "not valid JSON"),
        (b'{"class":"A","args":["\xff"]}', "not valid JSON"),  # not UTF-8
        (b"[1]", "JSON list, not an object"),
        (b"[" * 100_000, "cannot be decoded|not valid JSON"),
    ],
)
def test_what_cannot_be_read_is_malformed_and_says_why(raw: bytes, problem: str) -> None:
    with pytest.raises(MalformedPayload, match=problem):
        parse(raw)


def test_what_json_reads_and_orjson_refuses_is_still_read() -> None:
    payload = parse(b'{"class":"A","args":["\\ud800", 1e400]}')
    assert payload["args"][0] == "\ud800"
    assert payload["args"][1] == float("inf")
