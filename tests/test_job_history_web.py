"""The dashboard's Metrics pages in a browser, on an hour of seeded job history (the
screenshots ``job-metrics`` and ``job-metrics-class`` of the docs come from here)."""

from __future__ import annotations

import random
from pathlib import Path

import redis as redis_py
from selenium.webdriver.remote.webdriver import WebDriver

from limitd import clock
from limitd.api import job_history
from limitd.job_history.store import Counts, Minutes, bucket_of, flush
from tests.web import Dashboard, screenshot, wait_until

CLASSES = {  # class: (jobs per minute, typical milliseconds, failure rate)
    "billing.SendInvoice": (120, 180.0, 0.02),
    "media.ResizeImage": (60, 900.0, 0.0),
    "sync.ImportLedger": (8, 12_000.0, 0.2),
}


def seed_hour(redis: redis_py.Redis) -> None:
    """Most of an hour of history, durations spread log-normally around each class's
    own. The oldest minute seeded is two minutes inside the pages' hour, so a minute
    that turns between the test's read and the page's does not drop any of it."""
    rng = random.Random(30)
    now_minute = int(clock.now() // 60)
    tally: Minutes = {}
    for back in range(58):
        for name, (rate, typical, failing) in CLASSES.items():
            counts = tally[now_minute - back, name] = Counts()
            for _ in range(rng.randrange(rate // 2, rate + 1)):
                ms = typical * rng.lognormvariate(0, 0.6)
                counts.processed += 1
                counts.failed += rng.random() < failing
                counts.milliseconds += round(ms)
                counts.buckets[bucket_of(ms)] = counts.buckets.get(bucket_of(ms), 0) + 1
    flush(redis, tally)


def shown(browser: WebDriver, selector: str) -> list[str]:
    return browser.execute_script(  # type: ignore[no-any-return]
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText.trim())",
        selector,
    )


def values(browser: WebDriver, selector: str) -> list[int]:
    """The ``data-value`` of every element ``selector`` matches, read in one call."""
    return browser.execute_script(  # type: ignore[no-any-return]
        "return Array.from(document.querySelectorAll(arguments[0]),"
        " e => Number(e.getAttribute('data-value')))",
        selector,
    )


def test_the_metrics_pages_show_each_class_its_chart_and_heat_map(
    dashboard: Dashboard, browser: WebDriver, redis: redis_py.Redis, tmp_path: Path
) -> None:
    seed_hour(redis)
    expected = job_history(redis, 60)
    browser.get(dashboard.url("/job-metrics"))
    wait_until(browser, lambda b: shown(b, "#job-history tr[data-class] td.processed"))
    assert shown(browser, "#job-history tr[data-class] td:first-child") == [
        row.job_class for row in expected
    ]
    assert shown(browser, "#job-history td.processed") == [f"{r.processed:,}" for r in expected]
    screenshot(browser, "job-metrics", tmp_path)
    browser.get(dashboard.url("/job-metrics/sync.ImportLedger"))
    wait_until(browser, lambda b: values(b, "#heat-class rect.cell"))
    # One script call each: a live refresh may swap the SVGs between two element reads.
    assert sum(values(browser, "#heat-class rect.cell")) == expected[-1].processed
    assert sum(values(browser, "#chart-class rect.processed")) == expected[-1].processed
    screenshot(browser, "job-metrics-class", tmp_path)
