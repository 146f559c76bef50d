"""The Dashboard, Busy and /metrics pages: real capsules in this process running gated
jobs (so they stay busy while the pages are read), a day or two of stats, a real
browser; the figures checked against the API, the actions against the capsules. And the
chart builder on its own."""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest
import redis as redis_py
from prometheus_client.parser import text_string_to_metric_families
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

import limitd
from limitd import clock, keys
from limitd.api import Processes, Stats, iteration_progress
from limitd.api.stats import redis_info
from limitd.api.work import running_jobs
from limitd.iteration.job import numbers
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.web.charts import Frame, history_chart, nice_ceiling
from tests.helpers import wait_for
from tests.web import Dashboard, replaced_by_refresh, screenshot, wait_until

gate = threading.Event()
SCRIPT = "<script>document.title='owned'</script>"


@limitd.job(name="web_dashboard_test.Report", queue="reports")
def report(*args: object) -> None:
    gate.wait(30)


@limitd.job(name="web_dashboard_test.Mail", queue="mail")
def mail(*args: object) -> None:
    gate.wait(30)


class Newsletter(limitd.IterableJob, name="web_dashboard_test.Newsletter", queue="mail"):
    """An iterable job that holds its item 1,234 until the gate opens: the Busy page
    shows its progress."""

    def build_items(self, issue: str, *, cursor: int | None) -> Iterator[tuple[int, int]]:
        return iter(numbers(0, 5000, cursor))

    def each_item(self, subscriber: int, issue: str) -> None:
        if subscriber == 1234:
            gate.wait(30)


@pytest.fixture(autouse=True)
def _open_gate_after() -> Iterator[None]:
    gate.clear()
    yield
    gate.set()


class Capsules:
    """In-process capsules of one test, each a process record of its own, all stopped at
    the end (the gate opened first, so their jobs finish)."""

    def __init__(self, redis: redis_py.Redis) -> None:
        self.redis = redis
        self.started: list[Capsule] = []

    def start(self, name: str, queues: tuple[str, ...], threads: int, tag: str = "") -> Capsule:
        config = CapsuleConfig(
            name=name, queues=queues, concurrency=threads, tag=tag, timeout=5, record_period=0.05
        )
        capsule = Capsule(config, redis=self.redis)
        capsule.start()
        self.started.append(capsule)
        return capsule

    def stop_all(self) -> None:
        gate.set()
        for capsule in self.started:
            capsule.stop(timeout=5)


@pytest.fixture
def capsules(redis: redis_py.Redis) -> Iterator[Capsules]:
    running = Capsules(redis)
    yield running
    running.stop_all()


def seed_history(redis: redis_py.Redis) -> None:
    """Totals, yesterday and today per day, and a few busy minutes of the last hour."""
    redis.set(keys.of(redis).STAT_PROCESSED, 48_213)
    redis.set(keys.of(redis).STAT_FAILED, 1_377)
    today = dt.datetime.fromtimestamp(clock.now(), dt.timezone.utc).date()
    for back, done, bad in ((2, 9_400, 310), (1, 12_650, 402), (0, 4_180, 97)):
        day = (today - dt.timedelta(days=back)).isoformat()
        redis.set(keys.daily_stat(keys.of(redis).STAT_PROCESSED, day), done)
        redis.set(keys.daily_stat(keys.of(redis).STAT_FAILED, day), bad)
    now_minute = int(clock.now() // 60)
    for back in range(0, 40, 3):
        redis.set(keys.minute_stat(keys.of(redis).STAT_PROCESSED, now_minute - back), 40 + 7 * back)
        redis.set(keys.minute_stat(keys.of(redis).STAT_FAILED, now_minute - back), back % 4)


def busy_cluster(redis: redis_py.Redis, capsules: Capsules) -> list[Capsule]:
    """Three capsules with gated jobs running, jobs waiting, and a retry and a dead job."""
    started = [
        capsules.start("default", ("reports",), 3, tag="web-1"),
        capsules.start("default", ("reports",), 3, tag="web-2"),
        capsules.start("mail", ("mail",), 2, tag="mailer"),
    ]
    for month in range(1, 8):
        report.perform_async({"month": month, "format": "pdf"}, "finance")
    mail.perform_async(SCRIPT, "ops@example.com")
    newsletter = Newsletter.perform_async("weekly")
    mail.perform_async("digest", "all@example.com")
    report.perform_in(3600, {"month": 12})
    # Due in an hour: the capsules' pollers would move a due retry to its queue.
    retry_at = clock.now() + 3600
    redis.zadd(
        keys.of(redis).RETRY, {b'{"class":"x","args":[],"jid":"r1","queue":"reports"}': retry_at}
    )
    redis.zadd(keys.of(redis).DEAD, {b'{"class":"x","args":[],"jid":"d1","queue":"reports"}': 1.0})
    wait_for(
        lambda: (
            sum(capsule.busy() for capsule in started) == 8
            and Processes(redis).busy == 8
            and len(running_jobs([p.identity for p in Processes(redis)], redis)) == 8
        ),
        message="8 jobs running, in the records",
    )
    wait_for(
        lambda: (
            (found := iteration_progress(str(newsletter), redis)) is not None
            and found.items == 1234
        ),
        message="the newsletter at its item 1,234",
    )
    return started


# The pages refresh their live part every 0.5 s here, replacing the elements: read and
# click through one script call or with a retry, never through an element held across.


def card(browser: WebDriver, stat: str) -> str:
    return str(
        browser.execute_script(
            "return document.querySelector(arguments[0]).textContent.trim();",
            f'[data-stat="{stat}"] .value',
        )
    )


def texts(browser: WebDriver, selector: str) -> list[str]:
    """The visible text of every element matching ``selector``, read at one moment."""
    found = browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);", selector
    )
    return [str(text) for text in found]


def attributes(browser: WebDriver, selector: str, name: str) -> list[str]:
    found = browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]),"
        " e => e.getAttribute(arguments[1]));",
        selector,
        name,
    )
    return [str(value) for value in found]


def click(browser: WebDriver, selector: str) -> None:
    """Click the element, finding it again if a refresh replaced it in between."""

    def clicked(b: WebDriver) -> bool:
        try:
            b.find_element(By.CSS_SELECTOR, selector).click()
        except WebDriverException as error:
            if not replaced_by_refresh(error):
                raise
            return False
        return True

    wait_until(browser, clicked)


# The chart builder


def test_nice_ceiling_rounds_up_to_1_2_5() -> None:
    assert [nice_ceiling(v) for v in (0, 1, 2, 3, 7, 10, 11, 180, 4_180)] == [
        1,
        1,
        2,
        5,
        10,
        10,
        20,
        200,
        5_000,
    ]


def test_chart_bars_scale_to_the_rounded_maximum() -> None:
    frame = Frame()
    svg = str(history_chart([("a", 100, 0), ("b", 50, 25)], title="t", chart_id="c"))
    bars = re.findall(r'<rect class="(\w+)" [^>]*height="([\d.]+)" [^>]*data-value="(\d+)"', svg)
    assert len(bars) == 4
    by_value = {(css, int(value)): float(height) for css, height, value in bars}
    assert by_value[("processed", 100)] == pytest.approx(frame.plot_height, abs=0.1)
    assert by_value[("processed", 50)] == pytest.approx(frame.plot_height / 2, abs=0.1)
    assert by_value[("failed", 25)] == pytest.approx(frame.plot_height / 4, abs=0.1)
    assert by_value[("failed", 0)] == 0.0
    y_labels = re.findall(r'class="y-label"[^>]*>([\d,]+)<', svg)
    assert y_labels == ["0", "50", "100"]


def test_chart_is_accessible_and_escapes_its_text() -> None:
    svg = str(
        history_chart(
            [("<b>mon</b>", 3, 1), ("tue", 0, 0), ("wed", 5, 2)],
            title="Jobs & <failures>",
            chart_id="week",
            label_every=2,
        )
    )
    assert svg.startswith("<svg") and 'role="img"' in svg
    assert 'aria-labelledby="week-title week-desc"' in svg
    assert '<title id="week-title">Jobs &amp; &lt;failures&gt;</title>' in svg
    assert "8 processed and 3 failed from &lt;b&gt;mon&lt;/b&gt; to wed." in svg
    assert "<b>" not in svg
    assert "<title>tue: 0 processed, 0 failed</title>" in svg
    x_labels = re.findall(r'class="x-label"[^>]*>([^<]*)<', svg)
    assert x_labels == ["&lt;b&gt;mon&lt;/b&gt;", "wed"]  # every 2nd, and the last


def test_an_empty_chart_still_draws_its_axes() -> None:
    svg = str(history_chart([], title="nothing yet", chart_id="e"))
    assert "No data." in svg and 'class="y-label"' in svg and "<rect class=" not in svg


# Dashboard


def test_dashboard_cards_match_the_api_and_the_charts_show_the_history(
    dashboard: Dashboard,
    browser: WebDriver,
    redis: redis_py.Redis,
    capsules: Capsules,
    tmp_path: Path,
) -> None:
    seed_history(redis)
    busy_cluster(redis, capsules)
    stats, processes, server = Stats(redis), Processes(redis), redis_info(redis)
    browser.get(dashboard.url("/"))
    assert card(browser, "processed") == "48,213" == f"{stats.processed:,}"
    assert card(browser, "failed") == "1,377" == f"{stats.failed:,}"
    assert card(browser, "busy") == "8 / 8" == f"{processes.busy} / {processes.concurrency}"
    assert card(browser, "enqueued") == "2" == str(stats.enqueued)  # 7 + 3 jobs, 8 running
    assert (card(browser, "retries"), card(browser, "scheduled"), card(browser, "dead")) == (
        "1",
        "1",
        "1",
    )
    assert card(browser, "processes") == "3"
    assert card(browser, "redis-version") == server.version
    assert card(browser, "redis-memory").endswith(("B", "K", "M", "G"))
    assert int(card(browser, "redis-clients")) >= 1
    processed = [int(v) for v in attributes(browser, "#chart-month rect.processed", "data-value")]
    assert len(processed) == 30 and processed[-3:] == [9_400, 12_650, 4_180]
    minutes = [int(v) for v in attributes(browser, "#chart-hour rect.processed", "data-value")]
    assert len(minutes) == 60 and minutes[-1] == 40 and minutes[-4] == 61
    assert "per minute, last hour" in str(
        browser.execute_script("return document.querySelector('#chart-hour > title').textContent;")
    )
    screenshot(browser, "dashboard", tmp_path)


def test_the_dashboard_refreshes_its_cards_and_chart_live(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    browser.get(dashboard.url("/"))
    assert card(browser, "processed") == "0"
    today = dt.datetime.fromtimestamp(clock.now(), dt.timezone.utc).date().isoformat()
    redis.set(keys.of(redis).STAT_PROCESSED, 1_234)
    redis.set(keys.daily_stat(keys.of(redis).STAT_PROCESSED, today), 77)
    wait_until(browser, lambda b: card(b, "processed") == "1,234")
    wait_until(
        browser,
        lambda b: attributes(b, "#chart-month rect.processed", "data-value")[-1] == "77",
    )


def test_dashboard_live_part_and_home_route(dashboard: Dashboard, redis: redis_py.Redis) -> None:
    with httpx.Client() as http:
        page = http.get(dashboard.url("/"))
        part = http.get(dashboard.url("/"), headers={"X-Limitd-Live": "1"}).text
    assert page.status_code == 200 and "<html" in page.text
    assert 'data-stat="processed"' in part and "<svg" in part and "<html" not in part


# Busy


def test_busy_lists_processes_and_running_jobs_and_quiets_one_by_clicking(
    dashboard: Dashboard,
    browser: WebDriver,
    redis: redis_py.Redis,
    capsules: Capsules,
    tmp_path: Path,
) -> None:
    web1, web2, mailer = busy_cluster(redis, capsules)
    browser.get(dashboard.url("/busy"))
    identities = attributes(browser, "#processes tbody tr[data-identity]", "data-identity")
    assert set(identities) == {web1.identity, web2.identity, mailer.identity}
    row = f'tr[data-identity="{mailer.identity}"]'
    [mail_row] = texts(browser, row)
    assert "mailer" in mail_row and "2 / 2" in mail_row and "running" in mail_row
    jobs = texts(browser, "#jobs tbody tr[data-jid]")
    assert len(jobs) == 8
    shown = " ".join(jobs)
    assert "web_dashboard_test.Report" in shown and "web_dashboard_test.Mail" in shown
    assert "1,234 items · cursor 1233" in shown  # the newsletter's progress
    assert '"format": "pdf"' in shown
    assert SCRIPT in shown  # shown as text, not run
    assert browser.title != "owned"
    screenshot(browser, "busy", tmp_path)
    browser.execute_script("document.querySelector('#jobs').scrollIntoView();")
    screenshot(browser, "busy-progress", tmp_path)  # the iterable job's progress

    click(browser, f"{row} button.quiet")
    wait_for(lambda: mailer.record.quiet, message="the mail capsule quiet")
    wait_until(browser, lambda b: "quiet" in texts(b, f"{row} td")[8])
    assert not browser.find_elements(By.CSS_SELECTOR, f"{row} button.quiet")
    assert not web1.record.quiet and not web2.record.quiet
    assert [p.quiet for p in Processes(redis) if p.identity == mailer.identity] == [True]


def test_stop_a_process_by_clicking(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, capsules: Capsules
) -> None:
    keep = capsules.start("default", ("reports",), 2, tag="keep")
    gone = capsules.start("default", ("reports",), 2, tag="gone")
    wait_for(lambda: len(Processes(redis)) == 2, message="two process records")
    browser.get(dashboard.url("/busy"))
    click(browser, f'tr[data-identity="{gone.identity}"] button.stop')
    browser.switch_to.alert.accept()
    wait_for(lambda: gone.processor_count() == 0, message="the stopped capsule's threads gone")
    wait_for(
        lambda: [p.identity for p in Processes(redis)] == [keep.identity],
        message="its record cleared",
    )
    wait_until(browser, lambda b: not texts(b, f'tr[data-identity="{gone.identity}"]'))
    assert keep.processor_count() == 2
    assert gone.stopped.wait(10), "the stop asked from afar ran to its end"


def test_busy_actions_need_the_csrf_token_and_an_identity(
    dashboard: Dashboard, redis: redis_py.Redis, capsules: Capsules
) -> None:
    capsule = capsules.start("default", ("reports",), 1)
    wait_for(lambda: len(Processes(redis)) == 1, message="the process record")
    with httpx.Client() as http:
        refused = http.post(dashboard.url("/busy/quiet"), data={"identity": capsule.identity})
        assert refused.status_code == 403
        token = http.get(dashboard.url("/busy")).cookies["limitd_csrf"]
        missing = http.post(dashboard.url("/busy/quiet"), data={"csrf": token})
        assert missing.status_code == 400 and "identity" in missing.text
        unknown = http.post(
            dashboard.url("/busy/quiet"), data={"csrf": token, "identity": "nobody:1:x"}
        )
        assert unknown.status_code == 303
    assert not capsule.record.quiet


# /metrics


def test_metrics_serves_the_exporters_text_with_the_queue_sizes(
    dashboard: Dashboard, redis: redis_py.Redis, capsules: Capsules
) -> None:
    busy_cluster(redis, capsules)
    with httpx.Client() as http:
        reply = http.get(dashboard.url("/metrics"))
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=")
    families = {family.name: family for family in text_string_to_metric_families(reply.text)}
    sizes = {s.labels["queue"]: s.value for s in families["limitd_queue_size"].samples}
    assert sizes == {"reports": 1.0, "mail": 1.0}  # 7 and 3 jobs, 6 and 2 threads busy
    busy = {s.labels["queue"]: s.value for s in families["limitd_queue_busy"].samples}
    assert busy == {"reports": 6.0, "mail": 2.0}
    assert families["limitd_dead_set_size"].samples[0].value == 1.0
    threads = {s.labels["capsule"]: s.value for s in families["limitd_busy_threads"].samples}
    assert threads == {"default": 6.0, "mail": 2.0}
