"""Revocation at commit: a user's terminals close within 1 s of the commit that takes their
access away, on PostgreSQL and on both channel layers.

Each trigger runs through the real write path in a thread of its own and keeps its
transaction open for a moment after the change: a re-check sent inside the transaction
(what the signals did before) reads the old state there and lets the terminal run on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.sessions.models import Session as LoginSession
from django.db import transaction
from django.test import Client
from django.urls import reverse

from console.models import AuditEvent, Membership, Role
from console.services import Actor, do_change_member_role, do_logout_everywhere, do_remove_member
from sandboxes.models import Session, Terminal
from sandboxes.terminal import access as terminal_access
from sandboxes.terminal import protocol as terminal_protocol
from sandboxes.terminal import tickets as terminals
from tests.personas import World
from tests.support import terminal_support
from tests.support.terminal_support import open_terminal, wait_closed, wait_no_shell
from tests.support.tuning import Tuned

layer = terminal_support.layer
store = terminal_support.store
session = terminal_support.session
fast_terminals = terminal_support.fast_terminals
cleanup = terminal_support.cleanup
own_redis = terminal_support.own_redis

HOLD_OPEN_S = 0.5  # the transaction stays open this long after the change
CLOSE_WITHIN_S = 1.0


def downgrade_role(world: World) -> None:
    membership = Membership.objects.get(user=world.bob, space=world.space_a)
    do_change_member_role(membership, role=Role.VIEWER, actor=Actor(user=world.alice))


def remove_membership(world: World) -> None:
    membership = Membership.objects.get(user=world.bob, space=world.space_a)
    do_remove_member(membership, actor=Actor(user=world.alice))


def deactivate(world: World) -> None:
    bob = type(world.bob).objects.get(pk=world.bob.pk)
    bob.is_active = False
    bob.save()


def change_password(world: World) -> None:
    bob = type(world.bob).objects.get(pk=world.bob.pk)
    bob.set_password("a-new-password-for-bob")
    bob.save()


def logout_everywhere(world: World) -> None:
    do_logout_everywhere(world.bob, actor=Actor(user=world.bob))


def deactivate_from_users_page(world: World) -> None:
    from console.users import do_deactivate_user

    do_deactivate_user(type(world.bob).objects.get(pk=world.bob.pk), actor=Actor(user=world.root))


TRIGGERS: dict[str, tuple[Callable[[World], None], int, str]] = {
    "role downgrade": (downgrade_role, terminal_protocol.CLOSE_ACCESS, "member role"),
    "membership removal": (remove_membership, terminal_protocol.CLOSE_ACCESS, "no longer a member"),
    "deactivation": (deactivate, terminal_protocol.CLOSE_ACCESS, "deactivated"),
    "deactivation on the Users page": (deactivate_from_users_page, terminal_protocol.CLOSE_ACCESS, "deactivated"),
    "password change": (change_password, terminal_protocol.CLOSE_LOGGED_OUT, "password"),
    "logout everywhere": (logout_everywhere, terminal_protocol.CLOSE_LOGGED_OUT, "logged out everywhere"),
}


def commit_slowly(world: World, change: Callable[[World], None]) -> float:
    """Run the change in a transaction held open a moment; the monotonic time of the commit."""
    with transaction.atomic():
        change(world)
        time.sleep(HOLD_OPEN_S)
    return time.monotonic()


@pytest.mark.parametrize("trigger", list(TRIGGERS))
@pytest.mark.postgres
@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_loss_of_access_closes_the_terminal_within_a_second_of_the_commit(
    world: World, session: Session, layer: str, trigger: str
) -> None:
    change, code, reason = TRIGGERS[trigger]
    comm, screen, tid = await open_terminal(world.bob, session)
    await screen.run("echo before-$((3*3))\n")
    await screen.until_output(b"before-9")
    # Not thread-sensitive: the consumer's own database calls must be free to run meanwhile.
    committed = await sync_to_async(commit_slowly, thread_sensitive=False)(world, change)
    await screen.until(lambda: screen.closed_code is not None, timeout=5, what=f"close on {trigger}")
    elapsed = time.monotonic() - committed
    assert screen.closed_code == code
    assert elapsed < CLOSE_WITHIN_S, f"closed {elapsed:.2f} s after the commit"
    closed = [m for m in screen.controls if m.get("state") == "closed"]
    assert reason in closed[0]["reason"], closed
    await comm.disconnect()
    terminal: Terminal = await wait_closed(tid)
    assert reason in terminal.close_reason
    assert await AuditEvent.objects.filter(action="terminal.close", target_id=tid).aexists()
    await wait_no_shell(session)


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_a_users_other_changes_leave_the_terminal_open(world: World, session: Session, layer: str) -> None:
    """A login elsewhere (last_login stamp), a name change, a role upgrade: no close."""
    comm, screen, tid = await open_terminal(world.bob, session)

    def harmless() -> None:
        Client().force_login(world.bob)  # another login session; stamps last_login
        bob = type(world.bob).objects.get(pk=world.bob.pk)
        bob.first_name = "Robert"
        bob.save()
        membership = Membership.objects.get(user=world.bob, space=world.space_a)
        do_change_member_role(membership, role=Role.ADMIN, actor=Actor(user=world.alice))

    await sync_to_async(harmless)()
    for _ in range(10):
        await screen.pump(0.1)
    assert screen.closed_code is None, screen.controls
    await screen.run("echo still-$((2*4))\n")
    await screen.until_output(b"still-8")
    assert (await Terminal.objects.aget(pk=tid)).closed is None
    await comm.disconnect(code=1000)


@pytest.mark.django_db
def test_log_out_everywhere_ends_every_login_session_and_is_audited(world: World) -> None:
    here, elsewhere, other_user = Client(), Client(), Client()
    here.force_login(world.bob)
    elsewhere.force_login(world.bob)
    other_user.force_login(world.alice)
    page = here.get(reverse("console:dashboard"))
    assert b'id="logout-everywhere"' in page.content
    assert reverse("console:logout_everywhere").encode() in page.content
    assert here.get(reverse("console:logout_everywhere")).status_code == 405  # a GET changes nothing
    response = here.post(reverse("console:logout_everywhere"))
    assert response.status_code == 302
    assert response["Location"] == reverse("login")
    for client in (here, elsewhere):
        assert client.get(reverse("console:dashboard")).status_code == 302  # to the login page
    assert other_user.get(reverse("console:dashboard")).status_code == 200
    event = AuditEvent.objects.get(action="user.logout_everywhere")
    assert (event.actor, event.target_id, event.details["sessions_ended"]) == (world.bob, str(world.bob.pk), 2)
    assert LoginSession.objects.count() == 1  # alice's
    anonymous = Client().post(reverse("console:logout_everywhere"))
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith(reverse("login"))
    assert AuditEvent.objects.filter(action="user.logout_everywhere").count() == 1


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_a_detached_terminals_shell_ends_when_access_is_lost(
    tuned: Tuned, world: World, session: Session, settings: Any, layer: str
) -> None:
    """A shell waiting in its grace window (no connection to tell) is re-checked by its
    keepalive too, instead of running on for the whole window."""
    tuned({"terminal.reattach_s": 120})
    tuned({"terminal.keepalive_s": 1})
    comm, screen, tid = await open_terminal(world.bob, session)
    await screen.run("echo up\n")
    await screen.until_output(b"up")
    await comm.disconnect(code=1006)  # abnormal: detached, waiting for a reattach
    await sync_to_async(downgrade_role)(world)
    terminal = await wait_closed(tid, timeout=10)
    assert "member role" in terminal.close_reason
    await wait_no_shell(session)


@pytest.mark.postgres
@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals", "cleanup")
async def test_a_downgrade_committed_mid_handshake_closes_the_reattached_terminal(
    world: World, session: Session, layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The downgrade commits after the ticket was redeemed but before the new connection
    joined the user's group: its re-check event reaches nobody (the shell is detached, in
    its grace window) and the shell's own keepalive re-checks only every 30 s."""
    from sandboxes.terminal import consumer as consumers

    comm, screen, tid = await open_terminal(world.bob, session)
    await screen.run("echo up\n")
    await screen.until_output(b"up")
    await comm.disconnect(code=1006)  # detached, waiting for a reattach
    grant = await sync_to_async(terminal_support.new_ticket)(world.bob, session, tid)
    real_admit = consumers.admit

    def admit_then_downgrade(*args: Any, **kwargs: Any) -> terminals.Grant:
        admitted = real_admit(*args, **kwargs)
        downgrade_role(world)  # committed here, before the consumer is in its group
        return admitted

    monkeypatch.setattr(consumers, "admit", admit_then_downgrade)
    again = terminal_support.communicator(
        tid, grant["ticket"], await sync_to_async(terminal_support.cookie_for)(world.bob)
    )
    connected, code = await again.connect(timeout=10)
    started = time.monotonic()
    if connected:
        screen = terminal_support.Screen(again)
        with pytest.raises(AssertionError):
            await screen.until(lambda: False, timeout=CLOSE_WITHIN_S, what="the close")
        assert screen.closed_code is not None, "the reattached terminal stayed open after the downgrade"
        await again.disconnect()
    else:
        assert code == terminal_protocol.CLOSE_ACCESS
    terminal = await wait_closed(tid, timeout=5)
    assert time.monotonic() - started < CLOSE_WITHIN_S + 1
    assert "member role" in terminal.close_reason
    await wait_no_shell(session)


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_hung_channel_layer_does_not_hold_up_the_change(
    world: World, settings: Any, own_redis: terminal_support.RedisServer
) -> None:
    """The layer's Redis accepts connections but answers nothing (stopped): the request
    that downgrades a member waited for the notification for minutes (the read timeout
    times the retries). The keepalive re-check is the fallback for a lost notification."""
    import os
    import signal

    settings.CHANNEL_LAYERS = {"default": terminal_support.redis_channel_layer(own_redis.url)}
    assert own_redis.process is not None
    os.kill(own_redis.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        downgrade_role(world)
        elapsed = time.monotonic() - started
    finally:
        os.kill(own_redis.process.pid, signal.SIGCONT)
    assert Membership.objects.get(user=world.bob, space=world.space_a).role == Role.VIEWER
    assert elapsed < terminal_access.NOTIFY_TIMEOUT_S + 2, f"the downgrade took {elapsed:.1f} s"
