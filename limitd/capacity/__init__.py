"""Limited-capacity jobs: a job class that keeps at most N copies of itself running,
each draining one unit of work stored elsewhere, and re-enqueueing itself while work
remains (see ``limitd.capacity.job``)."""
