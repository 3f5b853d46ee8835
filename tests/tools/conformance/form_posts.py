# Issue 79's reproduction as its reporter ran it: Python's http.client posting a form (`a=1`)
# over one kept TLS connection again and again, its body right behind its head or a moment
# after it, to paths that read the form and to one that answers without reading it. Several
# such clients at once. Prints {"answered": N, "lost": [why, ...]}.
import http.client
import json
import socket
import ssl
import sys
import threading
import time

port, ca, host, total, clients = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
context = ssl.create_default_context(cafile=ca)
lock = threading.Lock()
answered = 0
lost = []


class Connection(http.client.HTTPSConnection):
    """http.client's connection to the site's name (its TLS name) at the proxy's loopback
    port."""

    def connect(self):
        sock = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        self.sock = context.wrap_socket(sock, server_hostname=self.host)


def connect():
    return Connection(host, int(port), context=context, timeout=30)


def post(conn, path, gap):
    conn.putrequest("POST", path, skip_host=True)
    conn.putheader("Host", host)
    conn.putheader("Content-Type", "application/x-www-form-urlencoded")
    conn.putheader("Content-Length", "3")
    conn.endheaders()
    if gap:
        time.sleep(gap)
    conn.send(b"a=1")
    answer = conn.getresponse()
    return answer.status, answer.read()


def client(index, count):
    global answered
    conn = connect()
    for n in range(count):
        path, said = [("/form", b"got 3 bytes\n"), ("/early", b"got 0 bytes\n"),
                      ("/form-slow", b"got 3 bytes\n")][n % 3]
        gap = 0.015 if (n + index) % 2 else 0.0
        time.sleep(0.01)
        try:
            status, body = post(conn, path, gap)
            if status == 200 and body == said:
                with lock:
                    answered += 1
            else:
                with lock:
                    lost.append(f"client {index} #{n} {path}: {status} {body[:60]!r}")
        except Exception as e:  # noqa: BLE001 - a lost request is the finding
            with lock:
                lost.append(f"client {index} #{n} {path} (gap {gap}): {type(e).__name__}: {e}")
            conn.close()
            conn = connect()


each = total // clients
threads = [threading.Thread(target=client, args=(i, each)) for i in range(clients)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"answered": answered, "lost": lost}))
