"""Inbound traffic of sessions: the URLs of a session's sandbox ports, signed links for
browsers, and what a request to the console's inbound route may reach.

The route's ASGI proxy (`sandboxes/inbound/proxy.py`) asks `inbound_target` which session a
sandbox id belongs to and with which token; only once a credential matched does it ask
`inbound_upstream` for the sandbox's own address (an engine call). Links are signed with the
console's SECRET_KEY and bound to the session's current token, so a rebuilt sandbox (new id,
new token) invalidates every link of the old one.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from dataclasses import dataclass
from urllib.parse import quote

from django.core import signing
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from console.crypto import decrypt
from console.models import AuditAction, NetworkPolicy
from console.services import Actor, ServiceError, record_audit

from ..backends.base import RemoteError
from ..backends.capabilities import InboundCapability
from ..catalog.bridge import get_backend
from ..models import Session
from ..sessions.runtime import ACTIVITY_WRITE_INTERVAL
from ..sessions.tuning import SESSIONS
from .hosts import host_url, read_label, shared_domain

LINK_SALT = "sandboxes.inbound.link"
LINK_PARAM = "_console_link"
COOKIE_NAME = "console_inbound"


@dataclass(frozen=True)
class InboundTarget:
    """One sandbox port as the route sees it, before any credential was checked."""

    session_id: uuid.UUID
    space_id: uuid.UUID
    space_name: str
    sandbox_id: str
    port: int
    token: str  # the session's traffic token, to compare with what the request brings
    inbound_on: bool  # the space's inbound switch, now


@dataclass(frozen=True)
class InboundUrl:
    port: int
    url: str  # absolute (a host of its own, or the backend's), or a path on the console's own origin
    token_header: str
    signed_links: bool  # the console's route serves it (and takes signed links)


def session_inbound(session: Session) -> InboundCapability | None:
    """The inbound capability of the session's backend (None: the backend has none)."""
    return get_backend(session.config).inbound()


def inbound_url(session: Session, port: int) -> InboundUrl:
    """The URL of `port` of the session's current sandbox; ServiceError when there is none."""
    if not session.sandbox_id:
        raise ServiceError("The session has no sandbox yet: start a turn (resolve) first.")
    check_port(port)
    inbound = session_inbound(session)
    if inbound is None:
        raise ServiceError("This session's backend serves no inbound URLs.")
    url = inbound.public_url(session.sandbox_id, port)
    domain = shared_domain() if inbound.served_by_console else None
    if domain is not None:  # a host of its own for this sandbox port (inbound_hosts.py)
        url = host_url(domain, session.id, session.sandbox_id, port)
    return InboundUrl(
        port=port,
        url=url,
        token_header=inbound.token_header,
        signed_links=inbound.served_by_console,
    )


def check_port(port: object) -> int:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ServiceError("A port is a whole number from 1 to 65535.", field_errors={"port": ["1-65535"]})
    return port


def inbound_on(space_id: uuid.UUID | str) -> bool:
    policy = NetworkPolicy.objects.filter(space_id=space_id).only("allow_public_traffic").first()
    return bool(policy and policy.allow_public_traffic)


# --- Signed links ------------------------------------------------------------------------


def token_tag(token: str) -> str:
    """A short, one-way tag of the session's token: links name it, never the token itself."""
    return hmac.new(token.encode(), b"inbound-link", hashlib.sha256).hexdigest()[:24]


def sign_link(sandbox_id: str, port: int, token: str, expires_at: int) -> str:
    payload = {"s": sandbox_id, "p": port, "t": token_tag(token), "e": expires_at}
    return signing.dumps(payload, salt=LINK_SALT)


class LinkExpired(Exception):
    pass


def check_link(value: str, target: InboundTarget, *, now: float | None = None) -> int | None:
    """The expiry of a valid link (or cookie) for `target`; None when it is not one of its
    links. A genuine one past its expiry raises LinkExpired (its holder may be told)."""
    try:
        payload = signing.loads(value, salt=LINK_SALT)
    except signing.BadSignature:
        return None
    if not isinstance(payload, dict) or not target.token:
        return None
    if payload.get("s") != target.sandbox_id or payload.get("p") != target.port:
        return None
    if not hmac.compare_digest(str(payload.get("t", "")), token_tag(target.token)):
        return None
    expires_at = payload.get("e")
    if not isinstance(expires_at, int):
        return None
    if expires_at <= (time.time() if now is None else now):
        raise LinkExpired
    return expires_at


def do_issue_inbound_link(session: Session, port: int, ttl_s: int, *, actor: Actor) -> tuple[str, int]:
    """A signed link to `port` of the session's sandbox for a browser (which then keeps a
    cookie for that URL's path until the expiry). Audited: a link is a credential."""
    check_port(port)
    if not 60 <= ttl_s <= SESSIONS.inbound_link_max_ttl_s:
        raise ServiceError(
            f"A link lasts from 1 minute to {SESSIONS.inbound_link_max_ttl_s // 60} minutes.",
            field_errors={"ttl": ["out of range"]},
        )
    url = inbound_url(session, port)
    if not url.signed_links:
        raise ServiceError("This session's backend serves its URLs itself: use the traffic token header.")
    if not inbound_on(session.space_id):
        raise ServiceError("Inbound traffic is off for this space: an admin turns it on in its network policy.")
    token = decrypt(session.traffic_token_encrypted)
    if not token:
        raise ServiceError("The session's sandbox has no traffic token: rebuild the session.")
    expires_at = int(time.time()) + ttl_s
    link = f"{url.url}?{LINK_PARAM}={quote(sign_link(session.sandbox_id, port, token, expires_at), safe='')}"
    with transaction.atomic():
        record_audit(
            actor,
            AuditAction.SESSION_INBOUND_LINK,
            space=session.space,
            target_type="session",
            target_id=session.id,
            target_name=session.key,
            details={"sandbox_id": session.sandbox_id, "port": port, "expires_at": expires_at},
        )
    return link, expires_at


# --- What the route asks -----------------------------------------------------------------


def inbound_target(sandbox_id: str, port: int) -> InboundTarget | None:
    """The session whose current sandbox is `sandbox_id`, with its token and switch; None when
    no session has it, its backend's URLs are not the console's, or it has no token."""
    session = Session.objects.select_related("space", "config__backend").filter(sandbox_id=sandbox_id).first()
    return _target_of(session, port) if session is not None else None


def inbound_target_at(label: str, port: int) -> InboundTarget | None:
    """The target a host label names (`<label>-<port>.<inbound domain>`): its session's
    current sandbox, when the label is one of ours and was made for that sandbox; else None."""
    reads = read_label(label)  # under the current key and each fallback: one query for all
    sessions = Session.objects.select_related("space", "config__backend").filter(pk__in=[r.session_id for r in reads])
    by_id = {session.id: session for session in sessions}
    for read in reads:
        session = by_id.get(read.session_id)
        if session is not None and read.matches(session.id, session.sandbox_id):
            return _target_of(session, port)
    return None


def _target_of(session: Session, port: int) -> InboundTarget | None:
    sandbox_id = session.sandbox_id
    token = decrypt(session.traffic_token_encrypted)
    if not token:
        return None
    inbound = session_inbound(session)
    if inbound is None or not inbound.served_by_console:
        return None
    return InboundTarget(
        session_id=session.id,
        space_id=session.space_id,
        space_name=session.space.name,
        sandbox_id=sandbox_id,
        port=port,
        token=token,
        inbound_on=inbound_on(session.space_id),
    )


def inbound_upstream(target: InboundTarget) -> tuple[str, int]:
    """The sandbox's own address for the target's port, from the engine, after checking that
    the sandbox still carries the session's token (a rebound session's old id goes nowhere).
    Raises RemoteError (conflict: not running; not_found: gone)."""
    session = Session.objects.select_related("config__backend").filter(pk=target.session_id).first()
    if session is None:
        raise RemoteError("not_found", "the session was deleted")
    inbound = session_inbound(session)
    if inbound is None:
        raise RemoteError("not_found", "the session's backend serves no inbound URLs")
    label = inbound.traffic_token(target.sandbox_id) or ""
    if not hmac.compare_digest(label.encode(), target.token.encode()):
        raise RemoteError("not_found", "the sandbox is no longer the session's")
    return inbound.console_upstream(target.sandbox_id, target.port)


# Measured (bench/module_caches.py): the check 5 us, the conditional UPDATE it spares 619 us a request.
_touched: dict[uuid.UUID, float] = {}


def activity_due(target: InboundTarget) -> bool:
    """Whether this process has not recorded the session's inbound activity lately (no I/O)."""
    interval = ACTIVITY_WRITE_INTERVAL.total_seconds()
    return time.monotonic() - _touched.get(target.session_id, -interval) >= interval


def touch_inbound_activity(target: InboundTarget) -> None:
    """Traffic to a sandbox port is activity: the idle sweep leaves a served sandbox alone.
    One conditional write per session and activity interval (and per process)."""
    if not activity_due(target):
        return
    if len(_touched) > 10_000:
        _touched.clear()
    _touched[target.session_id] = time.monotonic()
    moment = timezone.now()
    Session.objects.filter(pk=target.session_id).filter(
        Q(last_activity__isnull=True) | Q(last_activity__lt=moment - ACTIVITY_WRITE_INTERVAL)
    ).update(last_activity=moment)
