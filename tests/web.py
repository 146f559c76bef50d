"""The dashboard under test: served by uvicorn on a free port against the test Redis,
and a headless Chromium (Debian's chromium and chromedriver) driven by Selenium.

``screenshot(browser, name)`` saves a PNG under the test's tmp directory, and under
``docs/web/`` as well when ``LIMITD_SCREENSHOTS=1`` (how the README's pictures are made,
from the same tests, so they stay true)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py
import uvicorn
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from limitd.web import app

DOCS = Path(__file__).resolve().parent.parent / "docs" / "web"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Dashboard:
    """A dashboard served in a thread; ``url(path)`` builds its addresses."""

    def __init__(self, redis: redis_py.Redis, **options: object) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app(redis, **options), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Dashboard:
        self.thread.start()
        deadline = threading.Event()
        for _ in range(200):
            if self.server.started:
                return self
            deadline.wait(0.025)
        raise RuntimeError("the dashboard did not start in 5 s")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def dashboard(redis: redis_py.Redis) -> Iterator[Dashboard]:
    with Dashboard(redis, refresh_seconds=0.5) as served:
        yield served


@pytest.fixture(scope="session")
def browser() -> Iterator[WebDriver]:
    """One headless Chromium for the session (starting one takes a second)."""
    if not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists():
        reason = "browser tests need chromium and chromium-driver (apt-get install them)"
        if os.environ.get("LIMITD_REQUIRE_BROWSER") == "1":  # CI: never skip silently
            pytest.fail(reason)
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,900")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def replaced_by_refresh(error: WebDriverException) -> bool:
    """Whether ``error`` says a live refresh replaced the element being read or clicked:
    Selenium reports it as a stale reference, and Chromium, when the refresh lands in
    the middle of the call, as an inspector error about a node not in the document."""
    return isinstance(error, StaleElementReferenceException) or (
        "does not belong to the document" in str(error)
    )


def wait_until(browser: WebDriver, condition: object, timeout: float = 10.0) -> object:
    """Poll the page until ``condition(browser)`` is truthy (Selenium's wait)."""
    return WebDriverWait(browser, timeout, poll_frequency=0.05).until(condition)  # type: ignore[arg-type]


def text_of(browser: WebDriver, css: str) -> str:
    """The text of the first element matching ``css``, read in one script call: a live
    refresh may replace the element between a lookup and a read."""
    found = browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
    )
    return str(found)


def click(browser: WebDriver, css: str) -> None:
    """Click the first element matching ``css`` in one script call (see ``text_of``)."""
    browser.execute_script("document.querySelector(arguments[0]).click();", css)


def screenshot(browser: WebDriver, name: str, tmp_path: Path) -> Path:
    shot = tmp_path / f"{name}.png"
    browser.save_screenshot(str(shot))
    if os.environ.get("LIMITD_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, DOCS / f"{name}.png")
    return shot
