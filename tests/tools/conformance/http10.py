# The conformance matrix's application on Python's http.server, which speaks HTTP/1.0: every
# answer's body runs to the close (no length, no chunks), one request a connection.
import http.server
import sys
import time

SLOW_S = 0.6


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slow":
            time.sleep(SLOW_S)
        if self.path == "/204":
            return self.answer(204, b"")
        if self.path == "/304":
            return self.answer(304, b"")
        self.answer(200, b"hello\n")

    def do_HEAD(self):
        self.answer(200, b"")

    def do_POST(self):
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            length = 0
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                self.rfile.read(size + 2)
                length += size
                if size == 0:
                    break
        else:
            length = len(self.rfile.read(int(self.headers.get("content-length") or 0)))
        self.answer(200, b"got %d\n" % length)

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("content-type", "text/plain")
        self.send_header("etag", '"v1"')
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
