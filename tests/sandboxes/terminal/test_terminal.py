"""The web terminal: views, and the consumer through the real ASGI stack on a real Docker sandbox.

Every websocket test runs on both channel layers (`layer`: in-memory and channels-redis, the
latter as production configures it). Fixtures and helpers: tests/support/terminal_support.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.core import signing
from django.test import Client
from django.urls import reverse

from console.models import AuditEvent, Membership, Role
from console.settings.base import redis_channel_layer
from sandboxes.backends.base import ExecRequest
from sandboxes.models import Session, Terminal
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.runtime import Runtime
from sandboxes.terminal import access as terminal_access
from sandboxes.terminal import protocol as terminal_protocol
from sandboxes.terminal import tickets as terminals
from sandboxes.terminal.consumer import LAYER_RETRY_MAX_S
from sandboxes.terminal.protocol import MAX_QUEUED_INPUT
from tests.personas import World
from tests.support import terminal_support
from tests.support.terminal_support import (
    RedisServer,
    Screen,
    communicator,
    cookie_for,
    new_ticket,
    open_terminal,
    shells_in,
    wait_closed,
    wait_no_shell,
)
from tests.support.tuning import Tuned

# The shared fixtures (pytest finds them as attributes of this module).
layer = terminal_support.layer
store = terminal_support.store
session = terminal_support.session
fast_terminals = terminal_support.fast_terminals
cleanup = terminal_support.cleanup
own_redis = terminal_support.own_redis


# --- Views ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_terminal_page_access_and_viewer_policy(world: World) -> None:
    from tests.factories import make_config

    config = make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "page")
    url = reverse("sandboxes:terminal_page", kwargs={"session_id": session.id})
    bob = world.client_for("bob").get(url)
    assert bob.status_code == 200
    assert b'id="terminal"' in bob.content
    assert b"js/terminal.js" in bob.content
    assert b"<script>" not in bob.content  # no inline scripts
    carol = world.client_for("carol").get(url)
    assert carol.status_code == 200
    assert b'id="terminal-viewer-notice"' in carol.content
    assert b'id="terminal"' not in carol.content
    assert world.client_for("charlie").get(url).status_code == 404
    assert world.client_for("anonymous").get(url).status_code == 302
    assert config.pk


@pytest.mark.django_db
def test_ticket_endpoint_roles_csrf_and_reticketing(world: World) -> None:
    from tests.factories import make_config

    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "tickets")
    url = reverse("sandboxes:terminal_create", kwargs={"session_id": session.id})
    response = world.client_for("bob").post(url)
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"terminal_id", "ws_url", "ticket"}
    assert body["ws_url"] == f"ws://testserver/ws/terminals/{body['terminal_id']}/"
    terminal = Terminal.objects.get(pk=body["terminal_id"])
    assert (terminal.user, terminal.session, terminal.read_only) == (world.bob, session, False)
    again = world.client_for("bob").post(url, {"terminal_id": body["terminal_id"]})
    assert again.status_code == 200
    assert again.json()["terminal_id"] == body["terminal_id"]
    assert again.json()["ticket"] != body["ticket"]
    assert world.client_for("alice").post(url, {"terminal_id": body["terminal_id"]}).status_code == 404
    assert world.client_for("carol").post(url).status_code == 403
    assert world.client_for("charlie").post(url).status_code == 404
    assert world.client_for("anonymous").post(url).status_code == 401
    assert world.client_for("bob").get(url).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(world.bob)
    assert strict.post(url).status_code == 403


@pytest.mark.django_db
def test_a_session_has_a_bounded_number_of_shells(world: World, tuned: Tuned) -> None:
    """However many tabs or pages ask, a session holds at most `terminal.max_per_session`
    terminals not closed; a closed one frees its place, and a ticket left unredeemed past its
    age no longer counts (yet cannot open a shell over the bound later)."""
    from datetime import timedelta

    from django.utils import timezone

    from tests.factories import make_config

    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "many-shells")
    url = reverse("sandboxes:terminal_create", kwargs={"session_id": session.id})
    most = 3
    tuned({"terminal.max_per_session": most})
    made = [world.client_for(who).post(url) for who in ("bob", "alice", "bob")]
    assert [response.status_code for response in made] == [201, 201, 201]
    refused = world.client_for("bob").post(url)
    assert refused.status_code == 429
    assert f"at most {most} shells" in refused.json()["error"]
    assert Terminal.objects.filter(session=session).count() == most
    # Re-ticketing one of them is no new shell.
    assert world.client_for("bob").post(url, {"terminal_id": made[0].json()["terminal_id"]}).status_code == 200
    Terminal.objects.filter(pk=made[1].json()["terminal_id"]).update(closed=timezone.now())
    assert world.client_for("bob").post(url).status_code == 201
    # Never redeemed and past its age: its place is free, and it cannot take one back.
    stale = made[0].json()["terminal_id"]
    Terminal.objects.filter(pk=stale).update(created=timezone.now() - timedelta(minutes=5))
    assert world.client_for("bob").post(url).status_code == 201
    assert world.client_for("bob").post(url, {"terminal_id": stale}).status_code == 429
    assert world.client_for("bob").post(url).status_code == 429
    # Another session has its own places.
    other = get_or_create_session(world.space_a, "other-shells")
    assert world.client_for("bob").post(reverse("sandboxes:terminal_create", args=[other.id])).status_code == 201


@pytest.mark.django_db
def test_a_backend_without_pty_shows_a_message(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandboxes.terminal import pages as views_terminal
    from tests.factories import make_config

    class NoPty:
        def pty(self) -> None:
            return None

    monkeypatch.setattr(views_terminal, "get_backend", lambda config: NoPty())
    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "nopty")
    page = world.client_for("bob").get(reverse("sandboxes:terminal_page", kwargs={"session_id": session.id}))
    assert b'id="terminal-unsupported"' in page.content
    assert b'id="terminal"' not in page.content
    create = world.client_for("bob").post(reverse("sandboxes:terminal_create", kwargs={"session_id": session.id}))
    assert create.status_code == 409


# --- Handshake refusals (no sandbox needed: refused before anything starts) ----------------


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("cleanup")
async def test_handshake_refusals(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.factories import make_config

    await sync_to_async(make_config)(world.space_a, is_default=True)
    session = await sync_to_async(get_or_create_session)(world.space_a, "refusals")
    bob_cookie = await sync_to_async(cookie_for)(world.bob)

    async def refused(comm: Any) -> int:
        connected, code = await comm.connect(timeout=10)
        await comm.disconnect()
        assert not connected
        return int(code)

    grant = await sync_to_async(new_ticket)(world.bob, session)
    tid = grant["terminal_id"]
    assert await refused(communicator(tid, None, bob_cookie)) == terminal_protocol.REFUSE_TICKET
    assert await refused(communicator(tid, "garbage", bob_cookie)) == terminal_protocol.REFUSE_TICKET
    assert await refused(communicator(tid, grant["ticket"], None)) == terminal_protocol.REFUSE_FORBIDDEN  # anonymous
    evil = (b"origin", b"https://evil.example")
    assert not (await communicator(tid, grant["ticket"], bob_cookie, origin=evil).connect(timeout=10))[0]
    charlie_cookie = await sync_to_async(cookie_for)(world.charlie)
    assert await refused(communicator(tid, grant["ticket"], charlie_cookie)) == terminal_protocol.REFUSE_FORBIDDEN

    # Expired: a ticket signed a minute ago.
    with monkeypatch.context() as patch:
        patch.setattr(signing.TimestampSigner, "timestamp", lambda self: signing.b62_encode(int(time.time()) - 60))
        terminal = await Terminal.objects.aget(pk=tid)
        old = await sync_to_async(terminals.issue_ticket)(terminal)
    assert await refused(communicator(tid, old, bob_cookie)) == terminal_protocol.REFUSE_TICKET

    # A ticket for another terminal.
    other = await sync_to_async(new_ticket)(world.bob, session)
    assert await refused(communicator(tid, other["ticket"], bob_cookie)) == terminal_protocol.REFUSE_FORBIDDEN

    # Another space's session: charlie's own (forged) terminal on a session of space A.
    forged = await Terminal.objects.acreate(session=session, user=world.charlie)
    forged_ticket = await sync_to_async(terminals.issue_ticket)(forged)
    assert (
        await refused(communicator(str(forged.id), forged_ticket, charlie_cookie)) == terminal_protocol.REFUSE_NOT_FOUND
    )
    # A viewer's terminal row is refused too (viewers cannot open shells).
    carol_terminal = await Terminal.objects.acreate(session=session, user=world.carol)
    carol_ticket = await sync_to_async(terminals.issue_ticket)(carol_terminal)
    carol_cookie = await sync_to_async(cookie_for)(world.carol)
    assert (
        await refused(communicator(str(carol_terminal.id), carol_ticket, carol_cookie))
        == terminal_protocol.REFUSE_FORBIDDEN
    )

    # Reused: the first use is refused here only after redeeming, so use a redeemed one.
    fresh = await sync_to_async(new_ticket)(world.bob, session, tid)
    await sync_to_async(terminals.admit)(world.bob, tid, fresh["ticket"])
    assert await refused(communicator(tid, fresh["ticket"], bob_cookie)) == terminal_protocol.REFUSE_TICKET
    assert not await AuditEvent.objects.filter(action="terminal.open").aexists()


# --- On a real sandbox ---------------------------------------------------------------------------


@pytest.mark.parametrize("_", [None])
@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_echo_resize_and_binary_safe_output(
    tuned: Tuned, world: World, session: Session, _: None, settings: Any
) -> None:
    # The plain shell's byte path (templates without tmux): tmux re-renders the screen, so a
    # kept shell's stream is not the program's bytes (tests/sandboxes/terminal/test_replicas.py).
    tuned({"terminal.keep_shells": False})
    comm, screen, _tid = await open_terminal(world.bob, session)
    await screen.run("echo hi-$((6*7))\n")
    await screen.until_output(b"hi-42")
    await comm.send_to(text_data=json.dumps({"type": "resize", "cols": 123, "rows": 45}))
    await asyncio.sleep(0.3)
    await screen.run("stty size\n")
    await screen.until_output(b"45 123")
    await comm.send_to(text_data=json.dumps({"type": "resize", "cols": 5000, "rows": 0}))  # clamped
    await asyncio.sleep(0.3)
    await screen.run("stty size\n")
    await screen.until_output(b"1 1000")
    await comm.send_to(text_data=json.dumps({"type": "resize", "cols": 100, "rows": 30}))
    # All 256 byte values, unmodified: output post-processing off while printing them.
    await screen.run(
        "stty -opost; printf '%s' '<<''BIN>>'; for i in $(seq 0 255); do printf \"\\\\$(printf %03o $i)\"; done;"
        " printf '%s' '<<''END>>'; stty opost\n"
    )
    await screen.until_output(b"<<END>>")
    start = screen.data.rindex(b"<<BIN>>") + len(b"<<BIN>>")
    assert screen.data[start : screen.data.rindex(b"<<END>>")] == bytes(range(256))
    # UTF-8 is carried as bytes: a multi-byte character arrives intact.
    await screen.run("printf '\\xe2\\x82\\xac\\n'\n")
    await screen.until_output("€".encode())
    await comm.disconnect(code=1000)


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_malformed_control_frames_get_errors_and_the_terminal_lives_on(world: World, session: Session) -> None:
    comm, screen, _tid = await open_terminal(world.bob, session)
    bad = ["not json", "[]", '{"type": 5}', "{}", '{"type": "resize", "cols": "a", "rows": 1}',
           '{"type": "resize", "cols": true, "rows": 2}', '{"type": "nope"}', "x" * 10000]  # fmt: skip
    for text in bad:
        await comm.send_to(text_data=text)
    await screen.until(lambda: sum(m["type"] == "error" for m in screen.controls) == len(bad), what="errors")
    await comm.send_to(text_data='{"type": "ping"}')
    await screen.until_control(type="pong")
    await comm.send_to(text_data='{"type": "pause"}')
    await comm.send_to(text_data='{"type": "resume"}')
    await screen.run("echo still-$((1+1))\n")
    await screen.until_output(b"still-2")
    await comm.disconnect(code=1000)


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_closing_ends_the_shell_and_is_audited(world: World, session: Session) -> None:
    comm, screen, tid = await open_terminal(world.bob, session)
    await screen.run("echo ready-$((2*2))\n")
    await screen.until_output(b"ready-4")
    assert await sync_to_async(shells_in)(session)
    await comm.disconnect(code=1000)
    await wait_no_shell(session)
    terminal = await wait_closed(tid)
    assert terminal.close_reason == "closed by the client"
    assert terminal.bytes_in > 0
    assert terminal.bytes_out > 0
    opened = await AuditEvent.objects.aget(action="terminal.open", target_id=tid)
    closed = await AuditEvent.objects.aget(action="terminal.close", target_id=tid)
    assert opened.actor_id == world.bob.pk
    assert closed.details["bytes_in"] == terminal.bytes_in
    assert closed.details["reason"] == "closed by the client"
    assert "duration_s" in closed.details
    assert "ready" not in json.dumps(closed.details)  # never the keystrokes


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_typing_never_waits_on_the_database_thread(world: World, session: Session) -> None:
    """Keystrokes and control frames go to the shell at once, even while the one thread that
    runs database work is busy (a slow query, a lease renewal): the echo path has no hop to it."""
    comm, screen, _tid = await open_terminal(world.bob, session)
    await screen.run("echo ready-$((3*3))\n")
    await screen.until_output(b"ready-9")
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait, thread_sensitive=True)(30))
    try:
        await asyncio.sleep(0.2)
        assert not busy.done()
        await screen.run("echo typed-$((6*7))\n")
        await screen.until_output(b"typed-42", timeout=10)
        await comm.send_to(text_data='{"type": "ping"}')
        await screen.until_control(type="pong")
        assert not busy.done()  # all of it while the thread was held
    finally:
        release.set()
        await busy
    await comm.disconnect(code=1000)


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_typing_into_a_shell_that_reads_nothing_never_blocks_the_event_loop(
    tuned: Tuned, world: World, session: Session
) -> None:
    """A program that never reads its raw-mode terminal fills the PTY and then the socket to
    the engine: keystrokes sent on meanwhile wait in the console, and the process's event loop
    (every other terminal and connection it serves) keeps answering; what waits is bounded."""
    tuned({"terminal.keep_shells": False})  # a plain shell: tmux would read the keys itself
    comm, screen, _tid = await open_terminal(world.bob, session)
    await screen.run("stty raw -echo; echo deaf-$((5*5)); sleep 100000\n")
    await screen.until_output(b"deaf-25")
    loop = asyncio.get_running_loop()
    blocked = threading.Event()
    done = threading.Event()

    def watchdog() -> None:
        # Off the loop: when the loop stops answering, note it and end the sleep that blocks it.
        while not done.is_set():
            answered = threading.Event()
            loop.call_soon_threadsafe(answered.set)
            if not answered.wait(5) and not done.is_set():
                blocked.set()
                Runtime().exec(session, ExecRequest(argv=("pkill", "-x", "sleep"), timeout_s=30))
                return
            time.sleep(0.2)

    guard = threading.Thread(target=watchdog, daemon=True)
    guard.start()
    try:
        for _ in range(3000):  # 3 MiB of keystroke-sized frames, far past every buffer
            await comm.send_to(bytes_data=b"k" * 1024)
        await comm.send_to(text_data='{"type": "ping"}')
        await screen.until_control(type="pong")
        # What waits is bounded: past MAX_QUEUED_INPUT, input is dropped and the client told so.
        for _ in range(MAX_QUEUED_INPUT // (64 * 1024)):  # pastes come in 64 KiB frames
            await comm.send_to(bytes_data=b"p" * 64 * 1024)
        dropped = await screen.until_control(type="error")
        assert "input dropped" in dropped["message"]
    finally:
        done.set()
        await sync_to_async(guard.join)(60)
    assert not blocked.is_set(), "the event loop was blocked writing to the shell"
    await comm.disconnect(code=1000)
    await wait_no_shell(session)  # the close ends the shell with a write still blocked on it


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_reconnect_reattaches_and_replays_missed_output(world: World, session: Session) -> None:
    comm, screen, tid = await open_terminal(world.bob, session)
    await screen.run("export MARK=kept-$((3*3)); (sleep 1; echo missed-$((5*5))) &\n")
    await screen.run("echo $MARK\n")
    await screen.until_output(b"kept-9")
    await comm.disconnect(code=1006)  # abnormal: the shell waits for a reattach
    await asyncio.sleep(2)  # "missed-25" is printed while nobody is attached
    grant = await sync_to_async(new_ticket)(world.bob, session, tid)
    assert grant["terminal_id"] == tid
    again = communicator(tid, grant["ticket"], await sync_to_async(cookie_for)(world.bob))
    connected, _ = await again.connect(timeout=10)
    assert connected
    replay = Screen(again)
    ready = await replay.until_control(type="status", state="ready")
    assert ready["reattached"] is True
    await replay.until_output(b"missed-25")
    assert b"kept-9" in replay.data  # what came before is replayed too
    await replay.run("echo $MARK-again\n")
    await replay.until_output(b"kept-9-again")  # the same shell
    await again.disconnect(code=1000)
    await wait_no_shell(session)


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_no_reattach_within_the_grace_window_ends_the_shell(
    tuned: Tuned, world: World, session: Session, settings: Any
) -> None:
    tuned({"terminal.reattach_s": 1})
    comm, screen, tid = await open_terminal(world.bob, session)
    await screen.run("echo up\n")
    await screen.until_output(b"up")
    await comm.disconnect(code=1006)
    await wait_no_shell(session)
    terminal = await wait_closed(tid)
    assert terminal.close_reason == "not reattached within the grace window"


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_idle_timeout_closes_with_a_message(tuned: Tuned, world: World, session: Session, settings: Any) -> None:
    tuned({"terminal.idle_timeout_s": 2})
    comm, screen, _tid = await open_terminal(world.bob, session)
    await screen.until(lambda: screen.closed_code is not None or False, timeout=15, what="idle close")
    assert screen.closed_code == terminal_protocol.CLOSE_IDLE
    closed = [m for m in screen.controls if m.get("state") == "closed"]
    assert "idle" in closed[0]["reason"]
    await comm.disconnect()
    await wait_no_shell(session)


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_logout_and_lost_access_close_terminals(world: World, session: Session) -> None:
    comm, screen, _tid = await open_terminal(world.bob, session)

    def log_out_bob() -> None:
        client = Client()
        client.force_login(world.bob)
        client.post(reverse("logout"))

    await sync_to_async(log_out_bob)()
    await screen.until(lambda: screen.closed_code is not None, what="close on logout")
    assert screen.closed_code == terminal_protocol.CLOSE_LOGGED_OUT
    await comm.disconnect()

    comm2, screen2, _tid2 = await open_terminal(world.bob, session)
    await Membership.objects.filter(user=world.bob, space=world.space_a).aupdate(role=Role.VIEWER)
    membership = await Membership.objects.aget(user=world.bob, space=world.space_a)
    await sync_to_async(membership.save)()  # signals fire on save
    await screen2.until(lambda: screen2.closed_code is not None, what="close on lost access")
    assert screen2.closed_code == terminal_protocol.CLOSE_ACCESS
    await comm2.disconnect()
    await wait_no_shell(session)


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_pause_stops_output_and_ctrl_c_returns_the_prompt(
    tuned: Tuned, world: World, session: Session, settings: Any
) -> None:
    # Flow control of a raw flood: a plain shell (tmux coalesces a flood into screen redraws).
    tuned({"terminal.keep_shells": False})
    comm, screen, _tid = await open_terminal(world.bob, session)
    await screen.run("yes\n")
    await screen.until(lambda: len(screen.data) > 1_000_000, what="a flood of y")
    await comm.send_to(text_data='{"type": "pause"}')
    await asyncio.sleep(0.5)
    while await screen.pump(0.05):
        pass
    paused_at = len(screen.data)
    await asyncio.sleep(1)
    while await screen.pump(0.05):
        pass
    assert len(screen.data) - paused_at < 64 * 1024  # nothing (or one read in flight) while paused
    await comm.send_to(text_data='{"type": "resume"}')
    await screen.until(lambda: len(screen.data) > paused_at + 1_000_000, what="output after resume")
    await screen.run("\x03")
    await asyncio.sleep(0.3)
    await screen.run("echo done-$((1+2))\n")
    started = time.monotonic()
    await screen.until_output(b"done-3", timeout=20)
    assert time.monotonic() - started < 10
    await comm.disconnect(code=1000)


# --- Holding on: the channel layer's blocking read, crashes, layer outages ---------------------


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_a_terminal_stays_open_idle_and_busy_past_the_layers_blocking_read(
    world: World, session: Session, layer: str
) -> None:
    """channels-redis blocks 5 s per read; with redis-py's 5 s socket timeout every consumer
    crashed (1011) about 5 s after it opened. Hold one open for 13 s, idle then busy."""
    comm, screen, tid = await open_terminal(world.bob, session)
    opened = time.monotonic()
    while time.monotonic() - opened < 7:  # idle: nothing but the layer's blocking reads
        await screen.pump(0.5)
        assert screen.closed_code is None, screen.controls
    await screen.run("for i in $(seq 1 5); do echo busy-$((i*11)); sleep 1; done\n")
    await screen.until_output(b"busy-55", timeout=15)
    while time.monotonic() - opened < 13:
        await screen.pump(0.5)
    assert screen.closed_code is None, screen.controls
    await screen.run("echo alive-$((6*7))\n")
    await screen.until_output(b"alive-42")
    await comm.send_to(text_data='{"type": "ping"}')
    await screen.until_control(type="pong")
    assert not [m for m in screen.controls if m.get("state") == "closed"]
    assert (await Terminal.objects.aget(pk=tid)).closed is None
    await comm.disconnect(code=1000)
    await wait_no_shell(session)


@pytest.mark.parametrize("how", ["cancelled by the server", "error in a handler"])
@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_a_crashed_connection_detaches_and_its_shell_ends_after_the_grace_window(
    tuned: Tuned, world: World, session: Session, settings: Any, layer: str, how: str
) -> None:
    """A connection that ends without a websocket.disconnect (its application cancelled, as
    Daphne does, or raising) used to leave its shell attached to nothing, running forever."""
    tuned({"terminal.reattach_s": 1})
    comm, screen, tid = await open_terminal(world.bob, session)
    await screen.run("echo up-$((2+3))\n")
    await screen.until_output(b"up-5")
    if how == "cancelled by the server":
        comm.future.cancel()
    else:  # an event no handler takes: AsyncConsumer.dispatch raises ValueError
        channel_layer = get_channel_layer()
        assert channel_layer is not None
        await channel_layer.group_send(terminal_access.user_group(world.bob.pk), {"type": "terminal.no_such_event"})
    await wait_no_shell(session)
    terminal = await wait_closed(tid)
    assert terminal.close_reason == "not reattached within the grace window"
    assert await AuditEvent.objects.filter(action="terminal.close", target_id=tid).aexists()
    with contextlib.suppress(BaseException):
        await comm.disconnect()


@pytest.mark.parametrize("layer", ["redis"], indirect=True)
@pytest.mark.redis
@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_a_channel_layer_outage_does_not_close_the_terminal(
    world: World, session: Session, settings: Any, own_redis: RedisServer
) -> None:
    """Redis (the layer's own server) killed while a terminal is open: the terminal works on;
    once Redis is back, the consumer is in its group again and control events reach it."""
    settings.CHANNEL_LAYERS = {"default": redis_channel_layer(own_redis.url)}
    comm, screen, tid = await open_terminal(world.bob, session)
    await sync_to_async(own_redis.stop)()
    await screen.run("echo during-$((4*4))\n")
    await screen.until_output(b"during-16")
    for _ in range(10):  # several failed layer reads and retries
        await screen.pump(0.3)
    assert screen.closed_code is None, screen.controls
    await sync_to_async(own_redis.start)()  # empty: the group membership is gone with it
    await asyncio.sleep(LAYER_RETRY_MAX_S + 1)  # the consumer's next retry re-joins the group
    await screen.run("echo after-$((5*5))\n")
    await screen.until_output(b"after-25")
    await sync_to_async(terminal_access.send_to_user_terminals)(
        world.bob.pk, {"type": "terminal.revoke", "reason": "logged out"}
    )
    await screen.until(lambda: screen.closed_code is not None, timeout=5, what="revoke after the outage")
    assert screen.closed_code == terminal_protocol.CLOSE_LOGGED_OUT
    await comm.disconnect()
    terminal = await wait_closed(tid)
    assert terminal.close_reason == "logged out"
    await wait_no_shell(session)


def test_the_redis_layers_read_timeout_is_well_above_its_blocking_read() -> None:
    """The invariant behind the 1011-every-5-s crash, for anyone who edits the layer config."""
    from channels_redis.core import RedisChannelLayer

    config: Any = redis_channel_layer("redis://127.0.0.1:6379/0")["CONFIG"]
    host = config["hosts"][0]
    assert host["socket_timeout"] is None or host["socket_timeout"] >= 2 * RedisChannelLayer.brpop_timeout
    assert host["health_check_interval"] > 0
