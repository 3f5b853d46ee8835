"""A real WebSocket (RFC 6455) on both ends of a proxied connection, from PyPI's `websockets`.

    websocket.py serve [PORT]
        Listens on 127.0.0.1 (PORT, else a port of the kernel's choosing; printed on the first
        line of stdout) and answers every text message with the same text uppercased; a plain HTTP
        request (no Upgrade) gets 200 "ok".

    websocket.py client HOST PORT
        Opens ws://HOST/ through 127.0.0.1:PORT (the proxy; HOST is only the Host header), then
        for every line on stdin sends it as one message and prints the answer on a line of its
        own. Exits 0 when stdin ends, 1 (with the reason on stderr) when the connection fails.

    websocket.py hold HOST PORT [CAFILE]
        Keeps a WebSocket open through 127.0.0.1:PORT (wss, trusting CAFILE, when given): sends a
        message every 50 ms and checks each answer. Prints `open T` at each open and, when the
        server closes it cleanly, `closed CODE T` (T: Unix time), then opens another. When stdin
        ends it closes the connection itself and prints `done N` (N messages answered), exit 0.
        Anything else (a wrong answer, a connection that fails or closes uncleanly) prints
        `failed: WHY` and exits 1.
"""

import asyncio
import http
import socket
import ssl
import subprocess
import sys
import threading
import time

from websockets.exceptions import ConnectionClosed, ConnectionClosedOK
from websockets.sync.client import connect
from websockets.asyncio.client import connect as connect_async
from websockets.asyncio.server import serve as serve_async


def serve_uppercase(port=0):
    # asyncio, one thread: a plain request (the tests' load, one connection each: a response
    # from process_request closes it) costs no thread, and a deep accept queue takes a burst of
    # them without a dropped SYN.
    async def echo(connection):
        try:
            async for message in connection:
                await connection.send(message.upper())
        except ConnectionClosed:
            pass  # the client went away (a test ends by killing it)

    def plain_http(connection, request):
        if "upgrade" not in request.headers.get("Connection", "").lower():
            return connection.respond(http.HTTPStatus.OK, "ok\n")
        return None

    async def main():
        async with serve_async(
            echo, "127.0.0.1", port, process_request=plain_http, backlog=4096
        ) as server:
            bound = next(iter(server.sockets)).getsockname()[1]
            print(bound, flush=True)
            await server.serve_forever()

    asyncio.run(main())


def client(host, port):
    sock = socket.create_connection(("127.0.0.1", int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        with connect(f"ws://{host}/", sock=sock, open_timeout=10) as connection:
            print("open", flush=True)
            for line in sys.stdin:
                connection.send(line.rstrip("\n"))
                print(connection.recv(timeout=10), flush=True)
    except Exception as e:  # the test reads the reason
        print(f"websocket: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


def hold(host, port, cafile):
    asyncio.run(hold_async(host, port, cafile))


async def hold_async(host, port, cafile):
    # asyncio, one thread: websockets' threaded client reads a TLS socket in one thread while
    # it writes in another, which Python's ssl does not allow; on a busy host a handshake's
    # request was lost so (the proxy never got it) and the client waited out its 10 s.
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()

    def watch_stdin():
        for _ in sys.stdin:
            pass
        loop.call_soon_threadsafe(ended.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    context = None
    if cafile:
        context = ssl.create_default_context(cafile=cafile)
    answered = 0
    local = None
    try:
        while not ended.is_set():
            sock = socket.create_connection(("127.0.0.1", int(port)), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            local = sock.getsockname()[1]
            scheme = "wss" if context else "ws"
            async with connect_async(
                f"{scheme}://{host}/",
                sock=sock,
                ssl=context,
                server_hostname=host if context else None,
                open_timeout=10,
            ) as connection:
                print(f"open {time.time():.3f}", flush=True)
                try:
                    while not ended.is_set():
                        message = f"m{answered}"
                        await connection.send(message)
                        answer = await asyncio.wait_for(connection.recv(), 10)
                        if answer != message.upper():
                            print(f"failed: {message} answered {answer}", flush=True)
                            sys.exit(1)
                        answered += 1
                        await asyncio.sleep(0.05)
                except ConnectionClosedOK as closed:
                    code = closed.rcvd.code if closed.rcvd else "none"
                    print(f"closed {code} {time.time():.3f}", flush=True)
    except Exception as e:  # the test reads the reason
        print(f"failed: {type(e).__name__}: {e}{sockets_of(local)}", flush=True)
        sys.exit(1)
    print(f"done {answered}", flush=True)


def sockets_of(local):
    """Both ends of the connection from local port `local`, as `ss` sees them (queues, owning
    process): which side holds what, for a failure's reason. On one line."""
    if local is None:
        return ""
    try:
        seen = subprocess.run(
            ["ss", "-tanp", f"( sport = :{local} or dport = :{local} )"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout
    except Exception as e:
        return f" (ss: {e})"
    return " | ss: " + " ".join(seen.split())


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) in (2, 3):
        serve_uppercase(int(sys.argv[2]) if len(sys.argv) == 3 else 0)
    elif sys.argv[1:2] == ["client"] and len(sys.argv) == 4:
        client(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["hold"] and len(sys.argv) in (4, 5):
        hold(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) == 5 else None)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
