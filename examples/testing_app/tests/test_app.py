"""The example app's own tests: limitd's fixtures (``limitd_fake``, ``limitd_inline``,
from the pytest plugin limitd installs) stand in for Redis and the workers."""

from __future__ import annotations

import pytest
from app import app, schedule_followup, send_welcome, sent
from starlette.testclient import TestClient

from limitd.testing import FakeJobs, InlineJobs


@pytest.fixture(autouse=True)
def _outbox() -> None:
    sent.clear()


def test_signup_enqueues_the_welcome_mail(limitd_fake: FakeJobs) -> None:
    with TestClient(app) as http:
        response = http.post("/signup", json={"email": "a@example.com"})
    assert response.status_code == 202
    [job] = limitd_fake.jobs_for(send_welcome)
    assert job["args"] == ["a@example.com"]
    assert job["queue"] == "mail"
    assert response.json() == {"queued": job["jid"]}
    assert sent == []  # nothing ran yet


def test_the_welcome_mail_schedules_a_followup(limitd_fake: FakeJobs) -> None:
    with TestClient(app) as http:
        http.post("/signup", json={"email": "a@example.com"})
    limitd_fake.run_one(send_welcome)
    [followup] = limitd_fake.jobs_for(schedule_followup)
    assert followup["at"] - followup["created_at"] == pytest.approx(86_400, abs=1)
    limitd_fake.drain()
    assert sent == ["a@example.com", "followup:a@example.com"]


def test_one_report_at_a_time_per_account(limitd_fake: FakeJobs) -> None:
    with TestClient(app) as http:
        first = http.post("/accounts/7/report").json()
        second = http.post("/accounts/7/report").json()
    assert (first, second) == ({"queued": True}, {"queued": False})
    limitd_fake.drain()
    assert sent == ["report:7"]


def test_inline_runs_everything_during_the_request(limitd_inline: InlineJobs) -> None:
    with TestClient(app) as http:
        http.post("/signup", json={"email": "b@example.com"})
    assert sent == ["b@example.com", "followup:b@example.com"]
    assert [p["class"] for p in limitd_inline.performed] == [
        send_welcome.spec.name,
        schedule_followup.spec.name,
    ]
