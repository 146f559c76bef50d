"""Job metrics history (Sidekiq 7's Metrics page): per job class and per minute, how many
jobs ran, how many failed, how long they took and a histogram of their durations, kept
in Redis for a few hours.

The flow: :class:`limitd.job_history.middleware.JobHistory` tallies each settled job in
the process's memory (``store.Tally``, no Redis work per job); the service in
``process`` writes the tally every few seconds in one pipeline of ``HINCRBY`` into one
hash per minute (``store.flush``), which expires; ``admin.job_history`` reads the last
minutes back for the admin API and the dashboard's Metrics page.
"""

# The config section's key and its keys, here so that both the section's reader and the
# plug (which ``import limitd`` loads without the reader) name them once.
KEY = "job_history"
HISTORY_KEYS = frozenset({"enabled", "flush_interval", "retention"})
