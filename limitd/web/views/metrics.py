"""``/metrics``: the cluster's state in Prometheus's text format, the very page
``limitd metrics`` serves (the same ``ClusterCollector``, read from Redis at each
scrape), so a Prometheus that already reaches the dashboard needs no second port.

Behind the dashboard's guard like every page: with ``--auth``, give the scrape job
``basic_auth``. Run one scrape target per cluster, as for the exporter.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd.metrics.exporter import registry_for

ORDER = 900
NAV = None


def metrics(request: Request) -> Response:
    page = generate_latest(registry_for(request.app.state.redis))
    return Response(page, media_type=CONTENT_TYPE_LATEST)


ROUTES = [Route("/metrics", metrics, name="metrics")]
