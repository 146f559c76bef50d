"""The asyncio client: awaitable enqueues for async web apps (FastAPI, Starlette).

::

    jid = await send_webhook.aio.perform_async(42, "https://example.com/hook")
    await send_webhook.aio.set(queue="low").perform_in(30, 42, "https://...")
    await HardJob.aio.perform_bulk([[1], [2]])

    async with batch.aio.jobs():
        await import_invoice.aio.perform_async(invoice_id)

Every Redis call goes through ``redis.asyncio``, so a push never blocks the event loop,
and passes the same client middleware as a sync push (unique jobs, batches, tenant
fairness), whose Redis work the chain awaits (``ClientChain.ainvoke``). The modules:
:mod:`limitd.aio.client` (``AsyncClient``) and :mod:`limitd.aio.enqueue`
(``AsyncEnqueuer``, what ``.aio`` returns).

This file imports nothing: importing a submodule loads only what that one needs.
"""
