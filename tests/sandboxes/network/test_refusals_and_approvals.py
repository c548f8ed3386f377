"""A space's network policy in use on the console side, against the fake E2B server (a backend fixed at create) and
the database: policy vs backend (409, form warnings, connection test), policy versions of
sessions, the egress log (mapping, bounds, retention), approvals, session grants and the
explain API. No traffic leaves the machine: the fake E2B server runs on loopback and no
name is resolved.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import jsonschema
import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.models import AdminJob, AuditEvent, NetworkPolicy
from console.services import SYSTEM, Actor, ServiceError
from netpolicy import Kind, Offer, reserved_class
from sandboxes.api.tokens import do_create_api_token
from sandboxes.api.urls import openapi_document
from sandboxes.backends.base import NetworkSpec
from sandboxes.backends.capabilities import EgressRefusal
from sandboxes.catalog.bridge import get_backend
from sandboxes.catalog.network import network_spec_for, spec_fingerprint
from sandboxes.catalog.services import run_connection_test
from sandboxes.catalog.verify import policy_check
from sandboxes.models import EgressEvent, SandboxConfig, Session, SessionGrant
from sandboxes.network.advice import event_advice
from sandboxes.network.approvals import do_allow_for_session, do_allow_for_space
from sandboxes.network.checks import unreachable_entries
from sandboxes.network.live import apply_space_policy, sessions_keeping_old_rules
from sandboxes.network.log import record_refusals, watch_build_sandbox
from sandboxes.sessions.retention import prune_session_records
from sandboxes.sessions.runtime import Runtime
from tests.factories import make_config, set_policy
from tests.fakes.fixtures import FakeHandle
from tests.personas import World
from tests.support.tuning import Tuned


@pytest.fixture
def e2b_config(world: World, fake_e2b: FakeHandle, settings: Any, test_run_id: str) -> Iterator[SandboxConfig]:
    settings.CONSOLE_INSTALLATION_ID = f"test-egress-{test_run_id}"
    config: SandboxConfig = make_config(
        world.space_a,
        name="cloud",
        **fake_e2b.platform_fields(sandbox_url=fake_e2b.proxy_url),
        default_template="base",
        is_default=True,
        persistent_workspace=False,
    )
    yield config
    runtime = Runtime()
    for session in Session.objects.filter(config=config):
        runtime.delete(session, actor=SYSTEM)


DENY_INSIDE_ALLOW = {"allow_out": ["203.0.113.0/24"], "deny_out": ["203.0.113.128/25"]}
AGENT_HEADERS: dict[str, str] = {}


def agent(world: World) -> tuple[Client, dict[str, str]]:
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    return Client(), {"Authorization": f"Bearer {token}"}


# --- Policy vs backend ---------------------------------------------------------------------


@pytest.mark.django_db
def test_a_session_refused_for_the_policy_answers_409_with_the_reason(world: World, e2b_config: SandboxConfig) -> None:
    set_policy(world.space_a, **DENY_INSIDE_ALLOW)
    client, headers = agent(world)
    url = f"/api/v1/spaces/{world.space_a.id}/sessions/refused/resolve"
    response = client.post(url, "{}", content_type="application/json", headers=headers)
    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "policy_conflict"
    assert error["retryable"] is False
    assert "cannot be honoured by config cloud (E2B)" in error["message"]
    assert "deny entry 203.0.113.128/25 inside allow entry 203.0.113.0/24" in error["message"]
    # Nothing was created on the backend for it.
    session = Session.objects.get(key="refused")
    assert session.sandbox_id == ""
    # The session page's resume says the same, in the page's message (a redirect, no 502).
    page = world.client_for("bob").post(reverse("sandboxes:session_action", args=[session.id, "resume"]), follow=True)
    body = page.content.decode()
    assert page.status_code == 200
    assert "cannot be honoured by config cloud (E2B)" in body
    assert "The backend said" not in body


@pytest.mark.django_db
def test_the_policy_form_warns_which_configs_cannot_honour_it(world: World, e2b_config: SandboxConfig) -> None:
    url = reverse("console:network_policy_edit", args=[world.space_a.id])
    data = {"allow_internet_access": "on", "allow_out": "203.0.113.0/24", "deny_out": "203.0.113.128/25"}
    body = world.client_for("alice").post(url, data, follow=True).content.decode()
    assert "Config cloud (E2B) cannot enforce deny entry 203.0.113.128/25 inside allow entry 203.0.113.0/24" in body
    assert "refused (HTTP 409)" in body
    page = world.client_for("alice").get(url).content.decode()
    assert 'id="policy-backends"' in page
    assert "cannot enforce deny entry 203.0.113.128/25" in page


@pytest.mark.django_db
def test_the_connection_test_reports_a_policy_the_backend_cannot_honour(
    world: World, e2b_config: SandboxConfig
) -> None:
    set_policy(world.space_a, **DENY_INSIDE_ALLOW)
    steps = run_connection_test(e2b_config, lambda step: None)
    assert [s.name for s in steps][-4:] == ["create", "exec", "delete", "network policy"], steps
    assert [s.ok for s in steps][-4:] == [True, True, True, False]
    assert "conflict: The space's network policy cannot be honoured by config cloud" in steps[-1].detail
    verified = policy_check(e2b_config, get_backend(e2b_config))
    assert verified.status == "fail"
    assert "deny entry 203.0.113.128/25 inside allow entry" in verified.detail
    set_policy(world.space_a, allow_out=["203.0.113.0/24"])
    assert run_connection_test(e2b_config, lambda step: None)[-1].ok


# --- Policy versions of sessions -------------------------------------------------------


@pytest.mark.django_db
def test_sessions_on_a_backend_fixed_at_create_are_listed_until_rebuilt(
    world: World, e2b_config: SandboxConfig
) -> None:
    set_policy(world.space_a, allow_out=["pypi.org"])
    runtime = Runtime()
    session = runtime.resolve(world.space_a, "kept").session
    session.refresh_from_db()
    assert session.policy_fingerprint == spec_fingerprint(network_spec_for(world.space_a, session))
    assert session.policy_applied_at is not None
    assert sessions_keeping_old_rules(world.space_a) == []

    set_policy(world.space_a, allow_out=["pypi.org", "files.example"])
    kept = sessions_keeping_old_rules(world.space_a)
    assert [row.session.key for row in kept] == ["kept"]
    assert "fixes the network at create" in kept[0].reason
    report = apply_space_policy(world.space_a)
    assert report.fixed_at_create == ["kept"]
    assert report.applied == []
    page = world.client_for("alice").get(reverse("console:network_policy_edit", args=[world.space_a.id]))
    body = page.content.decode()
    assert 'id="policy-old-rules"' in body
    assert ">kept</a>" in body
    assert reverse("sandboxes:session_action", args=[session.id, "rebuild"]) in body

    runtime.rebuild(Session.objects.get(pk=session.pk), actor=SYSTEM)
    assert sessions_keeping_old_rules(world.space_a) == []


# --- The egress log --------------------------------------------------------------------


def refusal(
    sandbox_id: str, destination: str = "files.example", *, layer: str = "dns", ago_s: int = 0
) -> EgressRefusal:
    return EgressRefusal(
        at=timezone.now() - timedelta(seconds=ago_s),
        sandbox_id=sandbox_id,
        layer=layer,
        destination=destination,
        rule="not in the allow list",
    )


@pytest.mark.django_db
def test_refusals_map_to_sessions_and_build_jobs_and_stay_bounded(tuned: Tuned, world: World, settings: Any) -> None:
    tuned({"network.log_max_per_session": 3})
    config = make_config(world.space_a)
    other = make_config(world.space_b)
    session = Session.objects.create(space=world.space_a, config=config, key="s1", sandbox_id="sbx-1")
    # The same sandbox id on another platform backend is another sandbox: not this session's.
    Session.objects.create(space=world.space_b, config=other, key="s2", sandbox_id="sbx-other")
    job = AdminJob.objects.create(kind="skills.install", space=world.space_a)
    watch_build_sandbox("sbx-build", space=world.space_a, job=job)
    rows = [refusal("sbx-1", f"n{i}.example", ago_s=10 - i) for i in range(5)]
    rows += [refusal("sbx-build", "pypi.org"), refusal("sbx-unknown"), refusal("sbx-other")]
    assert record_refusals(config.backend, rows) == 6
    kept = list(EgressEvent.objects.filter(session=session).order_by("time").values_list("destination", flat=True))
    assert kept == ["n2.example", "n3.example", "n4.example"]
    build = EgressEvent.objects.get(sandbox_id="sbx-build")
    assert (build.job_id, build.space_id, build.session_id) == (job.id, world.space_a.id, None)
    assert not EgressEvent.objects.filter(sandbox_id__in=["sbx-unknown", "sbx-other"]).exists()


@pytest.mark.django_db
def test_the_retention_pass_keeps_the_egress_log_days(tuned: Tuned, world: World, settings: Any) -> None:
    tuned({"retention.egress_events_days": 2})
    config = make_config(world.space_a)
    Session.objects.create(space=world.space_a, config=config, key="s1", sandbox_id="sbx-1")
    record_refusals(config.backend, [refusal("sbx-1", "old.example", ago_s=3 * 86400), refusal("sbx-1", "new.example")])
    assert prune_session_records()["egress_events"] == 1
    assert list(EgressEvent.objects.values_list("destination", flat=True)) == ["new.example"]


@pytest.mark.django_db
def test_the_egress_page_filters_paginates_and_has_an_empty_state(world: World) -> None:
    config = make_config(world.space_a)
    one = Session.objects.create(space=world.space_a, config=config, key="one", sandbox_id="sbx-1")
    Session.objects.create(space=world.space_a, config=config, key="two", sandbox_id="sbx-2")
    url = reverse("sandboxes:egress_list", args=[world.space_a.id])
    client = world.client_for("carol")  # a viewer reads the log
    assert "No refused attempt recorded" in client.get(url).content.decode()
    rows = [refusal("sbx-1", f"a{i}.example") for i in range(55)]
    rows += [refusal("sbx-2", "198.51.100.7:443", layer="packet")]
    record_refusals(config.backend, rows)
    first = client.get(url)
    assert first.context["page"].count == 56
    assert len(first.context["rows"]) == 50
    following = client.get(f"{url}?{first.context['page'].older}").context
    assert len(following["rows"]) == 6
    assert not following["page"].has_next
    assert client.get(url, {"layer": "packet"}).context["page"].count == 1
    assert client.get(url, {"destination": "a5"}).context["page"].count == 6  # a5, a50..a54
    assert client.get(url, {"session": one.key}).context["page"].count == 55
    unknown = client.get(url, {"session": "nobody"})
    assert unknown.context["page"].count == 0
    assert "No session &#x27;nobody&#x27; in this space." in unknown.content.decode()
    future = (timezone.now() + timedelta(days=2)).date().isoformat()
    assert client.get(url, {"date_from": future}).context["page"].count == 0
    partial = client.get(url, {"layer": "packet"}, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial
    assert "198.51.100.7:443" in partial
    # The viewer sees no approval buttons; the session page shows its own refusals.
    assert "Allow for this space" not in first.content.decode()
    session_page = world.client_for("alice").get(one.get_absolute_url()).content.decode()
    assert 'id="egress"' in session_page
    assert "a54.example" in session_page


# --- Approvals ---------------------------------------------------------------------------


def event_for(world: World, destination: str, *, layer: str = "dns") -> EgressEvent:
    config = SandboxConfig.objects.filter(space=world.space_a).first() or make_config(world.space_a)
    session = Session.objects.filter(space=world.space_a, key="approver").first() or Session.objects.create(
        space=world.space_a, config=config, key="approver", sandbox_id="sbx-approve"
    )
    record_refusals(config.backend, [refusal(session.sandbox_id, destination, layer=layer)])
    return EgressEvent.objects.filter(destination=destination).latest("time")


@pytest.mark.django_db
def test_allow_for_this_space_adds_the_entry_audited_through_the_policy_service(world: World) -> None:
    set_policy(world.space_a, allow_out=["pypi.org"])
    event = event_for(world, "files.example")
    url = reverse("sandboxes:egress_allow_space", args=[world.space_a.id, event.id])
    client = world.client_for("alice")
    confirm = client.get(url)
    assert confirm.status_code == 200
    assert "Add files.example to the allow list." in confirm.content.decode()
    assert NetworkPolicy.objects.get(space=world.space_a).allow_out == ["pypi.org"]  # a GET changes nothing
    assert client.post(url).status_code == 302
    assert NetworkPolicy.objects.get(space=world.space_a).allow_out == ["pypi.org", "files.example"]
    audit = AuditEvent.objects.get(action="egress.allow_space")
    assert audit.details["entry"] == "files.example"
    assert audit.details["refusal"] == str(event.id)
    assert world.client_for("carol").post(url).status_code == 403
    assert world.client_for("charlie").post(url).status_code == 404


@pytest.mark.django_db
def test_an_approval_never_switches_an_allow_everything_space_to_allow_only(world: World) -> None:
    # Empty allow list = everything but the always-denied set. A private address refused
    # by that set becomes a private exception; the allow list stays empty.
    set_policy(world.space_a)
    event = event_for(world, "10.20.30.40:5432", layer="packet")
    advice = do_allow_for_space(event, actor=SYSTEM)
    assert advice.offer == Offer.PRIVATE
    policy = NetworkPolicy.objects.get(space=world.space_a)
    assert (policy.allow_out, policy.allow_private) == ([], ["10.20.30.40/32"])
    # A public address refused by a deny entry: the row offers to edit the deny list instead.
    set_policy(world.space_a, deny_out=["198.51.100.0/24"])
    denied = event_for(world, "198.51.100.7:443", layer="packet")
    assert event_advice(denied).offer == Offer.EDIT_DENY
    with pytest.raises(ServiceError, match="edit the deny list"):
        do_allow_for_space(denied, actor=SYSTEM)
    assert NetworkPolicy.objects.get(space=world.space_a).allow_out == []
    # Link-local (metadata) is never approved.
    metadata = event_for(world, "169.254.169.254:80", layer="packet")
    assert event_advice(metadata).offer == Offer.NONE
    assert "never reachable" in event_advice(metadata).text


@pytest.mark.django_db
def test_a_session_grant_joins_its_spec_only_and_ends_with_the_session(world: World, e2b_config: SandboxConfig) -> None:
    set_policy(world.space_a, allow_out=["pypi.org"])
    runtime = Runtime()
    session = runtime.resolve(world.space_a, "granted").session
    Session.objects.create(space=world.space_a, config=e2b_config, key="other")
    event = event_for(world, "files.example")
    EgressEvent.objects.filter(pk=event.pk).update(session=session, sandbox_id=session.sandbox_id)
    event.refresh_from_db()
    url = reverse("sandboxes:egress_allow_session", args=[world.space_a.id, event.id])
    assert world.client_for("alice").post(url).status_code == 302
    grant = SessionGrant.objects.get(session=session)
    assert (grant.entry, grant.kind) == ("files.example", SessionGrant.Kind.ALLOW)
    assert network_spec_for(world.space_a, session).texts()["allow_out"] == ["pypi.org", "files.example"]
    assert network_spec_for(world.space_a, Session.objects.get(key="other")).texts()["allow_out"] == ["pypi.org"]
    assert NetworkPolicy.objects.get(space=world.space_a).allow_out == ["pypi.org"]
    assert AuditEvent.objects.filter(action="egress.allow_session", target_id=str(session.id)).count() == 1
    # E2B fixes the network at create: the grant waits for a rebuild, and the page says so.
    assert "granted" in [row.session.key for row in sessions_keeping_old_rules(world.space_a)]
    with pytest.raises(ServiceError, match="Allowed by the current policy already"):
        do_allow_for_session(event, actor=SYSTEM)
    runtime.delete(Session.objects.get(pk=session.pk), actor=SYSTEM)
    assert not SessionGrant.objects.filter(entry="files.example").exists()


# --- Explain -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_explain_page_works_without_and_with_htmx(world: World, e2b_config: SandboxConfig) -> None:
    set_policy(world.space_a, allow_out=["*.example.com"], deny_out=["admin.example.com"])
    url = reverse("sandboxes:network_explain", args=[world.space_a.id])
    client = world.client_for("carol")
    page = client.get(url, {"destination": "admin.example.com"})
    assert page.status_code == 200
    body = page.content.decode()
    assert "would be refused" in body
    assert "deny entry admin.example.com (deny entries win)" in body
    partial = client.get(url, {"destination": "api.example.com"}, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial
    assert "would be allowed" in partial
    assert "allow entry *.example.com" in partial
    with_session = client.get(url, {"destination": "api.example.com", "session": "nobody"})
    assert with_session.status_code == 400
    assert "No session &#x27;nobody&#x27; in this space." in with_session.content.decode()
    bad = client.get(url, {"destination": "not a host"})
    assert bad.status_code == 400
    assert "give one destination" in bad.content.decode()
    assert world.client_for("charlie").get(url, {"destination": "a.example.com"}).status_code == 404


@pytest.mark.django_db
def test_explain_api_answers_through_every_layer(world: World, e2b_config: SandboxConfig) -> None:
    set_policy(world.space_a, allow_out=["pypi.org"])
    session = Session.objects.create(space=world.space_a, config=e2b_config, key="agent-1")
    SessionGrant.objects.create(session=session, entry="files.example")
    client, headers = agent(world)
    url = f"/api/v1/spaces/{world.space_a.id}/network/explain"
    answer = client.get(url, {"destination": "files.example", "session": "agent-1"}, headers=headers)
    assert answer.status_code == 200, answer.content
    data = answer.json()
    schema = openapi_document("http://testserver/api/v1")
    jsonschema.validate(data, {**schema["components"]["schemas"]["Explanation"], "components": schema["components"]})
    assert data["allowed"] is True
    assert data["rule"] == "allow entry files.example"
    layers: dict[str, str] = {}
    for item in data["layers"]:
        layers.setdefault(item["layer"], item["text"])  # the first line of each layer
    assert layers["space policy"].startswith("refused: not in the allow list")
    assert layers["session grants"].startswith("allowed by this session's grant")
    assert layers["backend"] == "config cloud (E2B) honours this policy (fixed at create)"
    assert client.get(url, {"destination": ""}, headers=headers).json()["error"]["field"] == "destination"
    assert client.get(url, {"destination": "a.example", "session": "nope"}, headers=headers).status_code == 404
    assert client.get(url, {"destination": "a.example"}).status_code == 401
    _, other = do_create_api_token(world.space_b, name="b", actor=Actor(user=world.charlie))
    assert (
        client.get(url, {"destination": "a.example"}, headers={"Authorization": f"Bearer {other}"}).status_code == 404
    )
    json.dumps(data)


@pytest.mark.django_db
def test_the_egress_page_and_the_old_rules_list_keep_their_queries_bounded(
    world: World, django_assert_max_num_queries: Any
) -> None:
    config = make_config(world.space_a)
    rows = []
    for n in range(12):
        session = Session.objects.create(space=world.space_a, config=config, key=f"q{n}", sandbox_id=f"sbx-q{n}")
        SessionGrant.objects.create(session=session, entry=f"g{n}.example")
        rows += [refusal(session.sandbox_id, f"d{n}-{i}.example") for i in range(5)]
    record_refusals(config.backend, rows)
    client = world.client_for("alice")
    url = reverse("sandboxes:egress_list", args=[world.space_a.id])
    client.get(url)  # warm the session and the login
    with django_assert_max_num_queries(12):
        assert client.get(url).status_code == 200
    with django_assert_max_num_queries(6):
        assert len(sessions_keeping_old_rules(world.space_a)) == 12


@pytest.mark.django_db
def test_a_skill_builds_refusals_are_proposed_as_allow_entries_on_the_skill_image_page(world: World) -> None:
    from skills.models import SkillImage

    config = make_config(world.space_a)
    job = AdminJob.objects.create(kind="skills.install", space=world.space_a)
    SkillImage.objects.create(space=world.space_a, config=config, generation=1, status="failed", job=job)
    watch_build_sandbox("sbx-build", space=world.space_a, job=job)
    record_refusals(
        config.backend,
        [
            refusal("sbx-build", "files.pythonhosted.org", layer="dns"),
            refusal("sbx-build", "203.0.113.5:443", layer="packet"),
            refusal("sbx-build", "files.pythonhosted.org", layer="dns"),
        ],
    )
    page = world.client_for("carol").get(reverse("skills:image_detail", args=[world.space_a.id]))
    body = page.content.decode()
    assert 'id="build-refusals"' in body
    assert "<code>files.pythonhosted.org</code>, <code>203.0.113.5/32</code>" in body
    # The Egress page names the build's job for those rows.
    egress = world.client_for("carol").get(reverse("sandboxes:egress_list", args=[world.space_a.id]))
    assert "skill build" in egress.content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_the_policy_form_warns_that_an_allow_entry_on_the_docker_host_opens_nothing(
    world: World, session_config: SandboxConfig
) -> None:
    # Saved all the same (the entry is well formed), but the admin is told the packet filter
    # keeps refusing the host's address whatever the lists say.
    url = reverse("console:network_policy_edit", args=[world.space_a.id])
    data = {"allow_internet_access": "on", "allow_out": "172.17.0.1/32", "deny_out": ""}
    body = world.client_for("alice").post(url, data, follow=True).content.decode()
    assert "Network policy saved" in body
    assert "172.17.0.1/32 holds addresses that are never reachable (an address of the Docker host)" in body


def test_only_entries_holding_a_never_reachable_range_are_named() -> None:
    reserved = (
        reserved_class(ipaddress.ip_network("172.17.0.1/32"), Kind.HOST, "the Docker host"),
        reserved_class(ipaddress.ip_network("172.19.0.0/16"), Kind.SANDBOX, "other sandbox"),
    )
    spec = NetworkSpec.parse(
        allow_internet_access=True,
        allow_public_traffic=False,
        allow_out=["172.16.0.0/12", "203.0.113.0/24", "a.test"],
    )
    found = unreachable_entries(spec, reserved)
    assert found == [
        "172.16.0.0/12 holds addresses that are never reachable (the Docker host, other sandbox); for those it"
        " changes nothing"
    ]
    assert (
        unreachable_entries(NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False), reserved) == []
    )


@pytest.mark.django_db(transaction=True)  # the approval runs on its own connection, as a second request would
def test_an_approval_racing_a_policy_edit_keeps_the_edit(world: World) -> None:
    """An admin saves the policy (adds a deny entry and an allow entry) while another approves
    a refusal for the space: the approval must read the policy it extends under the same lock
    the save holds, or its stale lists overwrite the save (the deny entry silently gone)."""
    import threading
    import time

    from django.db import connection, transaction

    from console.services import do_update_network_policy

    set_policy(world.space_a, allow_out=["pypi.org"])
    event = event_for(world, "files.example")
    outcome: list[object] = []

    def approve() -> None:
        try:
            outcome.append(do_allow_for_space(event, actor=SYSTEM))
        except Exception as exc:  # reported by the assertion below
            outcome.append(exc)
        finally:
            connection.close()

    approver = threading.Thread(target=approve)
    with transaction.atomic():
        do_update_network_policy(
            world.space_a,
            allow_internet_access=True,
            allow_out=["pypi.org", "docs.test"],
            deny_out=["ads.test"],
            l7_rules=[],
            allow_public_traffic=False,
            actor=SYSTEM,
        )
        approver.start()
        time.sleep(1.0)  # the approval reads and waits while the edit is not committed yet
    approver.join(30)
    assert not approver.is_alive()
    assert not isinstance(outcome[0], Exception), outcome
    policy = NetworkPolicy.objects.get(space=world.space_a)
    assert policy.deny_out == ["ads.test"]
    assert policy.allow_out == ["pypi.org", "docs.test", "files.example"]


# --- tenants: forged ids across spaces ------------------------------------------------------


@pytest.mark.django_db
def test_another_spaces_event_under_my_space_is_404_and_changes_nothing(world: World) -> None:
    config_b = make_config(world.space_b)
    session_b = Session.objects.create(space=world.space_b, config=config_b, key="b1", sandbox_id="sbx-b")
    event_b = EgressEvent.objects.create(
        space=world.space_b,
        session=session_b,
        time=timezone.now(),
        sandbox_id="sbx-b",
        layer="dns",
        destination="x.test",
        rule="r",
    )
    client = world.client_for("alice")  # admin of space A only
    for name in ("sandboxes:egress_allow_space", "sandboxes:egress_allow_session"):
        url = reverse(name, args=[world.space_a.id, event_b.id])
        assert client.get(url).status_code == 404
        assert client.post(url).status_code == 404
        assert client.post(reverse(name, args=[world.space_b.id, event_b.id])).status_code == 404
    assert not SessionGrant.objects.exists()
    assert not NetworkPolicy.objects.filter(space=world.space_b, allow_out__contains=["x.test"]).exists()
    grant = SessionGrant.objects.create(session=session_b, entry="x.test")
    config_a = SandboxConfig.objects.filter(space=world.space_a).first() or make_config(world.space_a)
    session_a = Session.objects.create(space=world.space_a, config=config_a, key="a1")
    url = reverse("sandboxes:grant_revoke", args=[session_a.id, grant.id])
    assert client.post(url).status_code == 404
    assert SessionGrant.objects.filter(pk=grant.pk).exists()
