# The conformance matrix's application under uvicorn: the same endpoints as wsgi.py.
import asyncio

SLOW_S = 0.6


async def reply(send, status, body, headers=()):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), *headers]})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    if scope["method"] == "POST":
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        return await reply(send, 200, b"got %d\n" % len(body))
    if path == "/slow":
        await asyncio.sleep(SLOW_S)
    if path == "/204":
        return await reply(send, 204, b"")
    if path == "/304":
        return await reply(send, 304, b"", [(b"etag", b'"v1"')])
    return await reply(send, 200, b"hello\n", [(b"etag", b'"v1"')])
