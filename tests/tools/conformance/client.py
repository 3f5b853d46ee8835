# The conformance matrix's clients (issue 79): for each host (one server users run behind the
# proxy), every kind of client sends every kind of request, on kept connections after each idle
# gap, and checks each answer. Prints one JSON object: for each host, the requests whose head
# was sent (`sent`), those whose client left on purpose (`left`), and every failure, named.
#
# Clients: HTTP/1.1 on one kept connection, plain and over TLS (written by hand here, so a
# body can come a moment after its head and `Expect: 100-continue` is seen); a new plain
# connection for each request; HTTP/2 with httpx on one kept connection; HTTP/2 with curl.
import json
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

import httpx

MIB = 1 << 20
CHUNKS = [b"0123456789"] * 3
BODY_GAP_S = 0.015
LEAVE_AFTER_S = 0.25


class Raw:
    """One HTTP/1.1 connection, plain or over TLS, as a client writes it byte by byte."""

    def __init__(self, host, port, tls):
        sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname=host)
        self.sock, self.file, self.host = sock, sock.makefile("rb"), host

    def head(self, method, path, *headers):
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}", *headers]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())

    def answer(self, head_request=False):
        status_line = self.file.readline()
        if not status_line:
            raise EOFError("the connection closed before an answer (EOF)")
        version, status = status_line.split()[:2]
        status = int(status)
        headers = {}
        while True:
            line = self.file.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = b""
        if status < 200 or head_request or status in (204, 304):
            pass
        elif "chunked" in headers.get("transfer-encoding", ""):
            while True:
                size = int(self.file.readline().split(b";")[0], 16)
                if size == 0:
                    while self.file.readline() not in (b"\r\n", b""):
                        pass
                    break
                body += self.file.read(size)
                self.file.readline()
        elif "content-length" in headers:
            body = self.file.read(int(headers["content-length"]))
        else:
            raise ValueError(f"an answer to HTTP/1.1 with no framing: {status_line!r} {headers}")
        return version.decode(), status, body

    def close(self):
        self.sock.close()


def raw_requests():
    """(name, run) for each request of the matrix on a raw connection; run returns
    (status, body) or raises."""

    def get(path, *headers, head=False):
        def run(c):
            c.head("HEAD" if head else "GET", path, *headers)
            return c.answer(head_request=head)
        return run

    def post(body, gap=0.0):
        def run(c):
            c.head("POST", "/echo", f"Content-Length: {len(body)}",
                   "Content-Type: application/x-www-form-urlencoded")
            if gap:
                time.sleep(gap)
            c.sock.sendall(body)
            return c.answer()
        return run

    def chunked(c):
        c.head("POST", "/echo", "Transfer-Encoding: chunked")
        for chunk in CHUNKS:
            c.sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            time.sleep(0.005)
        c.sock.sendall(b"0\r\n\r\n")
        return c.answer()

    def expect(c):
        c.head("POST", "/echo", "Content-Length: 5", "Expect: 100-continue")
        version, status, _ = c.answer()
        if status != 100:
            raise ValueError(f"Expect: 100-continue got {status}, not 100 first")
        c.sock.sendall(b"hello")
        return c.answer()

    return [
        ("GET", get("/"), 200, b"hello\n"),
        ("HEAD", get("/", head=True), 200, b""),
        ("POST small", post(b"a=1"), 200, b"got 3\n"),
        ("POST 1 MiB", post(b"x" * MIB), 200, b"got %d\n" % MIB),
        ("form POST, body a moment after its head", post(b"a=1", BODY_GAP_S), 200, b"got 3\n"),
        ("chunked upload", chunked, 200, b"got 30\n"),
        ("Expect: 100-continue", expect, 200, b"got 5\n"),
        ("204", get("/204"), 204, b""),
        ("304", get("/304", 'If-None-Match: "v1"'), 304, b""),
        ("slow answer", get("/slow"), 200, b"hello\n"),
    ]


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = 0
        self.left = 0
        self.redirected = 0
        self.failed = []

    def count(self, left=False, redirected=False):
        with self.lock:
            self.sent += 1
            self.left += left
            self.redirected += redirected

    def fail(self, what):
        with self.lock:
            self.failed.append(what)


def check(tally, cell, got, status, body):
    if got[0] != status or got[1] != body:
        tally.fail(f"{cell}: got {got[0]} {got[1][:60]!r}, wanted {status} {body!r}")


def raw_kept(host, port, tls, gaps, tally, kind):
    conn = Raw(host, port, tls)
    for gap in gaps:
        for name, run, status, body in raw_requests():
            time.sleep(gap / 1000)
            cell = f"{kind} gap {gap} ms, {name}"
            tally.count()
            try:
                version, got, answer = run(conn)
                if version != "HTTP/1.1":
                    tally.fail(f"{cell}: answered in {version}")
                check(tally, cell, (got, answer), status, body)
            except Exception as e:  # noqa: BLE001 - every failure is the matrix's finding
                tally.fail(f"{cell}: {type(e).__name__}: {e}")
                conn.close()
                conn = Raw(host, port, tls)
    conn.close()
    leave_raw(host, port, tls, tally)


def leave_raw(host, port, tls, tally):
    """A client that leaves while the release works on its request."""
    conn = Raw(host, port, tls)
    conn.head("GET", "/slow", f"X-Request-Id: leave-raw-{'tls' if tls else 'plain'}")
    tally.count(left=True)
    time.sleep(LEAVE_AFTER_S)
    conn.close()


def raw_new(host, port, tally):
    for name, run, status, body in raw_requests():
        cell = f"HTTP/1.1, a new connection each request, {name}"
        tally.count()
        conn = Raw(host, port, None)
        try:
            _, got, answer = run(conn)
            check(tally, cell, (got, answer), status, body)
        except Exception as e:  # noqa: BLE001
            tally.fail(f"{cell}: {type(e).__name__}: {e}")
        conn.close()
    leave_raw(host, port, None, tally)


def streamed(parts, gap):
    def body():
        for part in parts:
            time.sleep(gap)
            yield part
    return body()


def httpx_kept(host, port, new_context, gaps, tally):
    url = f"https://127.0.0.1:{port}"
    extensions = {"sni_hostname": host}
    headers = {"host": host}
    requests = [
        ("GET", "GET", "/", {}, None, 200, b"hello\n"),
        ("HEAD", "HEAD", "/", {}, None, 200, b""),
        ("POST small", "POST", "/echo", {}, lambda: b"a=1", 200, b"got 3\n"),
        ("POST 1 MiB", "POST", "/echo", {}, lambda: b"x" * MIB, 200, b"got %d\n" % MIB),
        ("form POST, body a moment after its head", "POST", "/echo", {},
         lambda: streamed([b"a=1"], BODY_GAP_S), 200, b"got 3\n"),
        ("streamed upload", "POST", "/echo", {}, lambda: streamed(CHUNKS, 0.005), 200,
         b"got 30\n"),
        ("Expect: 100-continue", "POST", "/echo", {"expect": "100-continue"},
         lambda: b"hello", 200, b"got 5\n"),
        ("204", "GET", "/204", {}, None, 204, b""),
        ("304", "GET", "/304", {"if-none-match": '"v1"'}, None, 304, b""),
        ("slow answer", "GET", "/slow", {}, None, 200, b"hello\n"),
    ]
    transport = httpx.HTTPTransport(http2=True, verify=new_context())
    with httpx.Client(transport=transport, timeout=15) as client:
        for gap in gaps:
            for name, method, path, more, content, status, body in requests:
                time.sleep(gap / 1000)
                cell = f"HTTP/2 (httpx) gap {gap} ms, {name}"
                tally.count()
                try:
                    answer = client.request(method, url + path, headers={**headers, **more},
                                            content=content() if content else None,
                                            extensions=extensions)
                    if answer.http_version != "HTTP/2":
                        tally.fail(f"{cell}: answered in {answer.http_version}")
                    check(tally, cell, (answer.status_code, answer.content), status, body)
                except Exception as e:  # noqa: BLE001
                    tally.fail(f"{cell}: {type(e).__name__}: {e}")
    # A client that leaves: its stream is given up while the release works on it.
    transport = httpx.HTTPTransport(http2=True, verify=new_context())
    with httpx.Client(transport=transport) as client:
        tally.count(left=True)
        try:
            client.get(url + "/slow", headers={**headers, "x-request-id": "leave-httpx"},
                       extensions=extensions,
                       timeout=httpx.Timeout(15, read=LEAVE_AFTER_S))
            tally.fail("HTTP/2 (httpx), a client that leaves: it was answered in time")
        except httpx.ReadTimeout:
            pass


def curl_each(host, port, ca, tally):
    upload = tempfile.NamedTemporaryFile()
    upload.write(b"x" * MIB)
    upload.flush()
    base = ["curl", "-sS", "--http2", "--cacert", ca, "--resolve", f"{host}:{port}:127.0.0.1",
            "-o", "-", "-w", "\n%{http_code} %{http_version}"]
    url = f"https://{host}:{port}"
    requests = [
        ("GET", ["/"], None, 200, b"hello\n"),
        ("HEAD", ["/", "-I"], None, 200, None),
        ("POST small", ["/echo", "--data-binary", "a=1"], None, 200, b"got 3\n"),
        ("POST 1 MiB", ["/echo", "--data-binary", "@" + upload.name], None, 200,
         b"got %d\n" % MIB),
        ("form POST, body a moment after its head", ["/echo", "-X", "POST", "-T", "-"],
         [b"a=1"], 200, b"got 3\n"),
        ("streamed upload", ["/echo", "-X", "POST", "-T", "-"], CHUNKS, 200, b"got 30\n"),
        ("Expect: 100-continue", ["/echo", "-H", "Expect: 100-continue", "--data-binary",
                                  "hello"], None, 200, b"got 5\n"),
        ("204", ["/204"], None, 204, b""),
        ("304", ["/304", "-H", 'If-None-Match: "v1"'], None, 304, b""),
        ("slow answer", ["/slow"], None, 200, b"hello\n"),
    ]
    for name, args, stdin, status, body in requests:
        cell = f"HTTP/2 (curl), {name}"
        tally.count()
        command = base + [url + args[0]] + args[1:]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
        for part in stdin or []:
            time.sleep(BODY_GAP_S)
            process.stdin.write(part)
            process.stdin.flush()
        out, err = process.communicate(timeout=30)
        text, _, said = out.rpartition(b"\n")
        code, _, version = said.decode().partition(" ")
        if process.returncode != 0 or version != "2":
            tally.fail(f"{cell}: curl exit {process.returncode}, HTTP {version}: {err!r}")
            continue
        got_body = text if body is not None else None
        check(tally, cell, (int(code), got_body), status, body)
    # A client that leaves: curl gives up while the release works.
    tally.count(left=True)
    left = subprocess.run(base + ["--max-time", str(LEAVE_AFTER_S), "-H", "X-Request-Id: leave-curl",
                                  url + "/slow"],
                          capture_output=True)
    if left.returncode != 28:
        tally.fail(f"HTTP/2 (curl), a client that leaves: exit {left.returncode}")


def redirected(host, port, tally):
    """Plain requests to the TLS proxy's plain listener on one kept connection: each sent to
    https (308), a POST's body read away so the connection goes on."""
    conn = Raw(host, port, None)
    for name, method, body in [("GET", "GET", None), ("POST 1 MiB", "POST", b"x" * MIB),
                               ("GET after a POST", "GET", None)]:
        cell = f"HTTP/1.1 to the plain listener of a TLS proxy, {name}"
        tally.count(redirected=True)
        try:
            if body is None:
                conn.head(method, "/")
            else:
                conn.head(method, "/echo", f"Content-Length: {len(body)}")
                conn.sock.sendall(body)
            _, status, _ = conn.answer()
            if status != 308:
                tally.fail(f"{cell}: {status}, not 308")
        except Exception as e:  # noqa: BLE001
            tally.fail(f"{cell}: {type(e).__name__}: {e}")
            conn.close()
            conn = Raw(host, port, None)
    conn.close()


def main():
    asked = json.loads(sys.argv[1])
    # Each client its own context: httpx sets ALPN (h2) on the one it is given, and a raw
    # HTTP/1.1 client offered h2 would be answered in it.
    context = ssl.create_default_context(cafile=asked["ca"])
    h2_context = lambda: ssl.create_default_context(cafile=asked["ca"])  # noqa: E731
    gaps = asked["gaps_ms"]
    # The plain proxy's routes and the TLS proxy's, each host's tally apart. One host at a time
    # (its six clients at once): the whole matrix at once took both cores of the test machine
    # from the tests running beside it.
    tallies = {}
    for host in asked["hosts"]:
        runs = []
        plain, tls = Tally(), Tally()
        tallies[f"{host} plain"], tallies[f"{host} tls"] = plain, tls
        runs += [
            lambda h=host, t=plain: raw_kept(h, asked["plain"], None, gaps, t,
                                             "HTTP/1.1 kept"),
            lambda h=host, t=plain: raw_new(h, asked["plain"], t),
            lambda h=host, t=tls: raw_kept(h, asked["tls"], context, gaps, t,
                                           "HTTP/1.1 over TLS kept"),
            lambda h=host, t=tls: httpx_kept(h, asked["tls"], h2_context, gaps, t),
            lambda h=host, t=tls: curl_each(h, asked["tls"], asked["ca"], t),
            lambda h=host, t=tls: redirected(h, asked["tls_plain"], t),
        ]
        threads = [threading.Thread(target=run) for run in runs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print(json.dumps({key: {"sent": t.sent, "left": t.left, "redirected": t.redirected,
                            "failed": t.failed}
                      for key, t in tallies.items()}))


main()
