"""The Retries, Scheduled and Dead pages in a real browser, their effect checked through
the admin API: retry, delete and kill one, several or all (filtered or not), the filter,
paging, an entry's detail, and user data shown as text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import httpx2 as httpx
import redis as redis_py
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

import limitd
import limitd.web.security
from limitd import clock, keys
from limitd.api import DeadSet, Queue, RetrySet, ScheduledSet
from limitd.job import JobFunction
from limitd.payload import dumps
from limitd.retry import RetryHandler
from tests.web import Dashboard, replaced_by_refresh, screenshot
from tests.web import wait_until as wait_for_page


@limitd.job(name="billing.ChargeCard", queue="billing")
def charge_card(*args: object) -> None: ...


@limitd.job(name="mailer.SendReceipt", queue="mail")
def send_receipt(*args: object) -> None: ...


@limitd.job(name="sync.PushToCrm", queue="default")
def push_to_crm(*args: object) -> None: ...


class CardDeclined(Exception):
    __module__ = "billing.errors"  # as a payment library's error reads


@contextmanager
def clock_at(epoch: float) -> Iterator[None]:
    """Timestamps written meanwhile read ``epoch`` (the server thread is not rendering)."""
    with mock.patch.object(clock, "now", lambda: epoch):
        yield


def fail(
    redis: redis_py.Redis,
    job: JobFunction,
    error: Exception,
    *args: object,
    ago: float = 0.0,
    dead: bool = False,
    previous: int | None = None,
) -> str:
    """Push ``job`` and fail it through the real retry handler ``ago`` seconds ago,
    after ``previous`` failures (if any): into the retry set, or the dead set when
    ``dead`` (its retries exhausted)."""
    with clock_at(clock.now() - ago):
        jid = str(job.perform_async(*args))
        payload = json.loads(redis.rpop(keys.of(redis).queue(job.spec.queue)))  # type: ignore[arg-type]
        if previous is not None:
            payload.update(retry_count=previous, failed_at=clock.now() - 3600.0 * previous)
        if dead:
            payload["retry"] = 0 if previous is None else previous + 1
        RetryHandler(redis).job_failed(job.spec, payload, job.spec.queue, error)
    return jid


def realistic_failures(redis: redis_py.Redis, *, dead: bool) -> list[str]:
    """Five failures of three job classes: died 40 s to 6 h ago after 25 tries (dead),
    or failed now after 1 to 7 tries, next retry in 30 s to an hour (retries)."""
    failures = [
        (charge_card, CardDeclined("card_declined: insufficient funds"), ["cus_9Qx", 4999], 40, 1),
        (send_receipt, TimeoutError("SMTP server did not answer in 30 s"),
         [{"order": 1042, "to": "ann@example.com"}], 400, 3),
        (push_to_crm, ConnectionRefusedError("[Errno 111] Connection refused"),
         ["contact", 88123], 3_000, 5),
        (charge_card, KeyError("customer_id"), ["cus_2Lm", 1250], 7_000, 2),
        (send_receipt, ValueError("invalid address: 'bob@'"), [{"order": 1043, "to": "bob@"}],
         20_000, 7),
    ]  # fmt: skip
    return [
        fail(redis, job, error, *args, ago=ago if dead else 0.0, dead=dead,
             previous=24 if dead else tries)
        for job, error, args, ago, tries in failures
    ]  # fmt: skip


def wait_until(browser: WebDriver, condition: Callable[[WebDriver], Any]) -> Any:
    """Poll until ``condition`` holds; a read that a live refresh (every 0.5 s here)
    made stale counts as "not yet"."""

    def settled(driver: WebDriver) -> Any:
        try:
            return condition(driver)
        except WebDriverException as error:
            if not replaced_by_refresh(error):
                raise
            return False

    return wait_for_page(browser, settled)


def text_of(browser: WebDriver, css: str) -> str:
    return str(wait_until(browser, lambda b: b.find_element(By.CSS_SELECTOR, css).text))


def row(browser: WebDriver, jid: str) -> WebElement:
    return browser.find_element(By.CSS_SELECTOR, f'tr[data-jid="{jid}"]')


def jids_shown(browser: WebDriver) -> list[str]:
    rows = browser.find_elements(By.CSS_SELECTOR, "#entries tbody tr[data-jid]")
    return [str(element.get_attribute("data-jid")) for element in rows]


def act(browser: WebDriver, find: Callable[[WebDriver], WebElement]) -> None:
    """Click what ``find`` finds, again if a live refresh replaced it meanwhile."""

    def clicked(driver: WebDriver) -> bool:
        find(driver).click()
        return True

    wait_until(browser, clicked)


def submit_selected(browser: WebDriver, jids: list[str] | None, css: str) -> None:
    """Tick the rows of ``jids`` (None: every row, with the select-all box), then click
    ``css`` once a poll finds them all still ticked: a live refresh already under way
    when a box was ticked may redraw the rows unticked."""

    def boxes(driver: WebDriver) -> list[WebElement]:
        if jids is None:
            return driver.find_elements(By.CSS_SELECTOR, '#entries input[name="entry"]')
        return [row(driver, jid).find_element(By.NAME, "entry") for jid in jids]

    def ready(driver: WebDriver) -> bool:
        unticked = [box for box in boxes(driver) if not box.is_selected()]
        if not unticked:
            driver.find_element(By.CSS_SELECTOR, css).click()
            return True
        every = driver.find_element(By.CSS_SELECTOR, 'input[data-select-all="entry"]')
        if jids is None and not every.is_selected():
            every.click()
        else:
            for box in unticked:
                box.click()
        return False

    wait_until(browser, ready)


def button(css: str) -> Callable[[WebDriver], WebElement]:
    return lambda b: b.find_element(By.CSS_SELECTOR, css)


def test_retry_a_dead_job_from_the_list_and_it_lands_in_its_queue(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, tmp_path: Path
) -> None:
    jids = realistic_failures(redis, dead=True)
    browser.get(dashboard.url("/dead"))
    wait_until(browser, lambda b: jids_shown(b) == jids)  # newest first
    error = f'tr[data-jid="{jids[0]}"] td.error'
    assert text_of(browser, error).endswith("CardDeclined: card_declined: insufficient funds")
    screenshot(browser, "dead", tmp_path)
    submit_selected(browser, [jids[1]], "button.retry-selected")
    wait_until(browser, lambda b: DeadSet(redis).size() == 4)
    (queued,) = Queue("mail", redis)
    assert (queued.jid, queued.error_class, queued.retry_count) == (jids[1], "TimeoutError", 25)
    wait_until(browser, lambda b: jids_shown(b) == [jids[0], *jids[2:]])


def test_delete_and_kill_a_retry(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, tmp_path: Path
) -> None:
    jids = realistic_failures(redis, dead=False)
    browser.get(dashboard.url("/retries"))
    wait_until(browser, lambda b: set(jids_shown(b)) == set(jids))
    screenshot(browser, "retries", tmp_path)
    submit_selected(browser, [jids[2]], "button.delete-selected")
    wait_until(browser, lambda b: RetrySet(redis).size() == 4)
    assert RetrySet(redis).find_job(jids[2]) is None
    assert DeadSet(redis).size() == 0
    submit_selected(browser, [jids[3]], "button.kill-selected")
    wait_until(browser, lambda b: DeadSet(redis).size() == 1)
    assert DeadSet(redis).find_job(jids[3]) is not None
    assert RetrySet(redis).find_job(jids[3]) is None
    wait_until(browser, lambda b: set(jids_shown(b)) == {jids[0], jids[1], jids[4]})


def test_act_on_several_selected_and_on_all(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    jids = realistic_failures(redis, dead=True)
    browser.get(dashboard.url("/dead"))
    wait_until(browser, lambda b: len(jids_shown(b)) == 5)
    submit_selected(browser, [jids[0], jids[3]], "button.retry-selected")
    wait_until(browser, lambda b: Queue("billing", redis).size() == 2)
    assert DeadSet(redis).size() == 3
    wait_until(browser, lambda b: len(jids_shown(b)) == 3)
    submit_selected(browser, None, "button.delete-selected")
    wait_until(browser, lambda b: DeadSet(redis).size() == 0)
    assert Queue("billing", redis).size() == 2  # deleted, not retried

    realistic_failures(redis, dead=False)
    browser.get(dashboard.url("/retries"))
    act(browser, button("button.kill-all"))
    browser.switch_to.alert.accept()
    wait_until(browser, lambda b: DeadSet(redis).size() == 5)
    assert RetrySet(redis).size() == 0
    browser.get(dashboard.url("/dead"))
    assert text_of(browser, "button.retry-all") == "Retry all 5"
    act(browser, button("button.retry-all"))
    browser.switch_to.alert.accept()
    wait_until(browser, lambda b: DeadSet(redis).size() == 0)
    sizes = [Queue(name, redis).size() for name in ("billing", "mail", "default")]
    assert sizes == [4, 2, 1]


def test_the_filter_narrows_the_list_and_all_acts_on_the_matches_only(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    jids = realistic_failures(redis, dead=True)
    browser.get(dashboard.url("/dead"))
    name_field = '.set-filter input[name="name"]'
    wait_until(
        browser, lambda b: not b.find_element(By.CSS_SELECTOR, name_field).send_keys("Charge")
    )
    act(browser, button("button.apply-filter"))
    wait_until(browser, lambda b: jids_shown(b) == [jids[0], jids[3]])
    assert "2 matching" in text_of(browser, "p.summary")
    browser.get(dashboard.url("/dead?text=ann%40example.com"))
    wait_until(browser, lambda b: jids_shown(b) == [jids[1]])
    browser.get(dashboard.url("/dead?name=Send"))
    wait_until(browser, lambda b: jids_shown(b) == [jids[1], jids[4]])
    assert text_of(browser, "button.delete-all") == "Delete all 2 matching"
    act(browser, button("button.delete-all"))
    browser.switch_to.alert.accept()
    wait_until(browser, lambda b: DeadSet(redis).size() == 3)
    assert {entry.jid for entry in DeadSet(redis)} == {jids[0], jids[2], jids[3]}


def test_paging_links_walk_the_set(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    now = clock.now()
    members = {
        dumps({"class": "sync.PushToCrm", "args": [i], "jid": f"{i:024x}", "queue": "default"}): (
            now - i
        )
        for i in range(60)
    }
    redis.zadd(keys.of(redis).DEAD, members)
    browser.get(dashboard.url("/dead"))
    wait_until(browser, lambda b: jids_shown(b) == [f"{i:024x}" for i in range(25)])
    assert "page 1 of 3" in text_of(browser, "p.pager")
    act(browser, button("a.page-older"))
    wait_until(browser, lambda b: jids_shown(b)[:1] == [f"{25:024x}"])
    act(browser, button("a.page-older"))
    wait_until(browser, lambda b: jids_shown(b) == [f"{i:024x}" for i in range(50, 60)])
    assert not browser.find_elements(By.CSS_SELECTOR, "a.page-older")
    act(browser, button("a.page-newer"))
    wait_until(browser, lambda b: jids_shown(b)[:1] == [f"{25:024x}"])
    browser.get(dashboard.url("/dead?name=Crm&page=3"))
    wait_until(browser, lambda b: len(jids_shown(b)) == 10)
    href = wait_until(
        browser, lambda b: b.find_element(By.CSS_SELECTOR, "a.page-newer").get_attribute("href")
    )
    assert "name=Crm" in str(href) and "page=2" in str(href)


def test_scheduled_lists_soonest_first_and_can_kill(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    later = str(send_receipt.perform_in(3600, {"order": 7}))
    sooner = str(charge_card.perform_in(60, "cus_1", 100))
    browser.get(dashboard.url("/scheduled"))
    wait_until(browser, lambda b: jids_shown(b) == [sooner, later])
    assert re.search(r"\bin (59|60) s\b", text_of(browser, f'tr[data-jid="{sooner}"] td.when'))
    submit_selected(browser, [later], "button.kill-selected")
    wait_until(browser, lambda b: DeadSet(redis).find_job(later) is not None)
    assert [entry.jid for entry in ScheduledSet(redis)] == [sooner]


def test_the_detail_view_shows_the_payload_and_a_kept_backtrace(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    jid = "feedfacefeedfacefeedface"
    payload = {
        "class": "billing.ChargeCard",
        "args": ["cus_9Qx", 4999],
        "jid": jid,
        "queue": "billing",
        "retry_count": 3,
        "error_class": "CardDeclined",
        "error_message": "card_declined",
        "error_backtrace": ["app/billing.py:42:in `charge'", "app/jobs.py:7:in `perform'"],
    }
    redis.zadd(keys.of(redis).RETRY, {dumps(payload): clock.now() + 120})
    browser.get(dashboard.url("/retries"))
    act(browser, lambda b: row(b, jid).find_element(By.CSS_SELECTOR, "a"))
    wait_until(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "pre.payload"))
    assert '"cus_9Qx"' in text_of(browser, "pre.payload")
    assert "app/billing.py:42" in text_of(browser, "pre.backtrace")
    act(browser, button("form button.retry"))
    wait_until(browser, lambda b: Queue("billing", redis).size() == 1)
    assert RetrySet(redis).size() == 0
    browser.get(dashboard.url(f"/retries/{jid}"))
    assert "retried, deleted or moved since" in text_of(browser, "#live")


def test_a_script_in_job_arguments_shows_as_text_on_every_set_page(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    evil = "<script>document.title='owned'</script>"
    retried = fail(redis, push_to_crm, ValueError("<b>bold</b>"), evil)
    dead = fail(redis, push_to_crm, ValueError("<b>bold</b>"), evil, dead=True)
    scheduled = str(push_to_crm.perform_in(60, evil))
    for path, jid in (("/retries", retried), ("/dead", dead), ("/scheduled", scheduled)):
        browser.get(dashboard.url(path))
        assert evil in text_of(browser, f'tr[data-jid="{jid}"] td.args')
        assert not browser.find_elements(By.CSS_SELECTOR, "#entries b, #entries td script")
        act(browser, lambda b, jid=jid: row(b, jid).find_element(By.CSS_SELECTOR, "a"))
        wait_until(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "pre.payload"))
        assert evil in text_of(browser, "pre.payload")
        assert browser.title != "owned"


def test_an_entry_that_moved_since_the_page_was_read_is_left_alone(
    dashboard: Dashboard, redis: redis_py.Redis
) -> None:
    jid = fail(redis, push_to_crm, ValueError("boom"), 1)
    (entry,) = RetrySet(redis)
    stale_token = f"{entry.score - 1!r} {jid}"  # the same jid at another time
    with httpx.Client() as http:
        http.get(dashboard.url("/retries"))
        token = http.cookies[limitd.web.security.CSRF_COOKIE]
        sent = http.post(
            dashboard.url("/retries/delete"), data={"csrf": token, "entry": stale_token}
        )
        assert sent.status_code == 303
        assert RetrySet(redis).size() == 1
        nothing = http.post(dashboard.url("/retries/delete"), data={"csrf": token})
        assert nothing.status_code == 400
        bad = http.post(dashboard.url("/retries/delete"), data={"csrf": token, "entry": "x y"})
        assert bad.status_code == 400
        no_kill = http.post(dashboard.url("/dead/kill"), data={"csrf": token, "entry": "1 x"})
        assert no_kill.status_code in (404, 405)


def test_a_malformed_entry_is_listed_and_can_be_deleted(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    redis.zadd(keys.of(redis).DEAD, {b"{not json <i>x</i>": clock.now()})
    browser.get(dashboard.url("/dead"))
    wait_until(browser, lambda b: "malformed" in b.find_element(By.ID, "entries").text)
    assert "<i>x</i>" in text_of(browser, "#entries td.args")
    submit_selected(browser, None, "button.delete-selected")
    wait_until(browser, lambda b: DeadSet(redis).size() == 0)
