"""``gpuhook metrics serve``: the metrics over HTTP (``GET /metrics``), in a process of its own.

Why a process of its own, not a thread of the runtime service (``gpuhook runtime serve``): the
service forks a worker for each create, and a fork copies the state of every thread's locks
(NVML's, the HTTP server's, logging's) as they are at that moment, so a scrape in progress could
deadlock a create; a slow NVML (a node without nvidia-persistenced takes seconds to initialise)
or a storm of scrapes would compete with creates for the service's CPU; and the service runs as
the engine's user with no network listener at all, which a TCP socket would change. The metrics
process only reads what creates already wrote (the decision records) and what NVML and /proc
show, so it can stop, crash or be scraped hard without any container noticing.
"""

from __future__ import annotations

import signal
import socket
import threading
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gpuhook.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuhook.config.types import Config

DEFAULT_LISTEN = "127.0.0.1:9479"


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for an IPv6 address, ``:PORT`` for every address) ->
    (host, port). UsageError with one line otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"metrics address {value!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN})")
    host = host.removeprefix("[").removesuffix("]")
    return host or "0.0.0.0", int(port)  # noqa: S104 (":PORT" asks for every address)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def _server(host: str, port: int, app: Any) -> WSGIServer:
    from prometheus_client.exposition import ThreadingWSGIServer

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    return make_server(host, port, app, Server, handler_class=_Quiet)


def serve(config: Config, listen: str, interval: float, announce: Callable[[str], None]) -> int:
    """Serve until SIGTERM or SIGINT; return that signal's number. The records are scanned
    every ``interval`` seconds (and at each scrape)."""
    from prometheus_client import make_wsgi_app

    from gpuhook.nodeview import metrics

    host, port = parse_listen(listen)
    registry, feed = metrics.registry(config)
    try:
        httpd = _server(host, port, make_wsgi_app(registry))
    except OSError as exc:
        raise UsageError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
    stop = threading.Event()
    got: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        got.append(signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    feed.scan()
    server = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    server.start()
    bound = httpd.server_address
    announce(f"gpuhook metrics on http://{listen.rpartition(':')[0] or '*'}:{bound[1]}/metrics")
    while not stop.wait(interval):
        feed.scan()
    httpd.shutdown()
    httpd.server_close()
    return got[0] if got else 0
