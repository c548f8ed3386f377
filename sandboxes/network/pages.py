"""The space's network pages: the policy form (with what its configs can honour, the
sessions keeping older rules and the explain form), the Egress log with its approvals, and
session grants. Routed as `console:network_policy_edit` (the page moved here: it needs the
configs) and `sandboxes:egress_*`.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, time
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseClientRedirect

from console.access import get_space_for_user
from console.forms import NetworkPolicyForm
from console.keyset import keyset_page
from console.models import NetworkPolicy, Role, Space
from console.panels import SpacePanel
from console.services import ServiceError, actor_from_request, do_update_network_policy, policy_warnings
from netpolicy import PolicyError, parse_destination

from ..catalog.network import network_spec_for, space_policy
from ..models import EgressEvent, Session, SessionGrant
from ..sessions.access import get_session_for_user
from ..sessions.panels import ARTIFACTS, SessionPanel
from .advice import advice_rows, event_advice, explain_for
from .approvals import do_allow_for_session, do_allow_for_space, do_revoke_grant
from .checks import backend_views, policy_backend_warnings
from .live import bound_sessions, sessions_keeping_old_rules
from .log import EGRESS_ORDER, events_for_space

LAYERS = ("dns", "packet", "http", "tls")
PAGE_SIZE = 50


def _is_htmx(request: HttpRequest) -> bool:
    return bool(getattr(request, "htmx", False))


class SessionKeyField(forms.CharField):
    """A session of the space by its key (a text field: a space may hold many sessions)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=128, required=False, **kwargs)
        self.space: Space | None = None

    def clean(self, value: Any) -> Any:
        key = (super().clean(value) or "").strip()
        if not key:
            return None
        session = Session.objects.filter(space=self.space, key=key).first()
        if session is None:
            raise forms.ValidationError(f"No session {key!r} in this space.")
        return session


class ExplainForm(forms.Form):
    destination = forms.CharField(
        max_length=500,
        help_text="A domain, an address, host:port or an http(s) URL. Names are matched, never resolved.",
    )
    session = SessionKeyField(help_text="A session key: its grants count too. Empty: the space's policy alone.")

    def __init__(self, *args: Any, space: Space, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["session"].space = space  # type: ignore[attr-defined]

    def clean_destination(self) -> Any:
        try:
            return parse_destination(self.cleaned_data["destination"])
        except PolicyError as exc:
            raise forms.ValidationError(str(exc)) from None


def _policy_context(space: Space, policy: NetworkPolicy, form: NetworkPolicyForm) -> dict[str, Any]:
    return {
        "space": space,
        "form": form,
        "policy": policy,
        "backends": backend_views(space, network_spec_for(space)),
        "old_rules": sessions_keeping_old_rules(space),
        "explain_form": ExplainForm(space=space),
        "section": "spaces",
    }


@login_required
@require_http_methods(["GET", "POST"])
def network_policy_edit(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    policy = space_policy(space)
    if request.method == "POST":
        form = NetworkPolicyForm(request.POST)
        if form.is_valid():
            try:
                validation = do_update_network_policy(
                    space,
                    allow_internet_access=form.cleaned_data["allow_internet_access"],
                    allow_out=form.cleaned_data["allow_out"],
                    deny_out=form.cleaned_data["deny_out"],
                    l7_rules=form.cleaned_data["l7_rules"],
                    allow_public_traffic=form.cleaned_data["allow_public_traffic"],
                    allow_private=form.cleaned_data["allow_private"],
                    actor=actor_from_request(request),
                )
            except ServiceError as exc:
                for field, errors in exc.field_errors.items():
                    for error in errors:
                        form.add_error(field if field in form.fields else None, error)
                if not exc.field_errors:
                    form.add_error(None, exc.message)
            else:
                messages.success(request, "Network policy saved.")
                live = Counter(bound_sessions(space).values_list("config__name", flat=True))
                for warning in validation.warnings + policy_backend_warnings(
                    space, network_spec_for(space), live_sessions=dict(live)
                ):
                    messages.warning(request, warning)
                target = reverse("console:space_detail", kwargs={"space_id": space.id}) + "#network"
                # An HTMX form post must not follow the redirect into its own fragment.
                return HttpResponseClientRedirect(target) if _is_htmx(request) else redirect(target)
    else:
        form = NetworkPolicyForm(initial=NetworkPolicyForm.initial_from_policy(policy))
    if _is_htmx(request):
        context = {"space": space, "form": form, "policy": policy}
        return render(request, "console/partials/network_policy_form.html", context, status=400 if form.errors else 200)
    return render(
        request,
        "console/network_policy_form.html",
        _policy_context(space, policy, form),
        status=400 if form.errors else 200,
    )


@login_required
@require_safe
def network_explain(request: HttpRequest, space_id: str) -> HttpResponse:
    """Would a destination be allowed, and by which rule? (reads only)"""
    space = get_space_for_user(request.user, space_id, Role.VIEWER)
    form = ExplainForm(request.GET or None, space=space)
    answer = (
        explain_for(space, form.cleaned_data["destination"], form.cleaned_data.get("session"))
        if form.is_valid()
        else None
    )
    context = {"space": space, "explain_form": form, "answer": answer, "section": "spaces"}
    template = "sandboxes/partials/explain_result.html" if _is_htmx(request) else "sandboxes/network_explain.html"
    return render(request, template, context, status=400 if form.errors else 200)


class EgressFilterForm(forms.Form):
    session = SessionKeyField(help_text="A session key")
    layer = forms.ChoiceField(choices=[("", "All layers"), *[(layer, layer) for layer in LAYERS]], required=False)
    destination = forms.CharField(required=False, max_length=200)
    date_from = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    date_to = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args: Any, space: Space, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["session"].space = space  # type: ignore[attr-defined]

    def filters(self) -> dict[str, Any] | None:
        """The filters, {} when none are given, None when they are invalid (nothing matches)."""
        if not self.is_bound:
            return {}
        if not self.is_valid():
            return None
        data = self.cleaned_data
        tz = timezone.get_current_timezone()
        return {
            "session": data.get("session"),
            "layer": data.get("layer"),
            "destination": data.get("destination", "").strip(),
            "since": datetime.combine(data["date_from"], time.min, tz) if data.get("date_from") else None,
            "until": datetime.combine(data["date_to"], time.max, tz) if data.get("date_to") else None,
        }


@login_required
@require_safe
def egress_list(request: HttpRequest, space_id: str) -> HttpResponse:
    # The policy comes with the space: the admins' advice reads it.
    space = get_space_for_user(request.user, space_id, Role.VIEWER, related=("network_policy",))
    form = EgressFilterForm(request.GET or None, space=space)
    filters = form.filters()
    rows = events_for_space(space, filters=filters) if filters is not None else EgressEvent.objects.none()
    page = keyset_page(request, rows, EGRESS_ORDER, PAGE_SIZE)
    is_admin = space.user_role == Role.ADMIN  # type: ignore[attr-defined]
    events = list(page.object_list)
    context = {
        "space": space,
        "form": form,
        "page": page,
        # Only admins see the advice (approve buttons): others skip reading what it needs.
        "rows": advice_rows(space, events, policy=read_policy(space)) if is_admin else [(e, None) for e in events],
        "is_admin": is_admin,
        "query": page.first,  # the filters, for the empty state's words
        "section": "spaces",
    }
    template = "sandboxes/partials/egress_results.html" if _is_htmx(request) else "sandboxes/egress_list.html"
    return render(request, template, context)


def _event(request: HttpRequest, space_id: str, event_id: str) -> EgressEvent:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    return get_object_or_404(EgressEvent.objects.select_related("space", "session"), pk=event_id, space=space)


def _approve(request: HttpRequest, space_id: str, event_id: str, scope: str) -> HttpResponse:
    event = _event(request, space_id, event_id)
    advice = event_advice(event)
    back = reverse("sandboxes:egress_list", kwargs={"space_id": event.space_id})
    if request.method == "POST":
        try:
            if scope == "space":
                done = do_allow_for_space(event, actor=actor_from_request(request))
                messages.success(
                    request,
                    f"{done.entry} allowed for the space. Saved and applied to running sessions that take it live.",
                )
            else:
                grant = do_allow_for_session(event, actor=actor_from_request(request))
                messages.success(request, f"{grant.entry} allowed for session {grant.session.key} until it ends.")
        except ServiceError as exc:
            messages.error(request, exc.message)
        return redirect(back)
    context = {"space": event.space, "event": event, "advice": advice, "scope": scope, "back": back}
    return render(request, "sandboxes/egress_approve.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def egress_allow_space(request: HttpRequest, space_id: str, event_id: str) -> HttpResponse:
    return _approve(request, space_id, event_id, "space")


@login_required
@require_http_methods(["GET", "POST"])
def egress_allow_session(request: HttpRequest, space_id: str, event_id: str) -> HttpResponse:
    return _approve(request, space_id, event_id, "session")


@login_required
@require_POST
def grant_revoke(request: HttpRequest, session_id: str, grant_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.ADMIN)
    grant = get_object_or_404(SessionGrant, pk=grant_id, session=session)
    do_revoke_grant(grant, actor=actor_from_request(request))
    messages.success(request, f"The grant for {grant.entry} was removed.")
    return redirect(session)


def read_policy(space: Space) -> NetworkPolicy | None:
    """The policy read with the space (select_related), None if it has none yet."""
    try:
        return space.network_policy
    except NetworkPolicy.DoesNotExist:
        return None


# --- Panels of other pages (registered in SandboxesConfig.ready()) ---------------------------


def _space_network(request: HttpRequest, space: Space, is_admin: bool) -> dict[str, Any]:
    policy = space_policy(space)
    return {"policy": policy, "policy_lines": policy.describe(), "policy_warnings": policy_warnings(policy)}


# The space page's Network policy card.
SPACE_PANEL = SpacePanel("sandboxes/partials/space_network.html", _space_network, order=10)


def _session_egress(request: HttpRequest, session: Session, can_use: bool) -> dict[str, Any]:
    events = list(session.egress_events.select_related("session")[:20])
    return {"egress_events": advice_rows(session.space, events), "egress_grants": session.egress_grants.all()}


# The session page's Egress card, after its Artifacts.
SESSION_PANEL = SessionPanel("egress", "sandboxes/partials/session_egress.html", _session_egress, after=ARTIFACTS)
