"""A real WebSocket (RFC 6455) on both ends of a proxied connection, from PyPI's `websockets`.

    websocket.py serve
        Listens on 127.0.0.1 (a port of the kernel's choosing, printed on the first line of
        stdout) and answers every text message with the same text uppercased.

    websocket.py client HOST PORT
        Opens ws://HOST/ through 127.0.0.1:PORT (the proxy; HOST is only the Host header), then
        for every line on stdin sends it as one message and prints the answer on a line of its
        own. Exits 0 when stdin ends, 1 (with the reason on stderr) when the connection fails.
"""

import socket
import sys

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.sync.server import serve


def serve_uppercase():
    def echo(connection):
        try:
            for message in connection:
                connection.send(message.upper())
        except ConnectionClosed:
            pass  # the client went away (a test ends by killing it)

    with serve(echo, "127.0.0.1", 0) as server:
        print(server.socket.getsockname()[1], flush=True)
        server.serve_forever()


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


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve_uppercase()
    elif sys.argv[1:2] == ["client"] and len(sys.argv) == 4:
        client(sys.argv[2], sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
