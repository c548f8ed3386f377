"""Websockets to a sandbox port: the client's ASGI websocket bridged to a websocket client
connection to the sandbox's own address.

The client side is autobahn's Twisted client (autobahn is already the console's websocket
implementation, under Daphne), run on Daphne's reactor, which is the asyncio loop this ASGI
app runs on (Twisted's asyncioreactor). Messages pass as they are (text stays text, binary
stays binary); a close on either side closes the other. Only under Daphne: elsewhere the
handshake is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from .common import Receive, Refused, Scope, Send, console_cookie_names, cookies, request_headers
from .tuning import INBOUND

Admit = Callable[[Scope], Awaitable[tuple[str, int, str]]]
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


async def bridge(scope: Scope, receive: Receive, send: Send, admit: Admit) -> None:
    """One websocket: `admit` checks the credential and answers the sandbox's address and the
    path (with query) to ask it for, or raises Refused (the handshake is then refused: 403)."""
    first = await receive()
    if first["type"] != "websocket.connect":
        return
    try:
        host, port, path = await admit(scope)
    except Refused:
        await send({"type": "websocket.close", "code": 1008})
        return
    try:
        upstream, events = await _connect(scope, host, port, path)
    except (OSError, ConnectionError, TimeoutError, RuntimeError):
        await send({"type": "websocket.close", "code": 1011})
        return
    await send({"type": "websocket.accept", "subprotocol": getattr(upstream, "websocket_protocol_in_use", None)})
    pumps = [
        asyncio.ensure_future(_client_to_upstream(receive, upstream)),
        asyncio.ensure_future(_upstream_to_client(events, send)),
    ]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        with contextlib.suppress(Exception):
            upstream.sendClose()


async def _connect(scope: Scope, host: str, port: int, path: str) -> tuple[Any, asyncio.Queue[tuple[Any, ...]]]:
    try:
        from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
        from twisted.internet import asyncioreactor
        from twisted.internet import reactor as installed
    except ImportError as exc:  # pragma: no cover - both come with Daphne
        raise RuntimeError("websockets to sandboxes need Daphne") from exc
    reactor: Any = installed
    if not isinstance(reactor, asyncioreactor.AsyncioSelectorReactor):
        raise RuntimeError("websockets to sandboxes need Daphne's asyncio reactor")
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[Any] = loop.create_future()
    events: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

    class Upstream(WebSocketClientProtocol):
        def onOpen(self) -> None:
            if not opened.done():
                opened.set_result(self)

        def onMessage(self, payload: bytes, isBinary: bool) -> None:
            events.put_nowait(("message", payload, isBinary))

        def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
            if not opened.done():
                opened.set_exception(ConnectionError(reason or "the sandbox refused the websocket"))
            events.put_nowait(("close", code, reason))

    headers = request_headers(scope)
    console = console_cookie_names()
    kept = "; ".join(f"{n}={m.coded_value}" for n, m in cookies(headers).items() if n not in console)
    factory = WebSocketClientFactory(
        f"ws://{host}:{port}{path}",
        protocols=list(scope.get("subprotocols") or []) or None,
        headers={"Cookie": kept} if kept else {},
        reactor=reactor,
    )
    factory.protocol = Upstream
    factory.setProtocolOptions(
        maxMessagePayloadSize=MAX_MESSAGE_BYTES,
        maxFramePayloadSize=MAX_MESSAGE_BYTES,
        openHandshakeTimeout=INBOUND.connect_timeout_s,
        autoPingInterval=30,
        autoPingTimeout=30,
    )
    connector: Any = reactor.connectTCP(host, port, factory, timeout=INBOUND.connect_timeout_s)
    try:
        upstream = await asyncio.wait_for(opened, INBOUND.connect_timeout_s * 2)
    except BaseException:
        connector.disconnect()
        raise
    return upstream, events


async def _client_to_upstream(receive: Receive, upstream: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        if message["type"] != "websocket.receive":
            continue
        if message.get("bytes") is not None:
            upstream.sendMessage(message["bytes"], isBinary=True)
        else:
            upstream.sendMessage((message.get("text") or "").encode(), isBinary=False)


async def _upstream_to_client(events: asyncio.Queue[tuple[Any, ...]], send: Send) -> None:
    while True:
        kind, first, second = await events.get()
        if kind == "message":
            if second:
                await send({"type": "websocket.send", "bytes": first})
            else:
                await send({"type": "websocket.send", "text": first.decode("utf-8", "replace")})
            continue
        code = first if isinstance(first, int) and (first == 1000 or 3000 <= first <= 4999) else 1000
        await send({"type": "websocket.close", "code": code})
        return
