"""A FastAPI app for tests/clients.rs behind `ratewarden.asgi`."""

import asyncio
import os

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from ratewarden.asgi import RateLimitMiddleware

app = FastAPI()
app.add_middleware(RateLimitMiddleware, url=os.environ["RATEWARDEN_URL"])


@app.get("/stream")
async def stream(n: int = 5):
    async def chunks():
        for i in range(n):
            yield f"chunk {i}\n"
            await asyncio.sleep(0.3)

    return StreamingResponse(chunks(), media_type="text/plain")


@app.get("/hello")
async def hello():
    return {"ok": True}
