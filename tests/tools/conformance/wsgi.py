# The conformance matrix's application under gunicorn (sync and gthread workers): every
# endpoint the matrix asks, its answers framed by gunicorn (a generator: chunked on HTTP/1.1).
import time

SLOW_S = 0.6


def app(environ, start_response):
    path = environ.get("PATH_INFO", "/")
    if environ["REQUEST_METHOD"] == "POST":
        # Read whole whatever its framing (a length, or chunked: gunicorn ends the input).
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return iter([b"got %d\n" % len(body)])
    if path == "/slow":
        time.sleep(SLOW_S)
    if path == "/204":
        start_response("204 No Content", [])
        return iter([])
    if path == "/304":
        start_response("304 Not Modified", [("ETag", '"v1"')])
        return iter([])
    start_response("200 OK", [("Content-Type", "text/plain"), ("ETag", '"v1"')])
    return iter([b"hello\n"])
