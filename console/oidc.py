"""Single sign-on with OpenID Connect (mozilla-django-oidc), on when OIDC_RP_CLIENT_ID is set.

Who signs in: the user already linked to the token's subject (OidcIdentity, per issuer);
else the one active user with the claimed email who has no subject at this issuer yet (the
subject is then stored, so the link holds when the email changes); else, with
sso.create_users, a new user. A user linked to one subject is never signed in as another
subject with the same email: that login fails. Links and creations are audited.

The provider's endpoints and ID token algorithm come from its discovery document
(`OIDC_OP_ISSUER/.well-known/openid-configuration`, OpenID Connect Discovery 1.0), read when a
sign-in starts and again at its callback: a sign-in is rare, so nothing is cached, and a
provider that moves an endpoint is followed without a restart. A document that cannot be read,
or names another issuer, fails the sign-in with a log line, never a 500. Every call to the
provider (discovery, token, userinfo, keys) finishes within OIDC_TIMEOUT in all (`fetch`); an ID
token must name the issuer and this client. SSO on without its secret or issuer stops the start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jwt
import requests
import requests.adapters
import urllib3
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured, PermissionDenied, SuspiciousOperation
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationRequestView

from .models import AuditAction, OidcIdentity, users_with_email
from .services import Actor, record_audit

logger = logging.getLogger(__name__)


def issuer() -> str:
    """The configured issuer without a trailing slash: the form links are stored under."""
    return str(settings.OIDC_OP_ISSUER).rstrip("/")


def issuer_forms() -> list[str]:
    """The issuer as a link may have been stored: with or without its trailing slash (a link
    made before the setting changed must still keep another subject off its user)."""
    return [issuer(), issuer() + "/"]


class DiscoveryFailed(Exception):
    """The provider's discovery document could not be read or does not fit (said in words)."""


# Preferred first; "none" is never accepted. HS* signs with the client secret. PS* is left out:
# mozilla-django-oidc 5.0.2 (auth.py, verify_token) fetches JWKS keys only for RS* and ES*, so a
# PS* token would be checked against the client secret and never verify.
SIGNING_ALGORITHMS = ("RS256", "ES256", "RS384", "RS512", "ES384", "ES512", "HS256")
# A discovery document is a few kilobytes; a larger answer is not one.
DOCUMENT_MAX_BYTES = 512 * 1024


class TooLarge(requests.RequestException):
    """The provider answered more than a document of its kind can be."""


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


def fetch(method: str, url: str, *, max_bytes: int = DOCUMENT_MAX_BYTES, **kwargs: Any) -> Answer:
    """One call to the provider, done within OIDC_TIMEOUT in all: requests' timeout bounds each
    wait for a byte, not the answer, so the read stops at the deadline whatever the pace (each
    wait is cut to the time left), and a watchdog shuts the socket at the deadline (a provider
    that drips its status line and headers is cut too). At most `max_bytes`; a redirect is not
    followed. Raises requests.Timeout past the deadline, requests.RequestException for the rest."""
    deadline = time.monotonic() + settings.OIDC_TIMEOUT
    late = f"{url} did not answer within {settings.OIDC_TIMEOUT} s"
    sockets: list[socket.socket] = []
    watchdog = threading.Timer(settings.OIDC_TIMEOUT, _shut_all, args=(sockets,))
    watchdog.daemon = True
    try:
        with requests.Session() as session:
            for prefix in ("http://", "https://"):
                session.mount(prefix, _WatchedAdapter(sockets.append))
            watchdog.start()
            with session.request(
                method, url, timeout=settings.OIDC_TIMEOUT, allow_redirects=False, stream=True, **kwargs
            ) as answer:
                body = bytearray()
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise requests.Timeout(late)
                    _wait_at_most(answer, left)
                    try:
                        # read1 returns what has arrived (iter_content would wait for a full chunk).
                        chunk = answer.raw.read1(65536, decode_content=True)
                    except (TimeoutError, urllib3.exceptions.ReadTimeoutError) as exc:
                        raise requests.Timeout(late) from exc
                    if not chunk:
                        break
                    body += chunk
                    if len(body) > max_bytes:
                        raise TooLarge(f"{url} answered more than {max_bytes} bytes")
                if time.monotonic() >= deadline:  # the watchdog ended the read: a cut answer
                    raise requests.Timeout(late)
                return Answer(answer.status_code, answer.headers.get("content-type", "").lower(), bytes(body))
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        if isinstance(exc, requests.Timeout) or time.monotonic() < deadline:
            raise
        raise requests.Timeout(late) from exc
    finally:
        watchdog.cancel()


class _WatchedAdapter(requests.adapters.HTTPAdapter):
    """Hands each socket it opens to `watch` (fetch's watchdog shuts it at the deadline)."""

    def __init__(self, watch: Callable[[socket.socket], None]) -> None:
        super().__init__()
        self._watch = watch

    def get_connection_with_tls_context(self, *args: Any, **kwargs: Any) -> Any:
        pool = super().get_connection_with_tls_context(*args, **kwargs)
        watch, base = self._watch, pool.ConnectionCls

        class Watched(base):  # type: ignore[misc,valid-type]
            def connect(self) -> None:
                super().connect()
                watch(self.sock)

        pool.ConnectionCls = Watched
        return pool


def _shut_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):  # closed already
            sock.shutdown(socket.SHUT_RDWR)


def _wait_at_most(answer: requests.Response, seconds: float) -> None:
    """Cut the socket's wait for the next bytes to `seconds` (urllib3 keeps its socket there)."""
    sock = getattr(getattr(answer.raw, "_connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(max(seconds, 0.001))


def _read_document(url: str) -> Any:
    """The discovery document's JSON, read within OIDC_TIMEOUT in all (`fetch`), at most
    DOCUMENT_MAX_BYTES, and not followed through a redirect: the document must come from the
    issuer itself (Discovery 1.0, section 4)."""
    try:
        answer = fetch("GET", url, headers={"Accept": "application/json"})
    except requests.Timeout as exc:
        raise DiscoveryFailed(f"the discovery document at {url} was not read in time") from exc
    except TooLarge as exc:
        raise DiscoveryFailed(f"the discovery document at {url} is larger than {DOCUMENT_MAX_BYTES} bytes") from exc
    except requests.RequestException as exc:
        raise DiscoveryFailed(f"the discovery document at {url} could not be read: {exc}") from exc
    if 300 <= answer.status < 400:
        raise DiscoveryFailed(f"the discovery document at {url} is a redirect, which is not followed")
    if answer.status != 200:
        raise DiscoveryFailed(f"the discovery document at {url} could not be read: it answered {answer.status}")
    try:
        return json.loads(answer.body)
    except ValueError as exc:
        raise DiscoveryFailed(f"the discovery document at {url} could not be read: {exc}") from exc


def _json(answer: Answer, what: str) -> Any:
    if answer.status != 200:
        raise requests.HTTPError(f"the provider's {what} answered {answer.status}")
    document = json.loads(answer.body)
    if not isinstance(document, dict):  # mozilla-django-oidc reads it with .get()
        raise ValueError(f"the provider's {what} answered JSON that is not an object")
    return document


def check_sso_settings() -> None:
    """At start: single sign-on on (OIDC_RP_CLIENT_ID set) needs its client secret and issuer."""
    if not settings.OIDC_ENABLED:
        return
    missing = [name for name in ("OIDC_RP_CLIENT_SECRET", "OIDC_OP_ISSUER") if not getattr(settings, name)]
    if missing:
        raise ImproperlyConfigured(
            f"Single sign-on is on (OIDC_RP_CLIENT_ID is set) but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: set {'it' if len(missing) == 1 else 'them'}, "
            'or unset OIDC_RP_CLIENT_ID (docs/security.md, "Single sign-on").'
        )


def _is_url(value: object) -> bool:
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def discover() -> dict[str, str]:
    """The endpoints and ID token algorithm from the issuer's discovery document."""
    url = issuer() + "/.well-known/openid-configuration"
    document = _read_document(url)
    if not isinstance(document, dict):
        raise DiscoveryFailed(f"the discovery document at {url} is not a JSON object")
    # Discovery 1.0, section 4.3: the document's issuer must be the one configured.
    named = document.get("issuer")
    if not isinstance(named, str) or named.rstrip("/") != issuer():
        raise DiscoveryFailed(f"the discovery document at {url} names issuer {str(named)[:200]!r}")
    names = ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")
    missing = [name for name in names if not isinstance(document.get(name), str) or not document[name]]
    if missing:
        raise DiscoveryFailed(f"the discovery document at {url} has no {', '.join(missing)}")
    for name in names:
        if not _is_url(document[name]):
            raise DiscoveryFailed(f"the discovery document at {url}: {name} is not an http(s) URL")
    offered = document.get("id_token_signing_alg_values_supported") or ["RS256"]
    if not isinstance(offered, list):
        offered = []  # not a list of names, so no name in it is offered
    algorithm = next((alg for alg in SIGNING_ALGORITHMS if alg in offered), None)
    if algorithm is None:
        shown = str(document.get("id_token_signing_alg_values_supported"))[:200]
        raise DiscoveryFailed(f"the provider signs ID tokens with {shown}, none of {list(SIGNING_ALGORITHMS)}")
    return {**{name: str(document[name]) for name in names}, "algorithm": algorithm}


class ConsoleOIDCRequestView(OIDCAuthenticationRequestView):
    """The start of a sign-in: the redirect to the provider's authorization endpoint."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)  # the View's own
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    def get(self, request: HttpRequest) -> HttpResponse:
        try:
            self.OIDC_OP_AUTH_ENDPOINT = discover()["authorization_endpoint"]
        except DiscoveryFailed as exc:
            logger.warning("single sign-on could not start: %s", exc, extra={"action": "oidc_discovery"})
            return HttpResponseRedirect(settings.LOGIN_REDIRECT_URL_FAILURE)
        return super().get(request)


class ConsoleOIDCBackend(OIDCAuthenticationBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The endpoints are read at the callback (`authenticate`), not for every password login.
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.UserModel = get_user_model()

    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        # Only the callback view passes `nonce` (mozilla_django_oidc/views.py, after it checked
        # the state against the session). A password login reaches here too, with whatever query
        # its URL has: `?code=&state=` there must not send a token request to the provider.
        if request is None or "nonce" not in kwargs or "password" in kwargs:
            return None
        if not request.GET.get("code") or not request.GET.get("state"):
            return None
        try:
            found = discover()
        except DiscoveryFailed as exc:
            logger.warning("single sign-on failed: %s", exc, extra={"action": "oidc_discovery"})
            return None
        self.OIDC_OP_TOKEN_ENDPOINT = found["token_endpoint"]
        self.OIDC_OP_USER_ENDPOINT = found["userinfo_endpoint"]
        self.OIDC_OP_JWKS_ENDPOINT = found["jwks_uri"]
        self.OIDC_RP_SIGN_ALGO = found["algorithm"]
        try:
            return super().authenticate(request, **kwargs)
        except (
            requests.RequestException,
            SuspiciousOperation,
            jwt.PyJWTError,
            ValueError,
            KeyError,
            IntegrityError,
        ) as exc:
            # A code the provider refuses (a forged callback), a provider that is down, a token
            # that does not verify, a first sign-in racing another for the same name: the sign-in
            # fails with a log line, never a 500.
            logger.warning("single sign-on failed: %s", str(exc)[:500], extra={"action": "oidc_token"})
            return None

    # The provider's answers, each read within OIDC_TIMEOUT in all (`fetch`), not per byte.

    def get_token(self, payload: dict[str, Any]) -> Any:
        return _json(fetch("POST", self.OIDC_OP_TOKEN_ENDPOINT, data=payload), "token endpoint")

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        answer = fetch("GET", self.OIDC_OP_USER_ENDPOINT, headers={"Authorization": f"Bearer {access_token}"})
        if answer.status == 200 and answer.content_type.startswith("application/jwt"):
            return self.verify_signed(answer.body.decode())  # signed claims: checked like the ID token
        return _json(answer, "userinfo endpoint")

    def retrieve_matching_jwk(self, token: str) -> Any:
        keys = _json(fetch("GET", self.OIDC_OP_JWKS_ENDPOINT), "JWKS endpoint").get("keys")
        keys = keys if isinstance(keys, list) else []
        header = jwt.get_unverified_header(token)
        # As mozilla-django-oidc picks it: the key id must match, and the algorithm if the key names one.
        matching = [
            key
            for key in keys
            if isinstance(key, dict)
            and key.get("kid") == header.get("kid")
            and key.get("alg", header["alg"]) == header["alg"]
        ]
        if not matching:
            raise SuspiciousOperation("Could not find a valid JWKS.")
        return jwt.PyJWK(matching[-1])

    def verify_token(self, token: str, **kwargs: Any) -> Any:
        """The ID token: signed for this client (`verify_signed`) and with an expiry (`exp` is
        required by OpenID Connect Core 1.0, 2; PyJWT checks it only when present)."""
        payload = self.verify_signed(token, **kwargs)
        if "exp" not in payload:
            raise SuspiciousOperation("the ID token has no expiry (exp)")
        return payload

    def verify_signed(self, token: str, **kwargs: Any) -> Any:
        """The signature and nonce (mozilla-django-oidc), then who issued it and for whom (OpenID
        Connect Core 1.0, 3.1.3.7): `iss` is the configured issuer, `aud` names this client, and
        a token for several audiences names this client as its `azp`. Signed userinfo (5.3.2)
        is checked the same way; it need not expire."""
        payload = super().verify_token(token, **kwargs)
        if str(payload.get("iss", "")).rstrip("/") != issuer():
            raise SuspiciousOperation(f"the ID token was issued by {str(payload.get('iss'))[:200]!r}, not the issuer")
        audience = payload.get("aud")
        audiences = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("the ID token is not for this client (aud)")
        if len(audiences) > 1 and payload.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("the ID token names several audiences and another party (azp)")
        return payload

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        if not claims.get("sub") or not claims.get("email") or not isinstance(claims["email"], str):
            return False
        verified = claims.get("email_verified")
        if verified is None:  # not said: the provider's emails are trusted
            return True
        if isinstance(verified, str):  # some providers send "true"/"false"
            return verified.strip().lower() == "true"
        return verified is True

    def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet[Any]:
        model = get_user_model()
        linked = OidcIdentity.objects.filter(issuer__in=issuer_forms(), subject=claims["sub"]).values("user")
        if linked.exists():
            return model.objects.filter(pk__in=linked)
        by_email = model.objects.filter(email__iexact=claims["email"])
        if by_email.filter(oidc_identities__issuer__in=issuer_forms()).exists():
            # The email belongs to a user signed in by another subject: never merge.
            raise PermissionDenied("this email is linked to another OpenID Connect subject")
        if by_email.count() > 1:
            raise PermissionDenied("several users have this email")
        return by_email

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        if not OidcIdentity.objects.filter(user=user, issuer__in=issuer_forms()).exists():
            do_link_oidc_identity(user, subject=claims["sub"], source_ip=_ip(self))
        return user

    def create_user(self, claims: dict[str, Any]) -> Any:
        return do_create_oidc_user(claims, source_ip=_ip(self))


# --- Services: the writes a sign-in makes, each audited ------------------------------------


def do_link_oidc_identity(user: Any, *, subject: str, source_ip: str | None) -> OidcIdentity:
    """Link `user` to the token's subject at this issuer (a sign-in matched by email)."""
    with transaction.atomic():
        identity = OidcIdentity.objects.create(user=user, issuer=issuer(), subject=subject)
        record_audit(
            Actor(user=user, source_ip=source_ip),
            AuditAction.USER_OIDC_LINK,
            target_type="user",
            target_id=user.pk,
            target_name=user.get_username(),
            details={"username": user.get_username(), "issuer": issuer(), "subject": subject},
        )
    return identity


def do_create_oidc_user(claims: dict[str, Any], *, source_ip: str | None) -> Any:
    """Create the user a first sign-in names (sso.create_users), linked to its subject. When
    another request created a user with this email in the meantime (the unique email index
    refuses ours), sign in as that user, linked, as a sign-in matched by email would."""
    model = get_user_model()
    base = (_text(claims, "preferred_username") or claims["email"].split("@")[0])[:140]
    username, n = base, 1
    while model.objects.filter(username__iexact=username).exists():
        n += 1
        username = f"{base}-{n}"
    try:
        with transaction.atomic():
            user = model(username=username, email=claims["email"], first_name=_text(claims, "given_name")[:150])
            user.last_name = _text(claims, "family_name")[:150]
            user.set_unusable_password()
            user.save()
            OidcIdentity.objects.create(user=user, issuer=issuer(), subject=claims["sub"])
            record_audit(
                Actor(user=user, source_ip=source_ip),
                AuditAction.USER_CREATE,
                target_type="user",
                target_id=user.pk,
                target_name=user.get_username(),
                details={"username": username, "email": user.email, "oidc_subject": claims["sub"], "issuer": issuer()},
            )
    except IntegrityError:
        # The user a sign-in matched by email would be (as filter_users_by_claims, iexact), not
        # any the index deems equal: an address that only lowers alike is not linked to it.
        winner = model.objects.filter(email__iexact=claims["email"]).first()
        if winner is None:
            if users_with_email(claims["email"]).exists():  # equal only as the index lowers it
                raise PermissionDenied("another user has an email equal to this one but for its letters") from None
            raise  # the username was taken meanwhile: authenticate() fails the sign-in cleanly
        identities = OidcIdentity.objects.filter(user=winner, issuer__in=issuer_forms())
        if identities.exclude(subject=claims["sub"]).exists():  # as filter_users_by_claims: never merge
            raise PermissionDenied("this email is linked to another OpenID Connect subject") from None
        if not identities.exists():
            do_link_oidc_identity(winner, subject=claims["sub"], source_ip=source_ip)
        return winner
    return user


def _text(claims: dict[str, Any], name: str) -> str:
    """A claim that is text, else "" (providers send null, and JSON allows any type)."""
    value = claims.get(name)
    return value if isinstance(value, str) else ""


def _ip(backend: Any) -> str | None:
    request = getattr(backend, "request", None)
    return request.META.get("REMOTE_ADDR") if request is not None else None
