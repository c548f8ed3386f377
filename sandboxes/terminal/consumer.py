"""Websocket consumers of the sandboxes app: the web terminal.

`/ws/terminals/<uuid>/?ticket=...` (docs/terminal-protocol.md). Binary frames carry PTY
bytes both ways; text frames carry one JSON control message each. The handshake is refused
(closed before accept) without a valid, unused ticket of this user for this terminal, or
without the member role in the session's space. The PTY is owned by a
`sandboxes.terminal.process.TerminalProcess` in this process; the shell behind it is kept by
the sandbox where it can be (`keeper`), so a connection through another process reattaches
to it. The channel layer only carries control events (logout, access changes) to the
per-user group.

A failing channel layer (Redis away, a read timing out) never takes the websocket down: the
consumer retries the layer with a backoff, re-joins its group and re-checks access once the
layer answers again, since events sent meanwhile are lost. However the connection ends (a
close, an exception, a cancellation by the server), its shell is detached into the grace
window or closed; it is never left attached to a dead connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch

from console.logs import REQUEST_ID_HEADER, sane_request_id, set_request_id

from ..backends.base import PtySize, RemoteError
from . import process as processes
from . import protocol
from .access import revoked, user_group
from .process import TerminalGone, TerminalProcess, get_process, install_shutdown_hook
from .protocol import CLOSE_LOGGED_OUT, CLOSE_NORMAL, CLOSE_UNAVAILABLE
from .tickets import Grant, Refused, admit

logger = logging.getLogger(__name__)

MAX_CONTROL_CHARS = 4096
LAYER_RETRY_FIRST_S = 0.5
LAYER_RETRY_MAX_S = 5.0


class TerminalConsumer(AsyncWebsocketConsumer):
    """One browser tab's connection to one terminal."""

    grant: Grant | None = None
    process: TerminalProcess | None = None
    in_group = False  # the group holds this channel (as far as we know)
    gone = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """AsyncConsumer.__call__, with a channel-layer receive that survives layer errors
        and a last step that runs however the connection ends."""
        self.scope = scope
        # This connection's request id (console/logs.py): its log lines, and the backend calls
        # and database work it starts (tasks and sync_to_async copy the context), carry it.
        headers = dict(scope.get("headers") or [])
        set_request_id(sane_request_id(headers.get(REQUEST_ID_HEADER.lower().encode())))
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.base_send = send
        sources = [receive]
        if self.channel_layer is not None:
            self.channel_name = await self.channel_layer.new_channel()
            sources.append(self._receive_control_event)
        try:
            await await_many_dispatch(sources, self.dispatch)
        except StopConsumer:
            pass
        finally:
            await self._connection_over()

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Frames from the client go straight to `receive`; everything else as Channels does it.

        Channels' `AsyncConsumer.dispatch` first runs `aclose_old_connections()` in the sync
        thread for every message: a thread hop (often queued behind the keepalive's database
        work) on each keystroke's way to the shell. `receive` never touches the database (the
        handshake and the control events that do keep that step, and
        `database_sync_to_async` closes old connections around every call anyway)."""
        if message["type"] == "websocket.receive":
            await self.websocket_receive(message)
            return
        await super().dispatch(message)

    async def _receive_control_event(self) -> dict[str, Any]:
        """The next control event from the layer; on errors retry with a backoff, and after
        one, re-join the group and re-check access (events sent meanwhile are lost)."""
        assert self.channel_layer is not None
        delay = LAYER_RETRY_FIRST_S
        failed = False
        while True:
            try:
                if failed:
                    await self._join_group()
                    return {"type": "terminal.recheck"}
                return dict(await self.channel_layer.receive(self.channel_name))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed = True
                logger.warning(
                    "terminal channel layer failed (%s: %s); retrying in %.1f s", type(exc).__name__, exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, LAYER_RETRY_MAX_S)

    async def _join_group(self) -> None:
        if self.channel_layer is not None and self.grant is not None and not self.gone:
            await self.channel_layer.group_add(user_group(self.grant.user_id), self.channel_name)
            self.in_group = True

    async def _leave_group(self) -> None:
        if self.in_group and self.channel_layer is not None and self.grant is not None:
            self.in_group = False
            try:
                await self.channel_layer.group_discard(user_group(self.grant.user_id), self.channel_name)
            except Exception as exc:  # the group entry expires on its own
                logger.warning("terminal %s: leaving the group failed: %s", self.grant.terminal_id, exc)

    async def _connection_over(self) -> None:
        """However the connection ended (closed, crashed, cancelled by the server): never
        leave the shell attached to it. When the server is stopping, the shutdown hook ends
        the shell and closes the websocket (which outlives its cancelled application)."""
        if processes.shutting_down:
            return
        self.gone = True
        process = self.process
        if process is not None and process.consumer is self and not process.closed:
            process.detach(self)
        with contextlib.suppress(BaseException):
            await self._leave_group()

    async def connect(self) -> None:
        if processes.shutting_down:  # close_all() has taken its list: a shell now would leak
            await self.close(code=protocol.CLOSE_SERVER_STOPPING)
            return
        install_shutdown_hook()
        user = self.scope.get("user")
        terminal_id = str(self.scope["url_route"]["kwargs"]["terminal_id"])
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        ticket = (query.get("ticket") or [""])[0]
        login = self.scope.get("session")
        try:
            self.grant = await database_sync_to_async(admit)(
                user, terminal_id, ticket, getattr(login, "session_key", None)
            )
        except Refused as refused:
            logger.info("terminal %s: handshake refused (%s)", terminal_id, refused.reason)
            await self.close(code=refused.code)
            return
        try:
            await self._join_group()
        except Exception as exc:
            # Without the group, loss of access is still found by the keepalive re-check.
            logger.warning("terminal %s: joining the group failed: %s", terminal_id, exc)
        # A change committed between the ticket's redemption and the group join sent its
        # event to nobody (a shell in its grace window has no connection in the group):
        # check again now that later events reach us.
        revocation = await database_sync_to_async(revoked)(self.grant)
        if revocation is not None:
            logger.info("terminal %s: handshake refused (%s)", terminal_id, revocation.reason)
            existing = get_process(terminal_id)
            if existing is not None:  # the shell this connection would have reattached to
                await existing.close(revocation.reason, code=revocation.code)
            await self.close(code=revocation.code)
            return
        await self.accept()
        existing = get_process(terminal_id)
        if existing is not None and existing.kept:
            # A fresh tmux attachment, as through any other process: tmux redraws for this
            # client (replaying the old one's stream would replay tmux's terminal queries too,
            # whose answers would reach the shell as typed keys).
            await existing.close(processes.TAKEN_OVER, code=protocol.CLOSE_REPLACED, let_go=True)
            existing = None
        if existing is not None:
            self.process = existing
            await existing.attach(self, reattached=True)
            return
        client = self.scope.get("client") or [None]
        self.process = TerminalProcess(self.grant, user, client[0])
        await self.send_control({"type": "status", "state": "starting"})
        # Started in the background so resize frames sent meanwhile are received (and queued).
        # Never cancelled: start() kills a shell that opens after the terminal closed.
        self.start_task = self.process.loop.create_task(self._start(self.process))

    async def _start(self, process: TerminalProcess) -> None:
        try:
            await process.start()
        except TerminalGone as exc:
            await self.send_control({"type": "error", "message": f"Cannot open a terminal: {exc}"})
            await process.close(str(exc), let_go=True)
            return
        except RemoteError as exc:
            await self.send_control({"type": "error", "message": f"Cannot open a terminal: {exc.message}"})
            await process.close(f"could not start: {exc.kind}", code=CLOSE_UNAVAILABLE)
            return
        except Exception:
            logger.exception("terminal %s: start failed", process.grant.terminal_id)
            await process.close("could not start: internal error", code=CLOSE_UNAVAILABLE)
            return
        if process.closed:
            return
        if self.gone:
            process.start_grace()  # the client left while the shell was starting
            return
        await process.attach(self, reattached=process.reattached)

    async def disconnect(self, code: int) -> None:
        self.gone = True
        await self._leave_group()
        process = self.process
        if process is None or process.closed:
            return
        starting = process.consumer is None and process.handle is None
        if process.consumer is not self and not starting:
            return  # replaced by another connection, or already detached
        if code == CLOSE_NORMAL:
            await process.close("closed by the client")
        elif process.consumer is self:
            process.detach(self)
        # else still starting: _start() sees `gone` and detaches into the grace window

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        process = self.process
        if bytes_data is not None:
            if process is None or process.closed or process.consumer not in (self, None):
                return
            if not (self.grant and self.grant.read_only) and not process.write(bytes_data):
                await self.send_error("input dropped: the program in the terminal is not reading its input")
            return
        await self.control(text_data or "")

    async def control(self, text: str) -> None:
        """One JSON control message; anything malformed gets an error frame."""
        if len(text) > MAX_CONTROL_CHARS:
            await self.send_error("control message too long")
            return
        try:
            message = json.loads(text)
        except ValueError:
            await self.send_error("control messages are JSON objects")
            return
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            await self.send_error('control messages are JSON objects with a "type"')
            return
        kind = message["type"]
        process = self.process
        if kind == "ping":
            await self.send_control({"type": "pong"})
        elif kind == "resize":
            cols, rows = message.get("cols"), message.get("rows")
            if not isinstance(cols, int) or not isinstance(rows, int):
                await self.send_error("resize needs integer cols and rows")
                return
            if isinstance(cols, bool) or isinstance(rows, bool):
                await self.send_error("resize needs integer cols and rows")
                return
            if process is not None and not process.closed:
                process.resize(PtySize(cols=cols, rows=rows).clamped())
        elif kind == "pause":
            if process is not None:
                process.pause()
        elif kind == "resume":
            if process is not None:
                process.resume()
        elif kind == "history":
            if process is not None and not process.closed and process.consumer is self:
                await process.send_history(self)
        else:
            await self.send_error(f"unknown control message {kind[:40]!r}")

    # Sending ----------------------------------------------------------------------------------

    async def send_pty(self, data: bytes) -> None:
        if not self.gone:
            try:
                await self.send(bytes_data=data)
            except Exception:
                self.gone = True

    async def send_control(self, message: dict[str, Any]) -> None:
        if not self.gone:
            try:
                await self.send(text_data=json.dumps(message))
            except Exception:
                self.gone = True

    async def send_error(self, message: str) -> None:
        await self.send_control({"type": "error", "message": message})

    async def end(self, reason: str, code: int) -> None:
        """Tell the client why, then close the socket (the terminal is over for this client)."""
        await self.send_control({"type": "status", "state": "closed", "reason": reason, "code": code})
        if not self.gone:
            try:
                await self.close(code=code)
            except Exception as exc:
                logger.info("terminal: closing the websocket failed: %s", exc)
                self.gone = True

    # Control events from the per-user group ------------------------------------------------

    async def terminal_revoke(self, event: dict[str, Any]) -> None:
        reason = str(event.get("reason") or "logged out")
        if self.process is not None and self.process.consumer in (self, None):
            await self.process.close(reason, code=CLOSE_LOGGED_OUT)
        else:
            await self.end(reason, CLOSE_LOGGED_OUT)

    async def terminal_recheck(self, event: dict[str, Any]) -> None:
        if self.grant is None or self.process is None:
            return
        revocation = await database_sync_to_async(revoked)(self.grant)
        if revocation is None:
            return
        if self.process.consumer in (self, None):
            await self.process.close(revocation.reason, code=revocation.code)
        else:
            await self.end(revocation.reason, revocation.code)
