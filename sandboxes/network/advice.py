"""What a refusal offers an admin, decided in ONE place for every page and answer that shows
it (the session page, the space's Egress page, explain's page and API answer, the approvals
themselves): `refusal_advice`, built on `netpolicy.advise` over the space's current spec (a
session's grants too, for a session's approval) and the backends' never-reachable ranges.

The offers: allow for the space or for the session (an allow entry, or a private exception
where the space allows everything else), edit the deny list, edit the HTTP rules, or nothing
with the reason ("the Docker host and other sandboxes are never reachable", "allowed by the
current policy already", ...). An approval is only offered when deciding again with its
entry lets the destination through, so an approval never answers "applied" for a change
enforcement would not make.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from console.models import NetworkPolicy, Space
from netpolicy import AddressClass, Advice, Destination, PolicyError, advise, parse_destination

from ..backends.base import NetworkSpec, RemoteError
from ..catalog.bridge import get_backend
from ..catalog.network import network_spec_for
from ..models import EgressEvent, SandboxConfig, Session
from .checks import backend_views
from .explain import Explanation, explain, reserved_of


def reserved_for(space: Space) -> tuple[AddressClass, ...]:
    """The never-reachable ranges of the backends the space's configs run on (the Docker
    host's addresses, other sandboxes' networks), from `EgressCapability.reserved()`; a
    backend that does not answer adds none."""
    found: list[AddressClass] = []
    for config in SandboxConfig.objects.filter(space=space).select_related("backend"):
        try:
            egress = get_backend(config).egress()
            found.extend(egress.reserved() if egress is not None else ())
        except RemoteError:
            continue
    return tuple(dict.fromkeys(found))


def destination_of(text: str) -> Destination | None:
    """A refusal's destination as something an entry can name, or None."""
    try:
        return parse_destination(text)
    except PolicyError:
        return None


def refusal_advice(
    space: Space,
    destination: str | Destination | None,
    *,
    rule: str = "",
    session: Session | None = None,
    spec: NetworkSpec | None = None,
    reserved: Sequence[AddressClass] | None = None,
) -> Advice:
    """What a refusal of `destination` (recorded with the words `rule`, when read from a log)
    offers under the space's current policy (with `session`'s grants, for its approval).
    `spec` and `reserved`, when given, save computing them again for each row of a page."""
    if isinstance(destination, str):
        destination = destination_of(destination)
    if spec is None:
        spec = network_spec_for(space, session)
    if reserved is None:
        reserved = reserved_for(space)
    return advise(spec, destination, refused_with=rule, reserved=reserved)


def event_advice(event: EgressEvent, **known: Any) -> Advice:
    """The advice for one logged refusal (its destination and the words it was refused with)."""
    return refusal_advice(event.space, event.destination, rule=event.rule, **known)


def advice_rows(
    space: Space, events: Sequence[EgressEvent], *, policy: NetworkPolicy | None = None
) -> list[tuple[EgressEvent, Advice]]:
    """Each refusal with its advice (the space's spec and reserved ranges computed once;
    `policy` is the space's row when the caller has just read it)."""
    if not events:
        return []
    spec, reserved = network_spec_for(space, policy=policy), reserved_for(space)
    return [
        (event, refusal_advice(space, event.destination, rule=event.rule, spec=spec, reserved=reserved))
        for event in events
    ]


def explain_for(space: Space, target: Destination, session: Session | None = None) -> Explanation:
    """Explain's answer for the space (and a session's grants), with what a refusal of the
    destination would offer: the one answer the policy page and the API give."""
    space_spec = network_spec_for(space)
    session_spec = network_spec_for(space, session) if session is not None else None
    grants = tuple(session.egress_grants.values_list("entry", flat=True)) if session is not None else ()
    views = tuple(backend_views(space, session_spec or space_spec))
    reserved = reserved_of(views)
    answer = explain(target, space_spec, session_spec=session_spec, grants=grants, backends=views, reserved=reserved)
    answer.advice = refusal_advice(space, target, session=session, spec=session_spec or space_spec, reserved=reserved)
    return answer
