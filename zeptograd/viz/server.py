"""Serve the page and one trace on 127.0.0.1 (never another interface): `/` the page, `/trace.json` the trace,
`/static/...` the page's files. The port is VIZ_PORT (default 8000), or the next free one when it is taken."""

from __future__ import annotations

import http.server
import os
import socket

from zeptograd.helpers import ArgumentError, getenv
from zeptograd.viz.trace import read_trace

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
PORTS_TRIED = 50  # VIZ_PORT, then the next ones while they are taken
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".json": "application/json"}


class _Handler(http.server.BaseHTTPRequestHandler):
    trace_path = ""  # set on the subclass make_server builds

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            file = os.path.join(STATIC, "index.html")
        elif path == "/trace.json":
            file = self.trace_path
        elif path.startswith("/static/"):
            file = os.path.realpath(os.path.join(STATIC, path[len("/static/") :]))
            if not file.startswith(STATIC + os.sep):  # ../ out of the page's folder
                return self.send_error(404)
        else:
            return self.send_error(404)
        if not os.path.isfile(file):
            return self.send_error(404)
        with open(file, "rb") as f:
            body = f.read()
        self.send_response(200)
        self.send_header("Content-Type", _TYPES.get(os.path.splitext(file)[1], "text/plain") + "; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # quiet: the terminal shows the URL, not every request
        pass


def make_server(trace_path: str, port: int | None = None) -> http.server.ThreadingHTTPServer:
    """A server of the trace (checked first: a bad file is an error here, not a blank page) on the first free port
    from `port` (default VIZ_PORT, 8000) on; port 0 takes any free port."""
    read_trace(trace_path)
    handler = type("Handler", (_Handler,), {"trace_path": os.path.abspath(trace_path)})
    first = getenv("VIZ_PORT", 8000) if port is None else port
    for p in [first] if first == 0 else range(first, first + PORTS_TRIED):
        try:
            return http.server.ThreadingHTTPServer(("127.0.0.1", p), handler)
        except OSError:  # taken: try the next
            continue
    raise ArgumentError(f"VIZ: no free port in {first}..{first + PORTS_TRIED - 1} on 127.0.0.1 (set VIZ_PORT)")


def url_of(server: http.server.ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host if isinstance(host, str) else socket.gethostname()}:{port}/"


def serve(trace_path: str, port: int | None = None) -> None:
    """Serve until Ctrl-C."""
    server = make_server(trace_path, port)
    print(f"VIZ: serving {trace_path} at {url_of(server)} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
