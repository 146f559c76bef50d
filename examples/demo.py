"""A small app for the quick start: a few jobs that log what they do.

limitd start -r examples.demo -q default -q reports
limitd enqueue examples.demo.fan_out '[20]'
"""

from __future__ import annotations

import logging
import random
import time

import limitd

log = logging.getLogger("demo")


@limitd.job
def greet(name: str) -> None:
    log.info("hello, %s", name)


@limitd.job(queue="reports", retry=3)
def build_report(tenant: str, number: int) -> None:
    time.sleep(random.uniform(0.05, 0.3))  # pretend to work
    if random.random() < 0.1:
        raise RuntimeError(f"report {number} for {tenant} hit a flaky dependency")
    log.info("report %d for %s done", number, tenant)


@limitd.job
def fan_out(count: int) -> None:
    """Enqueue ``count`` reports for two tenants in one bulk push, and greet."""
    args = [[random.choice(["acme", "globex"]), n] for n in range(count)]
    build_report.perform_bulk(args)
    greet.perform_async("world")
