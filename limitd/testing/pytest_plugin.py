"""limitd's pytest plugin (entry point ``pytest11``): the testing modes as fixtures.

Loaded into every pytest run where limitd is installed (``-p no:limitd`` leaves it
out). As a module of the package it imports ``limitd`` when loaded; the testing modes
themselves are set up only for a test that asks for one of its fixtures::

    def test_signup(limitd_fake):
        signup("a@example.com")
        assert limitd_fake.args_for(send_welcome) == [["a@example.com"]]

    def test_signup_inline(limitd_inline):
        signup("a@example.com")   # ran already
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from limitd.testing import FakeJobs, InlineJobs


@pytest.fixture
def limitd_fake() -> Iterator[FakeJobs]:
    """Fake mode for the test: pushes are recorded (``FakeJobs``), run with ``drain()``."""
    from limitd.testing import fake

    with fake() as jobs:
        yield jobs


@pytest.fixture
def limitd_inline() -> Iterator[InlineJobs]:
    """Inline mode for the test: every push runs its job at once; errors go up."""
    from limitd.testing import inline

    with inline() as jobs:
        yield jobs
