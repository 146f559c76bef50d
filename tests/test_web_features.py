"""The feature pages (Batches, Tenants, Limiters, Periodic, Limited capacity) in a real
browser, with data made by the features themselves: a batch drained with failures by an
in-process capsule, fair-tenant jobs that make one tenant greedy, limiters called until
they refuse, a periodic tick claimed through its store, capacity copies refilled. Each
page must show what the admin API (the CLI's ``--json``) returns at the same moment,
and user data (a batch description, a tenant id) as text."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

import httpx2 as httpx
import pytest
import redis as redis_py
from selenium.webdriver.remote.webdriver import WebDriver

import limitd
from limitd.api import (
    batch_status,
    capacity,
    limiter_usage,
    limiters,
    list_batches,
    periodic_status,
    reroutes,
    top_tenants,
)
from limitd.batch.admin import state
from limitd.capacity.store import CapacityStore
from limitd.fair_tenant.admin import window_label
from limitd.periodic.admin import local_time
from limitd.periodic.store import PeriodicStore
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.web.views.limiters import usage_text
from tests.web import Dashboard, screenshot, wait_until

SCRIPT = "<script>document.title='owned'</script>"
BATCH_QUEUE, CALLBACKS = "web_features_batch", "web_features_callbacks"
SLOW, SLOWER = "web_features_slow", "web_features_slower"
CAPACITY_QUEUE = "web_features_imports"
BROKEN = {3: "malformed row", 5: "timeout talking to the ledger", 8: "row 8 is locked"}


@limitd.job(name="web_features.ImportInvoice", queue=BATCH_QUEUE, retry_in=lambda *_: 3600)
def import_invoice(n: int) -> None:
    if n in BROKEN:
        raise ValueError(BROKEN[n])


@limitd.job(name="web_features.ChargeCard", queue=BATCH_QUEUE, retry=0)
def charge_card(n: int) -> None:
    raise RuntimeError(f"card {n} declined")


@limitd.job(name="web_features.Notify", queue=CALLBACKS)
def notify(status: dict, options: dict) -> None: ...


@limitd.job(
    name="web_features.SyncAccount",
    queue="web_features_sync",
    fair_tenant_queues=[
        {"queue": SLOW, "threshold": 5, "per": 3600},
        {"queue": SLOWER, "threshold": 8, "per": 60},
    ],
    tenant=lambda account, *_: account,
)
def sync_account(account: str, page: int) -> None: ...


class Backlog(limitd.LimitedCapacityJob, name="web_features.Backlog", queue=CAPACITY_QUEUE):
    rows: ClassVar[list[int]] = []

    def perform_work(self, *args: Any) -> None: ...

    def remaining_work_count(self, *args: Any) -> int:
        return len(self.rows)

    def max_running_jobs(self) -> int:
        return 4


class Resync(Backlog, name="web_features.ResyncAccounts", queue=CAPACITY_QUEUE):
    rows: ClassVar[list[int]] = []

    def max_running_jobs(self) -> int:
        return 8


class Thumbnails(Backlog, name="web_features.Thumbnails", queue=CAPACITY_QUEUE):
    rows: ClassVar[list[int]] = []

    def max_running_jobs(self) -> int:
        return 2


ROWS_JS = """
const out = [];
for (const row of document.querySelectorAll(arguments[0])) {
  const cells = {};
  for (const td of row.cells) for (const name of td.classList) cells[name] = td.innerText.trim();
  out.push([row.getAttribute(arguments[1]), cells]);
}
return out;
"""


def rows(browser: WebDriver, selector: str, key: str) -> dict[str, dict[str, str]]:
    """Each row's cells by class name, keyed by the row's ``key`` attribute, read in
    one script call (a live refresh cannot swap the table halfway through), in the
    page's order (a list: the driver does not keep an object's key order)."""
    return {row_key: cells for row_key, cells in browser.execute_script(ROWS_JS, selector, key)}


def texts(browser: WebDriver, selector: str) -> list[str]:
    return browser.execute_script(  # type: ignore[no-any-return]
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText.trim())",
        selector,
    )


def open_page(browser: WebDriver, dashboard: Dashboard, path: str, ready: str) -> None:
    browser.get(dashboard.url(path))
    wait_until(browser, lambda b: texts(b, ready))


# Batches


def drained_batch(redis: redis_py.Redis) -> limitd.Batch:
    """A batch of 12 jobs drained by a capsule: 3 fail (retries an hour away), one
    dies, so it completes and fires death, and cannot succeed yet."""
    batch = limitd.Batch("import 2026-11 invoices")
    for event in ("complete", "success", "death"):
        batch.on(event, notify, {"month": "2026-11", "event": event})
    with batch.jobs():
        import_invoice.perform_bulk([[n] for n in range(11)])
        charge_card.perform_async(42)
    Capsule(CapsuleConfig(queues=[BATCH_QUEUE]), redis=redis).drain()
    return batch


def test_a_batch_page_shows_its_failures_and_callbacks(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, tmp_path: Path
) -> None:
    batch = drained_batch(redis)
    open_page(browser, dashboard, f"/batches/{batch.bid}", "#failures tr[data-jid]")
    shown = {
        name: texts(browser, f"#{name}")[0]
        for name in ("total", "pending", "failure-count", "children", "state")
    }
    failures = rows(browser, "#failures tr[data-jid]", "data-jid")
    callbacks = rows(browser, "#callbacks tr[data-event]", "data-event")
    status = batch_status(redis, batch.bid)
    assert status is not None
    assert shown == {
        "total": str(status.total),
        "pending": str(status.pending),
        "failure-count": str(len(status.failures)),
        "children": str(status.children),
        "state": state(status),
    }
    assert (status.total, status.pending, len(status.failures)) == (12, 4, 4)
    assert {jid: cells["error"] for jid, cells in failures.items()} == status.failures
    assert "RuntimeError: card 42 declined" in status.failures.values()
    assert {event: cells["fired"].split()[0] for event, cells in callbacks.items()} == {
        "complete": "fired",
        "death": "fired",
        "success": "not",
    }
    assert state(status) == "complete+death"
    screenshot(browser, "batch", tmp_path)


def test_the_batch_list_matches_list_batches_and_shows_a_script_as_text(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, tmp_path: Path
) -> None:
    drained = drained_batch(redis)
    hostile = limitd.Batch(SCRIPT + "<b>bold</b>")
    with hostile.jobs():
        import_invoice.perform_bulk([[20], [21]])
    open_page(browser, dashboard, "/batches", "#batches tr[data-bid]")
    listed = rows(browser, "#batches tr[data-bid]", "data-bid")
    expected = list_batches(redis)
    assert list(listed) == [status.bid for status in expected] == [hostile.bid, drained.bid]
    for status in expected:
        cells = listed[status.bid]
        assert (cells["total"], cells["pending"], cells["failures"], cells["state"]) == (
            str(status.total),
            str(status.pending),
            str(len(status.failures)),
            state(status),
        )
    assert listed[hostile.bid]["description"] == SCRIPT + "<b>bold</b>"
    assert browser.title != "owned"
    assert not texts(browser, "#batches td.description b")
    browser.get(dashboard.url(f"/batches/{hostile.bid}"))
    wait_until(browser, lambda b: SCRIPT in texts(b, "p.description")[0])
    assert browser.title != "owned"


def test_an_unknown_batch_is_a_404_page(dashboard: Dashboard, redis: redis_py.Redis) -> None:
    with httpx.Client() as http:
        answer = http.get(dashboard.url("/batches/0123456789abcdef01234567"))
    assert answer.status_code == 404
    assert "never created, or its data expired" in answer.text


# Tenants


def greedy_traffic() -> None:
    """acme enqueues 12 jobs at once (past both thresholds), initech 7 (past the
    hourly one), globex and umbrella a few, and a tenant whose id is markup 1."""
    for page in range(12):
        sync_account.perform_async("acme", page)
    for tenant, count in (("initech", 7), ("globex", 2), ("umbrella", 4)):
        for page in range(count):
            sync_account.perform_async(tenant, page)
    sync_account.perform_async(SCRIPT, 0)


def test_tenants_page_matches_top_tenants_and_reroutes(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, tmp_path: Path
) -> None:
    greedy_traffic()
    open_page(browser, dashboard, "/tenants", "#tenants tr[data-tenant]")
    shown = rows(browser, "#tenants tr[data-tenant]", "data-tenant")
    counters = list(rows(browser, "#reroutes tr[data-queue]", "data-counter").values())
    statuses = top_tenants(redis)
    counts = reroutes(redis)
    assert list(shown) == [status.tenant for status in statuses]
    assert next(iter(shown)) == "acme"
    for status in statuses:
        cells = shown[status.tenant]
        windows = [f"{w.enqueues}/{window_label(w.per)} → {w.queue}" for w in status.windows]
        for window in windows:
            assert window in cells["windows"]
        route = status.rule_now.queue if status.rule_now else "its own queue"
        assert cells["route"] == route
        rerouted = ", ".join(f"{queue} = {n}" for queue, n in status.rerouted.items()) or "-"
        assert cells["rerouted"] == rerouted
    assert shown["acme"]["route"] == SLOWER  # 12 in the last minute: past 8
    assert shown["globex"]["route"] == "its own queue"
    assert shown["initech"]["route"] == SLOW  # 7 in the last hour: past 5
    assert len(counters) == len(counts) == 3
    assert [(c["tenant"], c["queue"], int(c["count"])) for c in counters] == [
        (tenant, queue, n)
        for (_, tenant, queue, _), n in sorted(counts.items(), key=lambda i: (-i[1], i[0]))
    ]
    # past 5 an hour: the 6th to the 8th go to SLOW, past 8 a minute: the 9th on to SLOWER
    assert counts[("web_features.SyncAccount", "acme", SLOW, 1)] == 3
    assert counts[("web_features.SyncAccount", "acme", SLOWER, 2)] == 4
    assert shown[SCRIPT]["tenant"] == SCRIPT
    assert browser.title != "owned"
    screenshot(browser, "tenants", tmp_path)


# Limiters


@pytest.fixture
def used_limiters(redis: redis_py.Redis) -> Iterator[limitd.Limiter]:
    """A window limiter called past its limit, a bucket and a leaky one used a little,
    and a concurrent one whose slot is held while the test runs (yielded)."""
    api = limitd.Limiter.window("web-features-api", 3, "minute", wait_timeout=0)
    for _ in range(5):
        try:
            with api.within_limit():
                pass
        except limitd.OverLimit:
            pass
    mail = limitd.Limiter.bucket("web-features-mail", 1000, "day", wait_timeout=0)
    for _ in range(7):
        with mail.within_limit():
            pass
    reports = limitd.Limiter.leaky("web-features-reports", 10, "day", wait_timeout=0)
    for _ in range(4):
        with reports.within_limit():
            pass
    stripe = limitd.Limiter.concurrent("web-features-stripe", 5, lock_timeout=60)
    with stripe.within_limit():
        pass
    with stripe.within_limit():
        yield stripe


def test_limiters_page_matches_limiters(
    dashboard: Dashboard,
    browser: WebDriver,
    redis: redis_py.Redis,
    used_limiters: limitd.Limiter,
    tmp_path: Path,
) -> None:
    open_page(browser, dashboard, "/limiters", "#limiters tr[data-limiter]")
    shown = rows(browser, "#limiters tr[data-limiter]", "data-limiter")
    statuses = limiters(redis)
    used = limiter_usage(redis, statuses)
    assert list(shown) == [status.name for status in statuses]
    assert len(shown) == 4
    for status in statuses:
        cells = shown[status.name]
        assert (cells["limit"], cells["calls"], cells["immediate"], cells["waited"]) == (
            f"{status.limit:,}",
            f"{status.calls:,}",
            f"{status.immediate:,}",
            f"{status.waited:,}",
        )
        assert cells["over"] == f"{status.over_limit:,}"
        assert cells["used"] == usage_text(used[status.name])
    assert shown["web-features-api"]["used"] == "3"  # calls in the window
    assert shown["web-features-api"]["over"] == "2"
    assert shown["web-features-mail"]["used"] == "7"
    assert shown["web-features-stripe"]["used"] == "1"  # the slot held now
    assert float(shown["web-features-reports"]["used"]) == pytest.approx(4, abs=0.1)
    screenshot(browser, "limiters", tmp_path)


# Periodic


def test_periodic_page_matches_periodic_status(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, tmp_path: Path
) -> None:
    store = PeriodicStore(redis)
    store.register(
        {
            "nightly-report": {"cron": "0 3 * * *", "tz": "Europe/Berlin", "job": "NightlyReport"},
            "refill-imports": {"cron": "*/5 * * * *", "tz": "UTC", "job": Backlog.spec.name},
            "hourly-digest": {"cron": "15 * * * *", "tz": "America/New_York", "job": "Digest"},
        }
    )
    now = time.time()
    tick = now - now % 300
    assert store.claim("refill-imports", tick, "a41d5c0e9b7f2a8c3d6e1f00", now) is not None
    berlin = dt.datetime.now(ZoneInfo("Europe/Berlin"))
    three = berlin.replace(hour=3, minute=0, second=0, microsecond=0)
    night = (three if three <= berlin else three - dt.timedelta(days=1)).timestamp()
    assert store.claim("nightly-report", night, "0b7a9e4c1d2f3a5b6c7d8e9f", night + 0.2)
    open_page(browser, dashboard, "/periodic", "#periodic tr[data-entry]")
    shown = rows(browser, "#periodic tr[data-entry]", "data-entry")
    statuses = periodic_status(redis)
    assert list(shown) == [status.name for status in statuses]
    assert len(shown) == 3
    for status in statuses:
        cells = shown[status.name]
        assert cells["jid"] == (status.last_jid or "never ran")
        assert cells["last-run"].startswith(local_time(status.last_run_at, status.tz))
        assert cells["next-run"].startswith(local_time(status.next_run, status.tz))
    assert shown["refill-imports"]["jid"] == "a41d5c0e9b7f2a8c3d6e1f00"
    assert shown["hourly-digest"]["jid"] == "never ran"
    screenshot(browser, "periodic", tmp_path)


# Limited capacity


def test_capacity_page_matches_capacity(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, tmp_path: Path
) -> None:
    """Backlog: 2 of 4 running, 2 queued; Resync: 3 of 8 running, 3 rows left; Thumbnails:
    its only copy running, the backlog empty."""
    for job, rows_left, started in ((Backlog, 40, 2), (Resync, 6, 3), (Thumbnails, 1, 1)):
        job.rows = list(range(rows_left))
        jids = job.perform_with_capacity()
        store = CapacityStore(redis, job.spec.name)
        for jid in jids[:started]:
            store.claim(jid, job().max_running_jobs())
    Resync.rows = Resync.rows[:3]
    Thumbnails.rows = []
    open_page(browser, dashboard, "/capacity", "#capacity tr[data-class]")
    shown = rows(browser, "#capacity tr[data-class]", "data-class")
    statuses = capacity(redis)
    assert list(shown) == [status.name for status in statuses]
    for status in statuses:
        cells = shown[status.name]
        assert (cells["running"], cells["queued"], cells["max"], cells["remaining"]) == (
            str(status.running),
            str(status.queued),
            str(status.max_running_jobs),
            str(status.remaining_work_count),
        )
    figures = {s.name: (s.running, s.queued, s.max_running_jobs) for s in statuses}
    assert figures == {
        Backlog.spec.name: (2, 2, 4),
        Resync.spec.name: (3, 3, 8),
        Thumbnails.spec.name: (1, 0, 2),
    }
    screenshot(browser, "capacity", tmp_path)


def test_the_feature_pages_are_read_only_and_live(
    dashboard: Dashboard, redis: redis_py.Redis
) -> None:
    greedy_traffic()
    with httpx.Client() as http:
        for path in ("/batches", "/tenants", "/limiters", "/periodic", "/capacity"):
            page = http.get(dashboard.url(path))
            assert page.status_code == 200, path
            assert "<form" not in page.text, path
            part = http.get(dashboard.url(path), headers={"X-Limitd-Live": "1"}).text
            assert "<html" not in part and "<table" in part, path


def test_the_periodic_page_lists_the_configs_entries(redis: redis_py.Redis, tmp_path: Path) -> None:
    """Given the app's config (``limitd web conf/app.yml``), Periodic lists its entries
    as ``limitd periodic -C`` does, before any scheduler has run."""
    from starlette.testclient import TestClient

    from limitd.config import load_config
    from limitd.web import app

    conf = tmp_path / "app.yml"
    conf.write_text(
        "periodic:\n  - {name: nightly-report, cron: '0 3 * * *', job: web_features.Notify}\n"
    )
    with TestClient(app(redis, config=load_config([str(conf)]))) as client:
        page = client.get("/periodic").text
    assert "nightly-report" in page and "0 3 * * *" in page
