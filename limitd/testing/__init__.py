"""Testing mode for app code: enqueue and run limitd jobs in a test suite without Redis.

::

    from limitd import testing

    def test_signup_sends_welcome():
        with testing.fake() as jobs:           # pushes are recorded
            signup("a@example.com")
            assert jobs.args_for(send_welcome) == [["a@example.com"]]
            jobs.drain()                       # run them (and what they push)

    def test_signup_inline():
        with testing.inline():                 # pushes run at once
            signup("a@example.com")

The pytest plugin limitd registers gives the same as fixtures: ``limitd_fake`` and
``limitd_inline``. See docs/testing.md for what differs from production.
"""

from limitd.testing.fake import FakeJobs, TooManyJobs, fake
from limitd.testing.inline import InlineJobs, inline
from limitd.testing.memory import NeedsRealRedis

__all__ = ["FakeJobs", "InlineJobs", "NeedsRealRedis", "TooManyJobs", "fake", "inline"]
