"""A FastAPI app that closes unpaid orders 30 minutes after they are placed.

The web process only schedules (``await rs.add`` on the asyncio client, which
never blocks the event loop); a worker runs the handler:

    pip install fastapi uvicorn
    uvicorn fastapi_app:web            # the web app (from this directory)
    rsched run worker fastapi_app:tasks

``POST /orders/1001`` schedules ``order.close 1001``; ``DELETE /orders/1001/close``
(the order was paid) cancels it. ``CLOSE_AFTER`` sets the delay (default 30m).
"""

import os
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException

from rsched import App
from rsched.aio import Rsched
from rsched.core.errors import NotFound

CLOSE_AFTER = os.environ.get("CLOSE_AFTER", "30m")

tasks = App()


@tasks.task("order.close", queue="orders", max_attempts=5, timeout="30s")
def close_order(task):
    # Idempotent: a retry after a crash closes an already closed order again, harmlessly.
    print(f"closing order {task.id} (placed {task.payload['placed']})")


_client: list[Rsched] = []


@asynccontextmanager
async def lifespan(_app: FastAPI):
    yield
    if _client:
        await _client.pop().close()


web = FastAPI(lifespan=lifespan)


def rs() -> Rsched:
    """One asyncio client per process (its adds are pipelined: many requests, few round trips)."""
    if not _client:
        s = tasks.settings  # the same URL/namespace/config as the worker's
        _client.append(Rsched.from_settings(s))
    return _client[0]


@web.post("/orders/{order_id}")
async def place_order(order_id: str) -> dict:
    res = await rs().add(
        "order.close",
        order_id,
        queue="orders",
        delay=CLOSE_AFTER,
        max_attempts=5,
        payload={"order": order_id, "placed": "now"},
    )
    return {"order": order_id, "close": res.status, "due_ms": res.task.due_ms}


@web.delete("/orders/{order_id}/close")
async def order_paid(order_id: str) -> dict:
    try:
        state = await rs().cancel("order.close", order_id, queue="orders")
    except NotFound:
        raise HTTPException(404, f"no pending close for order {order_id}") from None
    return {"order": order_id, "cancelled": state}
