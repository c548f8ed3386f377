"""Single sign-on against a real OpenID Connect provider run on 127.0.0.1.

The provider is django-oidc-provider in its own small project (tests/oidc_provider, its own
SQLite database), started as a subprocess on a free loopback port with the console registered
as a confidential client. A requests session drives the authorization-code flow against the
console's live server: "Sign in with ...", the provider's login, its consent page, the
callback (the console then calls the provider's token, JWKS and userinfo endpoints itself).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from html import unescape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model

from console.models import AuditEvent, OidcIdentity
from console.services import Actor
from console.users import do_deactivate_user
from tests.factories import make_user

REPO = Path(__file__).resolve().parents[2]
CLIENT_ID, CLIENT_SECRET = "console-test", "console-test-secret"
PROVIDER_NAME = "Test IdP"
pytestmark = [pytest.mark.django_db(transaction=True)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Provider:
    url: str
    issuer: str


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory, live_server: Any) -> Iterator[Provider]:
    """One provider for the module: its migrate, setup and start are most of this module's
    time, and no test changes it (the console's side, its users and identities, is per test;
    the client asks consent on every sign-in and reuses none)."""
    tmp_path = tmp_path_factory.mktemp("oidc-provider")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
        "OIDC_PROVIDER_DB": str(tmp_path / "provider.sqlite3"),
        "OIDC_PROVIDER_URL": url,
        "PYTHONPATH": str(REPO),
    }
    env.pop("DATABASE_URL", None)
    run = {"cwd": REPO, "env": env, "check": True, "capture_output": True, "timeout": 120}
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], **run)  # type: ignore[call-overload]
    subprocess.run(  # type: ignore[call-overload]
        [
            sys.executable,
            "-m",
            "tests.oidc_provider.setup",
            f"{live_server.url}/oidc/callback/",
            CLIENT_ID,
            CLIENT_SECRET,
            "pat:pat@example.test:pat-idp-password",
            "quinn:quinn@example.test:quinn-idp-password",
            "newbie:newbie@example.test:newbie-idp-password",
        ],
        **run,
    )
    log = open(tmp_path / "provider.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                info = requests.get(f"{url}/openid/.well-known/openid-configuration", timeout=2)
                if info.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise AssertionError("the OIDC provider did not start: " + (tmp_path / "provider.log").read_text())
            time.sleep(0.2)
        yield Provider(url=url, issuer=info.json()["issuer"])
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


@pytest.fixture
def sso(provider: Provider, settings: Any) -> Provider:
    """The console with single sign-on on, as OIDC_* environment variables would set it."""
    settings.OIDC_ENABLED = True
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_OP_ISSUER = provider.issuer
    settings.OIDC_PROVIDER_NAME = PROVIDER_NAME
    settings.AUTHENTICATION_BACKENDS = [*django_settings.AUTHENTICATION_BACKENDS, "console.oidc.ConsoleOIDCBackend"]
    settings.ROOT_URLCONF = "tests.support.oidc_urls"
    return provider


def hidden_inputs(page: str) -> dict[str, str]:
    fields = {}
    for tag in re.findall(r"<input[^>]*>", page):
        name = re.search(r'name="([^"]+)"', tag)
        value = re.search(r'value="([^"]*)"', tag)
        if name and 'type="hidden"' in tag:
            fields[name.group(1)] = unescape(value.group(1)) if value else ""
    return fields


def sign_in(console: str, username: str, password: str, *, consent: bool = True) -> requests.Session:
    """The authorization-code flow as a browser makes it; the session at the end."""
    browser = requests.Session()
    login_page = browser.get(f"{console}/login/", timeout=10)
    assert f"Sign in with {PROVIDER_NAME}" in login_page.text
    start = re.search(r'id="sso-login" href="([^"]+)"', login_page.text)
    assert start
    at_provider = browser.get(console + unescape(start.group(1)), timeout=10)
    assert at_provider.url.startswith("http://127.0.0.1:")
    assert "/accounts/login/" in at_provider.url
    form = hidden_inputs(at_provider.text)
    consent_page = browser.post(at_provider.url, data={**form, "username": username, "password": password}, timeout=10)
    assert "Request for Permission" in consent_page.text, consent_page.text[:500]
    form = hidden_inputs(consent_page.text)
    action = consent_page.url.split("?")[0]
    data = {**form, "allow": "Authorize"} if consent else form
    browser.post(action, data=data, timeout=30)  # -> the console's callback -> its landing page
    return browser


def logged_in_as(browser: requests.Session, console: str) -> str | None:
    page = browser.get(f"{console}/", timeout=10, allow_redirects=False)
    if page.status_code != 200:
        return None
    match = re.search(r'<span class="whoami">([^<\s]+)', page.text)
    return match.group(1) if match else None


def test_the_login_page_has_no_sso_button_when_it_is_off(client: Any) -> None:
    assert not django_settings.OIDC_ENABLED
    assert b"Sign in with" not in client.get("/login/").content


def test_sso_matches_the_user_by_email_and_stores_the_subject(live_server: Any, sso: Provider) -> None:
    pat = make_user("pat", email="PAT@example.test")
    browser = sign_in(live_server.url, "pat", "pat-idp-password")
    assert logged_in_as(browser, live_server.url) == "pat"
    identity = OidcIdentity.objects.get(user=pat)
    assert identity.issuer == sso.issuer
    assert identity.subject  # the provider's subject, kept for the next sign-in
    assert AuditEvent.objects.filter(action="user.oidc_link", target_id=str(pat.pk)).count() == 1
    # Signing in again uses the stored subject, even after the console's email changed.
    pat.email = "pat-renamed@example.test"
    pat.save(update_fields=["email"])
    again = sign_in(live_server.url, "pat", "pat-idp-password")
    assert logged_in_as(again, live_server.url) == "pat"
    assert OidcIdentity.objects.count() == 1


def test_a_different_subject_with_the_same_email_is_not_merged(live_server: Any, sso: Provider) -> None:
    quinn = make_user("quinn", email="quinn@example.test")
    OidcIdentity.objects.create(user=quinn, issuer=sso.issuer, subject="someone-else")
    browser = sign_in(live_server.url, "quinn", "quinn-idp-password")
    assert logged_in_as(browser, live_server.url) is None
    assert "sso-failed" in browser.get(f"{live_server.url}/login/?sso=failed", timeout=10).text
    assert list(OidcIdentity.objects.values_list("subject", flat=True)) == ["someone-else"]


def test_unknown_users_are_refused_unless_creation_is_on(live_server: Any, sso: Provider, settings: Any) -> None:
    assert logged_in_as(sign_in(live_server.url, "newbie", "newbie-idp-password"), live_server.url) is None
    assert not get_user_model().objects.filter(email="newbie@example.test").exists()
    settings.OIDC_CREATE_USER = True
    browser = sign_in(live_server.url, "newbie", "newbie-idp-password")
    assert logged_in_as(browser, live_server.url) == "newbie"
    created = get_user_model().objects.get(email="newbie@example.test")
    assert not created.has_usable_password()
    assert OidcIdentity.objects.filter(user=created).exists()
    assert AuditEvent.objects.filter(action="user.create", target_id=str(created.pk)).exists()


def test_a_deactivated_user_cannot_sign_in_with_sso(live_server: Any, sso: Provider) -> None:
    pat = make_user("pat", email="pat@example.test")
    root = make_user("root2", superuser=True)
    do_deactivate_user(pat, actor=Actor(user=root))
    assert logged_in_as(sign_in(live_server.url, "pat", "pat-idp-password"), live_server.url) is None


# --- The provider's discovery document --------------------------------------------------


@dataclass
class Documents:
    """A loopback server answering /<name>/.well-known/openid-configuration from `by_name`."""

    url: str
    by_name: dict[str, object]
    asked: list[str]


@pytest.fixture(scope="module")
def documents() -> Iterator[Documents]:
    served = Documents(url="", by_name={}, asked=[])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            served.asked.append(self.path)
            name = self.path.split("/")[1]
            document = served.by_name.get(name)
            answers = document.get("answers") if isinstance(document, dict) else None
            endpoint = self.path.rsplit("/", 1)[-1]
            if isinstance(answers, dict) and endpoint in answers:
                # A provider answering JSON that is not what its endpoint gives, or signed claims.
                answer = answers[endpoint]
                signed = isinstance(answer, SignedAnswer)
                body = answer.jwt.encode() if signed else json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/jwt" if signed else "application/json")
                self.end_headers()
                self.wfile.write(body)
                return
            if isinstance(document, dict) and self.path.endswith(("/token_endpoint", "/userinfo_endpoint")):
                # A provider's answer that drips as slowly as its document (or at once).
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                for byte in json.dumps({"access_token": "a", "id_token": "i", "padding": "x" * 400}).encode():
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(float(document.get("drip_seconds", 0)))
                return
            if name not in served.by_name or not self.path.endswith("/.well-known/openid-configuration"):
                self.send_error(404)
                return
            document = served.by_name[name]
            if isinstance(document, Redirect):
                self.send_response(302)
                self.send_header("Location", document.to)
                self.end_headers()
                return
            body = json.dumps(document).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            if isinstance(document, dict) and "drip_seconds" in document:
                # One byte at a time, each well inside a read timeout: a provider that never ends.
                for byte in body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(float(document["drip_seconds"]))
                return
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served
    server.shutdown()


@dataclass
class SignedAnswer:
    """An endpoint's answer as a signed JWT (`application/jwt`), as signed userinfo is."""

    jwt: str


@dataclass
class Redirect:
    """A discovery URL that answers 302 to `to`."""

    to: str


def a_document(issuer: str, **changes: object) -> dict[str, object]:
    endpoints = {name: f"{issuer}/{name}" for name in ("authorization_endpoint", "token_endpoint", "userinfo_endpoint")}
    return {"issuer": issuer, **endpoints, "jwks_uri": f"{issuer}/jwks", **changes}


def test_the_endpoints_and_algorithm_come_from_the_discovery_document(documents: Documents, settings: Any) -> None:
    from console.oidc import discover

    settings.OIDC_OP_ISSUER = f"{documents.url}/good"
    documents.by_name["good"] = a_document(settings.OIDC_OP_ISSUER, id_token_signing_alg_values_supported=["ES256"])
    found = discover()
    assert found["token_endpoint"] == f"{documents.url}/good/token_endpoint"
    assert found["jwks_uri"] == f"{documents.url}/good/jwks"
    assert found["algorithm"] == "ES256"


@pytest.mark.parametrize(
    ("name", "document", "said"),
    [
        ("missing", None, "could not be read"),
        ("elsewhere", a_document("http://idp.test/other"), "names issuer 'http://idp.test/other'"),
        ("partial", {"issuer": "{issuer}", "authorization_endpoint": "x"}, "has no token_endpoint"),
        ("unsigned", a_document("{issuer}", id_token_signing_alg_values_supported=["none"]), "signs ID tokens"),
        ("a-list", ["not", "an", "object"], "not a JSON object"),
        ("alg-number", a_document("{issuer}", id_token_signing_alg_values_supported=5), "signs ID tokens"),
        ("alg-text", a_document("{issuer}", id_token_signing_alg_values_supported="xRS256x"), "signs ID tokens"),
        # mozilla-django-oidc 5.0.2 (auth.py, verify_token) reads JWKS keys only for RS* and ES*;
        # a PS* token would be checked against the client secret and never verify.
        ("pss-only", a_document("{issuer}", id_token_signing_alg_values_supported=["PS256"]), "signs ID tokens"),
        ("not-a-url", a_document("{issuer}", token_endpoint="javascript:alert(1)"), "token_endpoint is not"),
        ("huge", a_document("{issuer}", padding="x" * 2_000_000), "larger than"),
        ("moved", Redirect("http://127.0.0.1:9/elsewhere/.well-known/openid-configuration"), "redirect"),
    ],
)
def test_a_discovery_document_that_does_not_fit_is_said_in_words(
    documents: Documents, settings: Any, name: str, document: Any, said: str
) -> None:
    from console.oidc import DiscoveryFailed, discover

    settings.OIDC_OP_ISSUER = f"{documents.url}/{name}"
    if isinstance(document, Redirect):
        documents.by_name[name] = document
    elif document is not None:
        documents.by_name[name] = json.loads(json.dumps(document).replace("{issuer}", settings.OIDC_OP_ISSUER))
    with pytest.raises(DiscoveryFailed, match=re.escape(said)):
        discover()


def test_a_sign_in_whose_provider_cannot_be_discovered_fails_cleanly(
    live_server: Any, sso: Provider, settings: Any, documents: Documents
) -> None:
    settings.OIDC_OP_ISSUER = f"{documents.url}/nowhere"
    browser = requests.Session()
    start = browser.get(f"{live_server.url}/oidc/authenticate/", timeout=10, allow_redirects=False)
    assert start.status_code == 302
    assert start.headers["Location"] == "/login/?sso=failed"
    # The callback too (a sign-in started before the provider moved): no 500, no user.
    callback = browser.get(f"{live_server.url}/oidc/callback/?code=c&state=s", timeout=10, allow_redirects=False)
    assert callback.status_code == 302
    assert logged_in_as(browser, live_server.url) is None


def test_a_password_login_never_asks_the_provider(
    client: Any, sso: Provider, settings: Any, documents: Documents
) -> None:
    make_user("local")
    settings.OIDC_OP_ISSUER = f"{documents.url}/never-asked"
    answer = client.post("/login/", {"username": "local", "password": "pw-local"})
    assert answer.status_code == 302, answer.content[:300]
    assert answer.wsgi_request.user.get_username() == "local"
    assert not [path for path in documents.asked if path.startswith("/never-asked/")]


def test_a_provider_that_never_finishes_its_document_fails_within_the_timeout(
    documents: Documents, settings: Any
) -> None:
    """A read timeout bounds each wait for a byte, not the answer: a provider sending one byte
    every half second would hold a worker for as long as it likes. The whole read has a bound."""
    from console.oidc import DiscoveryFailed, discover

    settings.OIDC_TIMEOUT = 1
    settings.OIDC_OP_ISSUER = f"{documents.url}/dripping"
    documents.by_name["dripping"] = a_document(settings.OIDC_OP_ISSUER, drip_seconds=0.2)
    started = time.monotonic()
    with pytest.raises(DiscoveryFailed, match="in time"):
        discover()
    # The drip alone would take over a minute (~400 bytes at 0.2 s); the bound is a few seconds.
    assert time.monotonic() - started < 15


def test_a_password_login_with_code_and_state_in_its_url_never_asks_the_provider(
    client: Any, sso: Provider, settings: Any, documents: Documents
) -> None:
    """The OIDC backend runs for every authenticate() call; `?code=&state=` on the login URL
    must not turn a (failed) password login into a token request to the provider."""
    make_user("local")
    settings.OIDC_OP_ISSUER = f"{documents.url}/asked-by-password"
    documents.by_name["asked-by-password"] = a_document(settings.OIDC_OP_ISSUER)
    wrong = client.post("/login/?code=forged&state=forged", {"username": "local", "password": "wrong"})
    assert wrong.status_code == 200
    assert not wrong.wsgi_request.user.is_authenticated
    right = client.post("/login/?code=forged&state=forged", {"username": "local", "password": "pw-local"})
    assert right.status_code == 302
    assert not [path for path in documents.asked if path.startswith("/asked-by-password/")]


@pytest.mark.parametrize(
    "answers",
    [{}, {"token_endpoint": []}, {"token_endpoint": "token"}, {"token_endpoint": 5}, {"token_endpoint": None}],
)
def test_a_callback_with_a_forged_code_fails_cleanly(
    live_server: Any, sso: Provider, settings: Any, documents: Documents, answers: dict[str, object]
) -> None:
    """A real state (the attacker's own sign-in start) with a code the provider refuses (its
    token endpoint a 404), or answers with JSON that is no object: the sign-in fails with a
    redirect, never a 500."""
    settings.OIDC_OP_ISSUER = f"{documents.url}/refuses"
    documents.by_name["refuses"] = a_document(settings.OIDC_OP_ISSUER, answers=answers)
    browser = requests.Session()
    start = browser.get(f"{live_server.url}/oidc/authenticate/", timeout=10, allow_redirects=False)
    assert start.status_code == 302
    state = re.search(r"[?&]state=([^&]+)", start.headers["Location"])
    assert state
    callback = browser.get(
        f"{live_server.url}/oidc/callback/?code=forged&state={state.group(1)}", timeout=30, allow_redirects=False
    )
    assert callback.status_code == 302, callback.text[:300]
    assert callback.headers["Location"] == "/login/?sso=failed"
    assert logged_in_as(browser, live_server.url) is None


@pytest.mark.parametrize(
    ("endpoint", "answer"),
    [("userinfo_endpoint", []), ("userinfo_endpoint", "x"), ("jwks", []), ("jwks", {"keys": 5})],
)
def test_odd_userinfo_and_key_answers_are_refused_as_provider_errors(
    documents: Documents, settings: Any, endpoint: str, answer: object
) -> None:
    """What the sign-in catches (a provider error, a token that does not verify), not a
    TypeError or AttributeError that would end in a 500."""
    from django.core.exceptions import SuspiciousOperation

    from console.oidc import ConsoleOIDCBackend

    settings.OIDC_OP_ISSUER = f"{documents.url}/odd-{endpoint}"
    documents.by_name[f"odd-{endpoint}"] = a_document(settings.OIDC_OP_ISSUER, answers={endpoint: answer})
    backend = ConsoleOIDCBackend()
    backend.OIDC_OP_USER_ENDPOINT = f"{settings.OIDC_OP_ISSUER}/userinfo_endpoint"
    backend.OIDC_OP_JWKS_ENDPOINT = f"{settings.OIDC_OP_ISSUER}/jwks"
    token = jwt.encode({"sub": "s"}, "k" * 32, algorithm="HS256", headers={"kid": "a"})
    call = backend.retrieve_matching_jwk if endpoint == "jwks" else lambda t: backend.get_userinfo("a", t, {})
    with pytest.raises((ValueError, SuspiciousOperation, requests.RequestException)):
        call(token)


def test_a_trailing_slash_on_the_issuer_does_not_unlink_its_subjects(live_server: Any, sso: Provider) -> None:
    """The issuer is compared without its trailing slash (discover()); its links must be too.
    quinn was linked under `…/openid/` before the setting lost its slash: another subject with
    quinn's email is still refused, not linked to quinn."""
    quinn = make_user("quinn", email="quinn@example.test")
    OidcIdentity.objects.create(user=quinn, issuer=sso.issuer.rstrip("/") + "/", subject="someone-else")
    browser = sign_in(live_server.url, "quinn", "quinn-idp-password")
    assert logged_in_as(browser, live_server.url) is None
    assert list(OidcIdentity.objects.values_list("subject", flat=True)) == ["someone-else"]


@pytest.mark.parametrize("endpoint", ["token_endpoint", "userinfo_endpoint"])
def test_the_token_and_userinfo_calls_have_a_deadline_for_the_whole_answer(
    documents: Documents, settings: Any, endpoint: str
) -> None:
    """Each wait for a byte is bounded by requests' timeout, not the answer: a provider that
    drips its token answer would hold the sign-in (and a worker) for as long as it likes."""
    from console.oidc import ConsoleOIDCBackend

    settings.OIDC_TIMEOUT = 1
    settings.OIDC_OP_ISSUER = f"{documents.url}/slow-{endpoint}"
    documents.by_name[f"slow-{endpoint}"] = a_document(settings.OIDC_OP_ISSUER, drip_seconds=0.1)
    backend = ConsoleOIDCBackend()
    backend.OIDC_OP_TOKEN_ENDPOINT = f"{settings.OIDC_OP_ISSUER}/token_endpoint"
    backend.OIDC_OP_USER_ENDPOINT = f"{settings.OIDC_OP_ISSUER}/userinfo_endpoint"
    call = {"token_endpoint": lambda: backend.get_token({"code": "c"}),
            "userinfo_endpoint": lambda: backend.get_userinfo("a", "i", {})}[endpoint]  # fmt: skip
    started = time.monotonic()
    with pytest.raises(requests.Timeout, match="did not answer within 1 s"):
        call()
    # The drip alone takes over 40 s (~450 bytes at 0.1 s).
    assert time.monotonic() - started < 3
    # At the provider's own pace the same calls answer.
    documents.by_name[f"slow-{endpoint}"] = a_document(settings.OIDC_OP_ISSUER)
    assert backend.get_token({"code": "c"})["access_token"] == "a"
    assert backend.get_userinfo("a", "i", {})["id_token"] == "i"


def test_an_id_token_must_name_the_issuer_and_this_client(settings: Any) -> None:
    from django.core.exceptions import SuspiciousOperation

    from console.oidc import ConsoleOIDCBackend

    settings.OIDC_OP_ISSUER = "http://idp.test/realm/"
    settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = CLIENT_ID, CLIENT_SECRET
    backend = ConsoleOIDCBackend()
    backend.OIDC_RP_SIGN_ALGO = "HS256"  # signed with the client secret: no keys to fetch

    def token(**claims: Any) -> str:
        base = {"iss": "http://idp.test/realm", "aud": CLIENT_ID, "sub": "s", "nonce": "n", "exp": time.time() + 60}
        return jwt.encode({**base, **claims}, CLIENT_SECRET, algorithm="HS256")

    assert backend.verify_token(token(), nonce="n")["sub"] == "s"
    assert backend.verify_token(token(aud=[CLIENT_ID, "other"], azp=CLIENT_ID), nonce="n")["sub"] == "s"
    for claims, said in (
        ({"iss": "http://evil.test/realm"}, "issued by 'http://evil.test/realm'"),
        ({"aud": "another-client"}, "not for this client"),
        ({"aud": None}, "not for this client"),
        ({"aud": [CLIENT_ID, "other"]}, "another party"),
    ):
        with pytest.raises(SuspiciousOperation, match=re.escape(said)):
            backend.verify_token(token(**claims), nonce="n")
    # exp is required (OpenID Connect Core 1.0, 2): a token without it would be good forever.
    forever = {"iss": "http://idp.test/realm", "aud": CLIENT_ID, "sub": "s", "nonce": "n"}
    with pytest.raises(SuspiciousOperation, match=re.escape("has no expiry (exp)")):
        backend.verify_token(jwt.encode(forever, CLIENT_SECRET, algorithm="HS256"), nonce="n")


def test_signed_userinfo_is_checked_like_the_id_token_but_need_not_expire(documents: Documents, settings: Any) -> None:
    from django.core.exceptions import SuspiciousOperation

    from console.oidc import ConsoleOIDCBackend

    settings.OIDC_OP_ISSUER = f"{documents.url}/signed"
    settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET = CLIENT_ID, CLIENT_SECRET
    claims = {"iss": settings.OIDC_OP_ISSUER, "aud": CLIENT_ID, "sub": "s", "email": "s@example.test"}
    documents.by_name["signed"] = a_document(
        settings.OIDC_OP_ISSUER, answers={"userinfo_endpoint": SignedAnswer(jwt.encode(claims, CLIENT_SECRET))}
    )
    backend = ConsoleOIDCBackend()
    backend.OIDC_RP_SIGN_ALGO = "HS256"
    backend.OIDC_OP_USER_ENDPOINT = f"{settings.OIDC_OP_ISSUER}/userinfo_endpoint"
    assert backend.get_userinfo("a", "i", {})["email"] == "s@example.test"  # no exp (Core 1.0, 5.3.2)
    documents.by_name["signed"] = a_document(
        settings.OIDC_OP_ISSUER,
        answers={"userinfo_endpoint": SignedAnswer(jwt.encode({**claims, "aud": "other"}, CLIENT_SECRET))},
    )
    with pytest.raises(SuspiciousOperation, match="not for this client"):
        backend.get_userinfo("a", "i", {})


@pytest.mark.parametrize(
    ("missing", "said"),
    [
        ({"OIDC_RP_CLIENT_SECRET": ""}, "OIDC_RP_CLIENT_SECRET is not"),
        ({"OIDC_OP_ISSUER": ""}, "OIDC_OP_ISSUER is not"),
        ({"OIDC_RP_CLIENT_SECRET": "", "OIDC_OP_ISSUER": ""}, "OIDC_RP_CLIENT_SECRET and OIDC_OP_ISSUER are not"),
    ],
)
def test_sso_on_without_its_secret_or_issuer_stops_the_start(missing: dict[str, str], said: str) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OIDC_")},
        "DJANGO_SETTINGS_MODULE": "console.settings.test",
        "OIDC_RP_CLIENT_ID": CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_OP_ISSUER": "http://idp.test/realm",
        **missing,
    }
    started = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert started.returncode != 0
    assert f"error: Single sign-on is on (OIDC_RP_CLIENT_ID is set) but {said}" in started.stderr, started.stderr
    assert "Traceback" not in started.stderr
    if len(missing) == 1:
        return
    complete = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO,
        env={**env, "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET, "OIDC_OP_ISSUER": "http://idp.test/realm"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert complete.returncode == 0, complete.stderr


@pytest.mark.parametrize(
    "odd",
    [{"given_name": None, "family_name": None}, {"preferred_username": 7}, {"given_name": ["A"], "family_name": 3}],
)
def test_a_new_user_is_made_from_claims_of_any_json_type(odd: dict[str, Any]) -> None:
    """Providers send null for a name they do not have; a claim of another type is left out,
    never a 500 at the callback."""
    from console.oidc import do_create_oidc_user

    user = do_create_oidc_user({"sub": "s-1", "email": "nora@example.test", **odd}, source_ip=None)
    assert user.username == "nora"
    assert (user.first_name, user.last_name) == ("", "")
    assert OidcIdentity.objects.get(user=user).subject == "s-1"


@pytest.mark.parametrize(
    ("verified", "accepted"),
    [(False, False), ("false", False), ("False", False), (0, False), (True, True), ("true", True), (None, True)],
)
def test_an_email_the_provider_has_not_verified_signs_nobody_in(verified: object, accepted: bool) -> None:
    """Some providers send email_verified as a string: "false" is as unverified as false
    (the email alone would link the token's subject to the user who has that email)."""
    from console.oidc import ConsoleOIDCBackend

    claims = {"sub": "s", "email": "nora@example.test", "email_verified": verified}
    assert ConsoleOIDCBackend().verify_claims(claims) is accepted
    # Not said (absent or null): trusted, as before.
    assert ConsoleOIDCBackend().verify_claims({"sub": "s", "email": "nora@example.test"}) is True


def test_a_provider_that_drips_its_headers_is_cut_at_the_deadline(settings: Any) -> None:
    """The deadline holds before the body too: a status line and headers sent a line at a
    time, each well inside requests' read timeout, would otherwise hold the sign-in."""
    from console.oidc import fetch

    settings.OIDC_TIMEOUT = 1
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip() -> None:
        client, _ = listener.accept()
        with client:
            client.recv(65536)
            client.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(80):  # 8 s of headers
                if stop.wait(0.1):
                    return
                try:
                    client.sendall(b"X-Slow: yes\r\n")
                except OSError:
                    return
            client.sendall(b"Content-Length: 2\r\n\r\n{}")

    threading.Thread(target=drip, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(requests.Timeout, match="did not answer within 1 s"):
            fetch("GET", f"http://127.0.0.1:{listener.getsockname()[1]}/token")
    finally:
        stop.set()
        listener.close()
    assert time.monotonic() - started < 2.5


def test_a_first_sign_in_that_loses_the_race_for_its_email_signs_in_as_the_winner(settings: Any) -> None:
    """Two first sign-ins (or a sign-in and an admin) create a user with one email at once: the
    unique email index refuses the later one, which then signs in as the user that won, linked
    to its subject, and never merges into a user of another subject."""
    from django.core.exceptions import PermissionDenied

    from console.oidc import do_create_oidc_user

    settings.OIDC_OP_ISSUER = "http://idp.test/realm"
    claims = {"sub": "sam-subject", "email": "Sam@Example.test", "preferred_username": "sam"}
    winner = make_user("sam-by-admin", email="sam@example.test")  # made after this sign-in looked
    assert do_create_oidc_user(claims, source_ip=None) == winner
    assert OidcIdentity.objects.get(user=winner).subject == "sam-subject"
    assert do_create_oidc_user(claims, source_ip=None) == winner  # a second racer: already linked
    assert OidcIdentity.objects.filter(user=winner).count() == 1
    with pytest.raises(PermissionDenied):
        do_create_oidc_user({**claims, "sub": "someone-else"}, source_ip=None)
    assert get_user_model().objects.filter(email__iexact="sam@example.test").count() == 1


def test_a_first_sign_in_whose_email_only_lowers_like_a_users_is_refused_not_linked(settings: Any) -> None:
    """ "\u212a@…" (the Kelvin sign) is refused by the unique index beside "k@…" but is no
    address a sign-in matches by email: the sign-in is refused in words, never linked to the
    user of the other address, never a 500."""
    from django.core.exceptions import PermissionDenied

    from console.oidc import do_create_oidc_user

    settings.OIDC_OP_ISSUER = "http://idp.test/realm"
    kim = make_user("kim", email="k@example.test")
    with pytest.raises(PermissionDenied):
        do_create_oidc_user({"sub": "kelvin-subject", "email": "\u212a@example.test"}, source_ip=None)
    assert not OidcIdentity.objects.filter(user=kim).exists()
