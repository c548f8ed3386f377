"""Writes with side effects for spaces, members and network policies.

Each `do_*` function validates, writes in one transaction and records exactly one audit
event. Views, the agent API, tasks and consumers call these; none of them saves these
models directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone
from django.utils.text import slugify

import netpolicy

from .models import AuditAction, AuditEvent, Membership, NetworkPolicy, Role, Space, SpaceLimits
from .signals import login_sessions_ended, network_policy_changed


class ServiceError(Exception):
    """A refused write, with a message for the user and optional field errors."""

    def __init__(self, message: str, *, field_errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field_errors = field_errors or {}


@dataclass(frozen=True)
class Actor:
    """Who performs a write, and from where. `user` is None for the system (tasks, reaper).
    `token_name` names the API token an agent API call came with ("" for the console)."""

    user: Any = None
    source_ip: str | None = None
    token_name: str = ""

    @property
    def name(self) -> str:
        return self.user.get_username() if self.user is not None else "system"


SYSTEM = Actor()


def actor_from_request(request: HttpRequest) -> Actor:
    user: AbstractBaseUser | AnonymousUser | None = getattr(request, "user", None)
    ip = request.META.get("REMOTE_ADDR") or None
    return Actor(user=user if user is not None and user.is_authenticated else None, source_ip=ip)


def record_audit(
    actor: Actor,
    action: AuditAction,
    *,
    space: Space | None = None,
    target_type: str = "",
    target_id: object = "",
    target_name: str = "",
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """Write one audit row. Called by service functions, inside their transaction.

    `action` must be an `AuditAction`: an unknown string raises ValueError instead of making
    a new action. `target_name` (what the page shows for the target) and the actor's API
    token name are kept in `details`, so the page names them without a query per row."""
    try:
        action = AuditAction(action)
    except ValueError:
        raise ValueError(f"Unknown audit action {action!r}: add it to console.models.AuditAction.") from None
    extra: dict[str, Any] = {}
    if target_name:
        extra["target_name"] = str(target_name)[:200]
    if actor.token_name:
        extra["api_token"] = actor.token_name
    return AuditEvent.objects.create(
        actor=actor.user,
        actor_name=actor.name,
        space=space,
        space_name=space.name if space is not None else "",
        action=action.value,
        target_type=target_type,
        target_id=str(target_id) if target_id != "" else "",
        details={**(details or {}), **extra},
        source_ip=actor.source_ip,
    )


# --- Spaces ------------------------------------------------------------------------------


def unique_slug(name: str) -> str:
    base = slugify(name)[:50] or "space"
    slug, n = base, 2
    while Space.objects.filter(slug=slug).exists():
        slug, n = f"{base}-{n}", n + 1
    return slug


def refuse_taken_space_name(name: str, *, space: Space | None = None) -> None:
    """A space name is unique, ignoring case (`space_name_unique_ci`): a field error if taken."""
    others = Space.objects.filter(name__iexact=name.strip())
    if space is not None:
        others = others.exclude(pk=space.pk)
    if others.exists():
        message = f"There is already a space named {name.strip()!r}."
        raise ServiceError(message, field_errors={"name": [message]})


def do_create_space(*, name: str, slug: str = "", description: str = "", actor: Actor) -> Space:
    """Create a space with an explicit, closed network policy; the creator becomes its admin."""
    refuse_taken_space_name(name)
    slug = slug or unique_slug(name)
    try:
        with transaction.atomic():
            space = Space.objects.create(name=name, slug=slug, description=description)
            NetworkPolicy.objects.create(
                space=space,
                allow_internet_access=False,
                allow_out=[],
                deny_out=[],
                l7_rules=[],
                allow_public_traffic=False,
            )
            if actor.user is not None and not actor.user.is_superuser:
                Membership.objects.create(user=actor.user, space=space, role=Role.ADMIN)
            record_audit(
                actor,
                AuditAction.SPACE_CREATE,
                space=space,
                target_type="space",
                target_id=space.id,
                target_name=space.name,
                details={"name": name, "slug": slug},
            )
    except IntegrityError:
        refuse_taken_space_name(name)  # a racing creation took the name
        raise ServiceError("A space with this slug already exists.", field_errors={"slug": ["already taken"]}) from None
    return space


SPACE_FIELDS = ("name", "slug", "description")


def do_update_space(space: Space, *, actor: Actor, **changes: str) -> Space:
    changed = {k: v for k, v in changes.items() if k in SPACE_FIELDS and getattr(space, k) != v}
    if not changed:
        return space
    if "name" in changed:
        refuse_taken_space_name(changed["name"], space=space)
    before = {k: getattr(space, k) for k in changed}
    try:
        with transaction.atomic():
            for key, value in changed.items():
                setattr(space, key, value)
            space.save(update_fields=list(changed))
            record_audit(
                actor,
                AuditAction.SPACE_UPDATE,
                space=space,
                target_type="space",
                target_id=space.id,
                target_name=space.name,
                details={"before": before, "after": changed},
            )
    except IntegrityError:
        space.refresh_from_db()
        if "name" in changed:
            refuse_taken_space_name(changed["name"], space=space)
        raise ServiceError("A space with this slug already exists.", field_errors={"slug": ["already taken"]}) from None
    return space


def do_update_space_limits(space: Space, *, actor: Actor, **values: int | None) -> SpaceLimits:
    """Set a space's quotas and rate limits (None: the platform default). Platform admins only
    (the caller checks); audited with the values before and after."""
    unknown = set(values) - set(SpaceLimits.LIMIT_FIELDS)
    if unknown:
        raise ServiceError(f"Unknown limit(s): {', '.join(sorted(unknown))}.")
    bad = {name: ["a whole number, 0 or more"] for name, v in values.items() if v is not None and int(v) < 0}
    if bad:
        raise ServiceError("Limits are whole numbers, 0 or more.", field_errors=bad)
    with transaction.atomic():
        limits, _ = SpaceLimits.objects.select_for_update().get_or_create(space=space)
        before = {name: getattr(limits, name) for name in SpaceLimits.LIMIT_FIELDS}
        for name, value in values.items():
            setattr(limits, name, value)
        limits.save()
        after = {name: getattr(limits, name) for name in SpaceLimits.LIMIT_FIELDS}
        if after != before:
            record_audit(
                actor,
                AuditAction.SPACE_LIMITS,
                space=space,
                target_type="space",
                target_id=space.id,
                target_name=space.name,
                details={"before": before, "after": after},
            )
    return limits


def do_delete_space(space: Space, *, actor: Actor, details: dict[str, Any] | None = None) -> None:
    """Delete a space's rows. Its sandboxes, volumes, snapshots and networks are deleted
    first by the teardown job (`sandboxes.sessions.teardown`), which calls this last and
    passes what it deleted (`details`)."""
    with transaction.atomic():
        record_audit(
            actor,
            AuditAction.SPACE_DELETE,
            space=None,
            target_type="space",
            target_id=space.id,
            target_name=space.name,
            details={"name": space.name, "slug": space.slug, **(details or {})},
        )
        space.delete()


# --- Members -----------------------------------------------------------------------------


def _admin_count(space: Space) -> int:
    return Membership.objects.filter(space=space, role=Role.ADMIN).count()


def do_add_member(space: Space, *, user: Any, role: Role, actor: Actor) -> Membership:
    if Membership.objects.filter(space=space, user=user).exists():
        raise ServiceError(f"{user.get_username()} is already a member of {space.name}.")
    with transaction.atomic():
        membership = Membership.objects.create(space=space, user=user, role=role)
        record_audit(
            actor,
            AuditAction.MEMBER_ADD,
            space=space,
            target_type="user",
            target_id=user.pk,
            target_name=user.get_username(),
            details={"username": user.get_username(), "role": role},
        )
    return membership


def do_change_member_role(membership: Membership, *, role: Role, actor: Actor) -> Membership:
    if membership.role == role:
        return membership
    with transaction.atomic():
        locked = Membership.objects.select_for_update().get(pk=membership.pk)
        if locked.role == Role.ADMIN and role != Role.ADMIN and _admin_count(locked.space) <= 1:
            raise ServiceError("A space keeps at least one admin: promote someone else first.")
        before = locked.role
        locked.role = role
        locked.save(update_fields=["role"])
        record_audit(
            actor,
            AuditAction.MEMBER_ROLE,
            space=locked.space,
            target_type="user",
            target_id=locked.user_id,
            target_name=locked.user.get_username(),
            details={"username": locked.user.get_username(), "before": before, "after": role},
        )
    return locked


def do_remove_member(membership: Membership, *, actor: Actor) -> None:
    with transaction.atomic():
        locked = Membership.objects.select_for_update().get(pk=membership.pk)
        if locked.role == Role.ADMIN and _admin_count(locked.space) <= 1:
            raise ServiceError("A space keeps at least one admin: promote someone else first.")
        record_audit(
            actor,
            AuditAction.MEMBER_REMOVE,
            space=locked.space,
            target_type="user",
            target_id=locked.user_id,
            target_name=locked.user.get_username(),
            details={"username": locked.user.get_username(), "role": locked.role},
        )
        locked.delete()


# --- Login sessions ----------------------------------------------------------------------

SERVER_SIDE_SESSION_ENGINES = ("django.contrib.sessions.backends.db", "django.contrib.sessions.backends.cached_db")


def end_login_sessions(user: Any) -> int:
    """Delete every live login session of `user` and (once the caller's transaction commits)
    close their terminals. Returns how many sessions were ended. Call inside a transaction.

    Needs a session engine that keeps sessions in the database (the default): only there
    can a user's sessions be found."""
    from importlib import import_module

    from django.contrib.sessions.models import Session as LoginSession

    if settings.SESSION_ENGINE not in SERVER_SIDE_SESSION_ENGINES:
        raise ServiceError("Ending a user's login sessions needs sessions stored in the database (SESSION_ENGINE).")
    engine = import_module(settings.SESSION_ENGINE)
    live = LoginSession.objects.filter(expire_date__gt=timezone.now())
    keys = [row.session_key for row in live.iterator() if row.get_decoded().get(SESSION_KEY) == str(user.pk)]
    for key in keys:
        engine.SessionStore(session_key=key).delete()  # cached_db: the cache copy too
    login_sessions_ended.send(sender=end_login_sessions, user_id=user.pk)
    return len(keys)


def do_logout_everywhere(user: Any, *, actor: Actor) -> int:
    """End every login session of `user`, the caller's own included, and (once committed)
    close the user's terminals. Returns how many sessions were ended."""
    with transaction.atomic():
        ended = end_login_sessions(user)
        record_audit(
            actor,
            AuditAction.USER_LOGOUT_EVERYWHERE,
            target_type="user",
            target_id=user.pk,
            target_name=user.get_username(),
            details={"username": user.get_username(), "sessions_ended": ended},
        )
    return ended


# --- Network policy ----------------------------------------------------------------------


def policy_snapshot(policy: NetworkPolicy) -> dict[str, Any]:
    return {
        "allow_internet_access": policy.allow_internet_access,
        "allow_out": list(policy.allow_out),
        "deny_out": list(policy.deny_out),
        "allow_private": list(policy.allow_private),
        "l7_rules": list(policy.l7_rules),
        "allow_public_traffic": policy.allow_public_traffic,
    }


def do_update_network_policy(
    space: Space,
    *,
    allow_internet_access: bool,
    allow_out: list[str],
    deny_out: list[str],
    l7_rules: list[object],
    allow_public_traffic: bool,
    actor: Actor,
    allow_private: list[str] | None = None,
    audit_action: AuditAction = AuditAction.NETWORK_POLICY_UPDATE,
    audit_details: dict[str, Any] | None = None,
) -> netpolicy.Validation:
    """Validate and save the policy. Raises ServiceError with field errors; returns warnings.

    `allow_private` None keeps the stored exceptions. Once committed, `network_policy_changed`
    is sent (the sandboxes app applies the policy to running sandboxes that take it live).
    An approval passes its own `audit_action` and details: still one audit row."""
    with transaction.atomic():
        policy, _ = NetworkPolicy.objects.select_for_update().get_or_create(space=space)
        validation = netpolicy.validate(
            allow_internet_access=allow_internet_access,
            allow_out=allow_out,
            deny_out=deny_out,
            l7_rules=l7_rules,
            allow_private=list(policy.allow_private) if allow_private is None else allow_private,
        )
        if validation.errors:
            raise ServiceError("The network policy has errors.", field_errors=validation.errors)
        before = policy_snapshot(policy)
        policy.allow_internet_access = allow_internet_access
        texts = validation.texts
        policy.allow_out = texts["allow_out"]
        policy.deny_out = texts["deny_out"]
        policy.allow_private = texts["allow_private"]
        policy.l7_rules = texts["l7_rules"]
        policy.allow_public_traffic = allow_public_traffic
        policy.save()
        after = policy_snapshot(policy)
        record_audit(
            actor,
            audit_action,
            space=space,
            target_type="network_policy",
            target_id=space.id,
            target_name=space.name,
            details={"before": before, "after": after, "warnings": validation.warnings, **(audit_details or {})},
        )
        if before != after:
            transaction.on_commit(lambda: network_policy_changed.send(sender=NetworkPolicy, space=space, actor=actor))
    return validation


def policy_warnings(policy: NetworkPolicy) -> list[str]:
    return netpolicy.validate(
        allow_internet_access=policy.allow_internet_access,
        allow_out=list(policy.allow_out),
        deny_out=list(policy.deny_out),
        l7_rules=list(policy.l7_rules),
        allow_private=list(policy.allow_private),
    ).warnings


# --- Secrets at rest ---------------------------------------------------------------------


@dataclass(frozen=True)
class RotationReport:
    """What a key rotation did: tokens re-encrypted, and those no configured key could read."""

    rotated: int
    unreadable: list[str]


def encrypted_fields() -> list[tuple[Any, str]]:
    """(model, field name) of every stored secret: by convention, fields named `*_encrypted`."""
    from django.apps import apps

    return [
        (model, field.name)
        for model in apps.get_models()
        for field in model._meta.get_fields()
        if field.name.endswith("_encrypted") and getattr(field, "concrete", False)
    ]


def do_rotate_field_encryption(*, actor: Actor, legacy_secret_keys: tuple[str, ...] = ()) -> RotationReport:
    """Re-encrypt every stored secret with FIELD_ENCRYPTION_KEY.

    Tokens are read with FIELD_ENCRYPTION_KEY, FIELD_ENCRYPTION_OLD_KEYS and the keys earlier
    consoles derived from `legacy_secret_keys`; one that none reads is left as it is and
    reported. One audit row for the whole pass.
    """
    from .crypto import SecretUnreadable, derived_key, rotate

    extra = tuple(derived_key(secret) for secret in legacy_secret_keys)
    rotated, unreadable = 0, []
    with transaction.atomic():
        for model, field in encrypted_fields():
            rows = model.objects.select_for_update().exclude(**{field: ""}).values_list("pk", field)
            for pk, token in rows:
                try:
                    fresh = rotate(token, extra_old_keys=extra)
                except SecretUnreadable:
                    unreadable.append(f"{model._meta.label}:{pk}.{field}")
                    continue
                model.objects.filter(pk=pk).update(**{field: fresh})
                rotated += 1
        record_audit(
            actor,
            AuditAction.SECRETS_ROTATE,
            target_type="field_encryption_key",
            details={"rotated": rotated, "unreadable": unreadable},
        )
    return RotationReport(rotated, unreadable)
