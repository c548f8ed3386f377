"""Log redaction: no token, invitation code or password reaches a log line.

The whole output of production's logging set-up (console.logs.logging_config, JSON lines) is
captured while a flow runs through every door a secret comes in by: a user invited and the
invitation accepted (its token in the path), a failed login (django-axes), agent API calls
with the token in the header and in `?token=`, and a view that fails quoting its query string
(Django's error log, which shows the request). Then the output is grepped for each secret.
"""

from __future__ import annotations

import io
import logging
import logging.config
import re
from collections.abc import Iterator

import pytest
from django.test import Client, override_settings

from console.logs import REDACTED, RedactFilter, logging_config, redact
from console.models import AuditEvent, Role
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from tests.factories import add_member, make_space, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def production_log() -> Iterator[io.StringIO]:
    """Production's logging configuration, its handler writing into a buffer; the test
    process's own configuration is put back afterwards."""
    root = logging.getLogger()
    saved_root = (root.handlers[:], root.level)
    saved = {
        name: (lg.handlers[:], lg.level, lg.propagate, lg.disabled)
        for name, lg in logging.Logger.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    buffer = io.StringIO()
    logging.config.dictConfig(logging_config(log_format="json", level="DEBUG"))
    for handler in root.handlers:
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(buffer)
    try:
        yield buffer
    finally:
        root.handlers[:], root.level = saved_root
        for name, (handlers, level, propagate, disabled) in saved.items():
            lg = logging.getLogger(name)
            lg.handlers[:], lg.level, lg.propagate, lg.disabled = handlers, level, propagate, disabled


def every_handler() -> list[logging.Handler]:
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    # A NullHandler (libraries add one to their logger) writes nothing anywhere.
    return [h for lg in loggers for h in lg.handlers if not isinstance(h, logging.NullHandler)]


def test_every_handler_of_the_production_set_up_redacts(production_log: io.StringIO) -> None:
    import django.utils.log

    # Django installs its defaults first (a console handler under DEBUG, the admins' mail);
    # the console's configuration applied after them leaves no handler without the filter.
    logging.config.dictConfig(django.utils.log.DEFAULT_LOGGING)
    logging.config.dictConfig(logging_config(log_format="text", level="INFO"))
    handlers = every_handler()
    assert handlers
    for handler in handlers:
        assert any(isinstance(f, RedactFilter) for f in handler.filters), handler


@override_settings(ROOT_URLCONF="tests.support.redaction_urls", INVITE_EMAIL=False)
def test_a_whole_flow_logs_no_secret(production_log: io.StringIO) -> None:
    secrets: list[str] = []
    root = make_user("root", superuser=True)
    space = make_space("Redaction space", slug="redaction-space")
    add_member(space, root, Role.ADMIN)
    admin = Client()
    admin.force_login(root)

    # An invitation: made by the platform admin, accepted by the new user.
    page = admin.post("/platform/users/new/", {"username": "dora", "email": ""})
    assert page.status_code == 200
    match = re.search(r"/invite/([A-Za-z0-9_\-]+)/", page.content.decode())
    assert match, "the invitation link is shown to the admin"
    invite_token = match[1]
    secrets.append(invite_token)
    new_password = "Correct-Horse-Battery-7"
    secrets.append(new_password)
    visitor = Client()
    assert visitor.get(f"/invite/{invite_token}/").status_code == 200
    accepted = visitor.post(f"/invite/{invite_token}/", {"new_password1": new_password, "new_password2": new_password})
    assert accepted.status_code == 302
    # The link is used: asking again is refused (a 404, logged by Django as "Not Found").
    assert Client().get(f"/invite/{invite_token}/").status_code == 404

    # A failed login (django-axes logs each failure).
    wrong_password = "Wrong-Password-Tried-4"
    secrets.append(wrong_password)
    failed = Client().post("/login/", {"username": "dora", "password": wrong_password})
    assert failed.status_code == 200

    # Agent API calls: the token in the header, then in the query string.
    _, api_token = do_create_api_token(space, name="agent", actor=Actor(user=root))
    secrets.append(api_token)
    agent = Client()
    base = f"/api/v1/spaces/{space.id}/sessions/no-such-session"
    assert agent.get(base, HTTP_AUTHORIZATION=f"Bearer {api_token}").status_code == 404
    assert agent.get(f"{base}?token={api_token}").status_code == 401
    assert agent.get(f"{base}?access_token={api_token}&password={wrong_password}").status_code == 401

    # An error: Django's error log shows the request, query string and all.
    erring = Client(raise_request_exception=False)
    assert erring.get(f"/failing/?token={api_token}&invite={invite_token}").status_code == 500

    output = production_log.getvalue()
    lines = output.splitlines()
    assert len(lines) > 10, output  # the flow was logged
    assert any("/invite/" + REDACTED in line for line in lines)
    assert any("Internal Server Error" in line for line in lines)
    assert any("AXES" in line for line in lines)
    for secret in secrets:
        leaking = [line for line in lines if secret in line]
        assert not leaking, f"{secret!r} is in {len(leaking)} log line(s): {leaking[:3]}"
    # The audit trail is not a log: it keeps what it records (no secret is in it either).
    assert not any(api_token in str(e.details) for e in AuditEvent.objects.all())


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("GET /invite/Zx9_abc-DEF/ -> 404", "Zx9_abc-DEF"),
        ("/api/v1/spaces/x?token=abc123def&page=2", "abc123def"),
        ("https://console.test/cb?code=one-time-code&state=s", "one-time-code"),
        ("redis://worker:s3cr3t-pw@redis.test:6379/0", "s3cr3t-pw"),
        ("Authorization: Bearer sck_0123456789abcdef", "sck_0123456789abcdef"),
        ("{'username': 'dora', 'password': 'hunter2-x'}", "hunter2-x"),
        ('{"client_secret": "shh-secret-9"}', "shh-secret-9"),
        ("csrfmiddlewaretoken=tok-tok-tok&x=1", "tok-tok-tok"),
        ("the key is sck_abcdefghijkl in a sentence", "sck_abcdefghijkl"),
        ("X_API_KEY=letmein", "letmein"),
        # A QueryDict in an error report or a logged request.POST: the value sits in a list.
        ("<QueryDict: {'username': ['dora'], 'password': ['hunter2-q']}>", "hunter2-q"),
        # A quoted password holding spaces is blanked whole, not up to its first space.
        ("{'new_password1': 'correct horse battery'}", "horse battery"),
        ('password="a&b c-d"', "c-d"),
        ("DJANGO_SECRET_KEY=django-insecure-xyz", "django-insecure-xyz"),
        # A backend's TLS client key (a PEM secret setting), whatever names it, cut short or not.
        ("tls: -----BEGIN PRIVATE KEY-----\nMIIEvQIBADAN\n-----END PRIVATE KEY----- ok", "MIIEvQIBADAN"),
        ("{'key': '-----BEGIN EC PRIVATE KEY-----\\nMHcCAQEEIB'}", "MHcCAQEEIB"),
    ],
)
def test_redact_blanks_each_form_of_secret(text: str, secret: str) -> None:
    cleaned = redact(text)
    assert secret not in cleaned
    assert REDACTED in cleaned
    assert redact(cleaned) == cleaned


def test_redact_keeps_what_is_not_a_secret() -> None:
    text = "exec done session_key=agent-7 exit_code=3 sandbox=abc duration_ms=12 GET /spaces/x/ -> 200"
    assert redact(text) == text


def test_extra_fields_and_tracebacks_are_redacted(production_log: io.StringIO) -> None:
    logger = logging.getLogger("console.tests.redaction")
    try:
        raise ValueError("bad credentials password=tracebacksecret")
    except ValueError:
        logger.exception("call failed", extra={"api_key": "extra-secret-1", "url": "http://u:extrapw@h.test/"})
    output = production_log.getvalue()
    for secret in ("tracebacksecret", "extra-secret-1", "extrapw"):
        assert secret not in output
    assert "ValueError" in output
    assert "call failed" in output


@pytest.mark.parametrize(
    "text",
    [
        "mmdebstrap failed (exit code: 2)",
        "the engine answered HTTP status code: 502",
        'API error {"code": "session_busy", "message": "busy"}',
        "the terminal's ticket: expired",
    ],
)
def test_redact_keeps_a_diagnostic_that_names_a_code_in_prose(text: str) -> None:
    """`code`, `ticket` and the like are secrets as parameters (`?code=…`), not in prose: a
    log line or job log saying "exit code: 2" keeps the number it is there to show."""
    assert redact(text) == text
