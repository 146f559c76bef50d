"""The Queues pages in a real browser, their effect checked in Redis; and the guard
(CSRF, auth) over plain HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import pytest
import redis as redis_py
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

import limitd
import limitd.web
import limitd.web.credentials
import limitd.web.security
from limitd import keys
from limitd.api import Queue
from tests.web import Dashboard, click, screenshot, text_of, wait_until


@limitd.job(name="web_test.Echo", queue="echo")
def echo(*args: object) -> None: ...


ECHO_ROW = 'tr[data-queue="echo"]'


def test_pause_and_resume_a_queue_by_clicking(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, tmp_path: Path
) -> None:
    echo.perform_async(1)
    browser.get(dashboard.url("/queues"))
    click(browser, f"{ECHO_ROW} button.pause")
    wait_until(browser, lambda b: "paused" in text_of(b, ECHO_ROW))
    assert Queue("echo", redis).paused
    click(browser, f"{ECHO_ROW} button.resume")
    wait_until(browser, lambda b: "running" in text_of(b, ECHO_ROW))
    assert not Queue("echo", redis).paused
    screenshot(browser, "queues", tmp_path)


def test_set_and_clear_limits_in_the_form(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    """Typing holds the live refresh (limitd.js), so the form stays put while filled."""
    echo.perform_async(1)
    browser.get(dashboard.url("/queues"))
    limit = browser.find_element(By.CSS_SELECTOR, f"{ECHO_ROW} input[name=limit]")
    limit.click()
    limit.send_keys("3")
    per_process = browser.find_element(By.CSS_SELECTOR, f"{ECHO_ROW} input[name=process_limit]")
    per_process.click()
    per_process.send_keys("1\n")
    wait_until(browser, lambda b: Queue("echo", redis).limit == 3)
    assert Queue("echo", redis).process_limit == 1
    wait_until(browser, lambda b: "3" in text_of(b, f"{ECHO_ROW} td:nth-child(5)"))
    limit = browser.find_element(By.CSS_SELECTOR, f"{ECHO_ROW} input[name=limit]")
    limit.click()
    limit.clear()
    limit.send_keys("\n")
    wait_until(browser, lambda b: Queue("echo", redis).limit is None)
    assert Queue("echo", redis).process_limit == 1


def test_a_script_in_job_arguments_shows_as_text(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    echo.perform_async("<script>document.title='owned'</script>", "<b>bold</b>")
    browser.get(dashboard.url("/queues/echo"))
    cell = browser.find_element(By.CSS_SELECTOR, "#jobs td.args")
    assert "<script>document.title='owned'</script>" in cell.text
    assert browser.title != "owned"
    assert not browser.find_elements(By.CSS_SELECTOR, "#jobs td.args b")


def test_delete_a_queued_job(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis
) -> None:
    keep, gone = echo.perform_async("keep"), echo.perform_async("gone")
    browser.get(dashboard.url("/queues/echo"))
    browser.find_element(By.CSS_SELECTOR, f'tr[data-jid="{gone}"] button.delete').click()
    browser.switch_to.alert.accept()
    wait_until(browser, lambda b: not b.find_elements(By.CSS_SELECTOR, f'tr[data-jid="{gone}"]'))
    left = [entry.jid for entry in Queue("echo", redis)]
    assert left == [keep]


def test_a_post_without_the_csrf_token_is_refused(
    dashboard: Dashboard, redis: redis_py.Redis
) -> None:
    echo.perform_async(1)
    with httpx.Client() as http:
        refused = http.post(dashboard.url("/queues/echo/pause"))
        assert refused.status_code == 403
        page = http.get(dashboard.url("/queues"))
        token = page.cookies[limitd.web.security.CSRF_COOKIE]
        wrong = http.post(dashboard.url("/queues/echo/pause"), data={"csrf": "0" * 64})
        assert wrong.status_code == 403
        assert not Queue("echo", redis).paused
        done = http.post(dashboard.url("/queues/echo/pause"), data={"csrf": token})
        assert done.status_code == 303
    assert Queue("echo", redis).paused


def test_every_page_asks_for_the_password_when_one_is_set(redis: redis_py.Redis) -> None:
    credentials = limitd.web.credentials.Credentials("ops", "s3cret")
    with Dashboard(redis, credentials=credentials) as served, httpx.Client() as http:
        assert http.get(served.url("/queues")).status_code == 401
        assert http.get(served.url("/queues"), auth=("ops", "wrong")).status_code == 401
        assert http.get(served.url("/queues"), auth=("ops", "s3cret")).status_code == 200


def test_a_live_refresh_returns_only_the_live_part(
    dashboard: Dashboard, redis: redis_py.Redis
) -> None:
    echo.perform_async(1)
    with httpx.Client() as http:
        part = http.get(dashboard.url("/queues"), headers={"X-Limitd-Live": "1"}).text
    assert 'data-queue="echo"' in part and "<html" not in part
    assert keys.of(redis).queue("echo") == "queue:echo"


def test_the_dashboard_mounts_in_a_wsgi_server(redis: redis_py.Redis) -> None:
    """The WSGI form, served by the standard library's WSGI server."""
    import threading
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: object) -> None:
            """No access log in the test output."""

    echo.perform_async(1)
    server = make_server("127.0.0.1", 0, limitd.web.wsgi_app(redis), handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        page = httpx.get(f"http://127.0.0.1:{server.server_port}/queues")
    finally:
        server.shutdown()
        server.server_close()
    assert page.status_code == 200 and 'data-queue="echo"' in page.text


def test_an_action_returns_to_the_page_its_form_names(dashboard: Dashboard) -> None:
    """The sets' forms post ``next`` (the page with its filter): the redirect keeps it."""
    with httpx.Client() as http:
        token = http.get(dashboard.url("/queues")).cookies[limitd.web.security.CSRF_COOKIE]
        answer = http.post(
            dashboard.url("/dead/delete"),
            data={"csrf": token, "scope": "all", "next": "/dead?name=Mail&page=2"},
        )
    assert answer.status_code == 303
    assert answer.headers["location"].endswith("/dead?name=Mail&page=2")


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/", "/\\evil"])
def test_an_action_never_redirects_off_site(dashboard: Dashboard, target: str) -> None:
    with httpx.Client() as http:
        token = http.get(dashboard.url("/queues")).cookies[limitd.web.security.CSRF_COOKIE]
        answer = http.post(
            dashboard.url("/dead/delete"), data={"csrf": token, "scope": "all", "next": target}
        )
    assert answer.headers["location"] == "/dead"


def test_a_fair_queues_page_shows_its_tenants_and_deletes_from_a_line(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, tmp_path: Path
) -> None:
    from limitd.api import make_fair
    from limitd.fetch.factory import limit_fetch
    from limitd.queues.order import QueueOrder

    make_fair("echo", tenant_limit=2, redis=redis)
    for tenant, count in (("acme", 6), ("globex", 2)):
        for n in range(count):
            echo.set(fair_tenant=tenant).perform_async(tenant, n)
    limit_fetch(redis, QueueOrder(["echo"]), "sorter").take(1, [])  # sorts into lines
    browser.get(dashboard.url("/queues"))
    wait_until(browser, lambda b: "fair · 2 tenants" in text_of(b, ECHO_ROW))
    browser.get(dashboard.url("/queues/echo"))
    summary = text_of(browser, "#fair")
    assert "7 jobs waiting in the lines of 2 tenants" in summary
    assert "at most 2 running per tenant" in summary
    assert text_of(browser, "#tenants tbody tr:first-child").split() == ["acme", "5", "1"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) == 7
    screenshot(browser, "fair-queue", tmp_path)
    browser.execute_script("window.confirm = () => true;")
    click(browser, "#jobs tbody tr:first-child button.delete")
    wait_until(browser, lambda b: Queue("echo", redis).size() == 6)
