"""Daphne with a bounded shutdown: `python -m console.serve [daphne's options] console.asgi:application`.

Daphne itself, on SIGTERM, cancels every request at once and then waits, without limit, for
the threads still running them (a 25 s exec kept a stopped console alive for 25 s while its
scheduler went on). Here, on SIGTERM or SIGINT (`console/shutdown.py` holds the Django side):

1. the periodic tasks stop and the listening ports close at once;
2. HTTP requests in flight get processes.shutdown_grace_s to finish (websockets are not waited for:
   a terminal reattaches through the next process);
3. what still runs is cut: answered 503 `shutting_down` where no answer had started, its
   application cancelled;
4. this process's exec slots, commands and jobs are released, and the process exits at
   once, without waiting for the threads of what was cut.

Daphne is imported here only: it installs Twisted's asyncio reactor when imported, which only
the server process wants. `scripts/start.sh` runs this module.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
import time
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.http_protocol import WebRequest
from daphne.server import Server
from twisted.internet import defer
from twisted.internet import reactor as _reactor

logger = logging.getLogger("console.serve")
POLL_S = 0.1
# How long cancelled applications get to unwind before the reactor stops regardless.
UNWIND_S = 0.5
reactor: Any = _reactor  # Twisted's installed reactor (its stubs type the module as an interface)


class ConsoleServer(Server):
    """Daphne's server, with `kill_all_applications` (its before-shutdown hook) bounded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ports: list[Any] = []

    def listen_success(self, port: Any) -> None:
        self.ports.append(port)
        super().listen_success(port)

    def _in_flight_http(self) -> list[tuple[Any, Any]]:
        return [
            (protocol, details["application_instance"])
            for protocol, details in list(self.connections.items())
            if isinstance(protocol, WebRequest)
            and details.get("application_instance") is not None
            and not details["application_instance"].done()
        ]

    def kill_all_applications(self) -> defer.Deferred:
        from console import shutdown

        shutdown.begin(len(self._in_flight_http()))
        for port in self.ports:
            port.stopListening()
        deadline = time.monotonic() + shutdown.grace_s()
        done: defer.Deferred = defer.Deferred()

        def check() -> None:
            if self._in_flight_http() and time.monotonic() < deadline:
                reactor.callLater(POLL_S, check)
                return
            cut = self._cut_everything()
            shutdown.cut(cut)
            unwind = [details["application_instance"] for details in self.connections.values()]
            waiting = [instance for instance in unwind if instance is not None and not instance.done()]
            gathered = defer.Deferred.fromFuture(asyncio.gather(*waiting, return_exceptions=True))
            gathered.addTimeout(UNWIND_S, reactor)
            gathered.addBoth(lambda _: done.callback(None))

        check()
        return done

    def _cut_everything(self) -> int:
        """Cancel every application still running; a request with no answer yet gets a 503."""
        cut = 0
        for protocol, details in list(self.connections.items()):
            instance = details.get("application_instance")
            if instance is None or instance.done():
                continue
            if isinstance(protocol, WebRequest):
                cut += 1
                if not protocol._response_started and not details.get("disconnected"):
                    try:
                        protocol.handle_reply(
                            {
                                "type": "http.response.start",
                                "status": 503,
                                "headers": [(b"Content-Type", b"application/json"), (b"Connection", b"close")],
                            }
                        )
                        protocol.handle_reply({"type": "http.response.body", "body": _shutting_down_body()})
                    except Exception:  # the client went away meanwhile
                        logger.debug("no 503 for a cut request", exc_info=True)
            instance.cancel()
        return cut


def _shutting_down_body() -> bytes:
    from console.shutdown import SHUTTING_DOWN_BODY

    return SHUTTING_DOWN_BODY


class ConsoleCommandLine(CommandLineInterface):
    server_class = ConsoleServer


def main(argv: list[str]) -> None:
    ConsoleCommandLine().run(argv)
    # The reactor has stopped. Release what this process holds, then leave at once: the
    # threads of cut requests (an exec waiting on its sandbox) must not hold the exit.
    from console import shutdown

    shutdown.finish()
    # What an interpreter's exit would run but for joining threads: the atexit handlers
    # (the metrics folder's clean-up, logging's flush).
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
