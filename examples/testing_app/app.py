"""A small Starlette app that enqueues limitd jobs from its endpoints; its tests
(``tests/``) run with limitd's testing mode, without Redis.

Run it for real with ``uvicorn app:app`` beside a Redis and ``limitd start``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import limitd

sent: list[str] = []  # stands in for a mail service


@limitd.job(queue="mail", retry=5)
def send_welcome(email: str) -> None:
    sent.append(email)
    schedule_followup.perform_in(86_400, email)


@limitd.job(queue="mail")
def schedule_followup(email: str) -> None:
    sent.append(f"followup:{email}")


@limitd.job(queue="reports", unique_for=3600)
async def build_report(account_id: int) -> None:
    sent.append(f"report:{account_id}")


async def signup(request: Request) -> JSONResponse:
    body = await request.json()
    jid = await send_welcome.aio.perform_async(body["email"])
    return JSONResponse({"queued": jid}, status_code=202)


async def report(request: Request) -> JSONResponse:
    jid = await build_report.aio.perform_async(int(request.path_params["account_id"]))
    return JSONResponse({"queued": jid is not None}, status_code=202)


app = Starlette(
    routes=[
        Route("/signup", signup, methods=["POST"]),
        Route("/accounts/{account_id}/report", report, methods=["POST"]),
    ]
)
