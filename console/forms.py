"""Forms of the console app."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib.auth import get_user_model

import netpolicy

from .models import Role, Space, users_with_email


def lines(text: str) -> list[str]:
    """Non-empty, stripped lines; '#' starts a comment line."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


class SpaceForm(forms.ModelForm):
    slug = forms.SlugField(
        required=False,
        max_length=63,
        help_text="Lowercase letters, digits and hyphens. Left empty: made from the name.",
    )

    class Meta:
        model = Space
        fields = ["name", "slug", "description"]
        widgets = {"description": forms.Textarea(attrs={"rows": 3})}

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not name:
            raise forms.ValidationError("Give the space a name.")
        taken = Space.objects.filter(name__iexact=name)
        if self.instance.pk is not None:
            taken = taken.exclude(pk=self.instance.pk)
        if taken.exists():
            raise forms.ValidationError(f"There is already a space named {name!r}.")
        return name


def find_user(identifier: str) -> Any:
    """The one active user whose username (exactly, else ignoring case) or email is
    `identifier`; a ValidationError saying why otherwise (unknown, ambiguous, deactivated)."""
    model = get_user_model()
    identifier = identifier.strip()
    if not identifier:
        raise forms.ValidationError("Give a username or an email address.")
    user = model.objects.filter(username=identifier).first()
    if user is None:
        by_name = list(model.objects.filter(username__iexact=identifier)[:2])
        by_email = list(model.objects.filter(email__iexact=identifier)[:2]) if "@" in identifier else []
        found = by_name if len(by_name) == 1 else by_email
        if len(by_email) > 1 or len(by_name) > 1:
            raise forms.ValidationError(
                f"Several users match {identifier!r}: add them by username instead.", code="ambiguous"
            )
        if not found:
            raise forms.ValidationError(f"No user has the username or email {identifier!r}.", code="unknown")
        user = found[0]
    if not user.is_active:
        raise forms.ValidationError(
            f"{user.get_username()} is deactivated: a platform admin can reactivate them on the Users page.",
            code="deactivated",
        )
    return user


class MemberAddForm(forms.Form):
    username = forms.CharField(
        max_length=254, label="Username or email", widget=forms.TextInput(attrs={"placeholder": "username or email"})
    )
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)

    def clean_username(self) -> Any:
        return find_user(self.cleaned_data["username"])


class UserCreateForm(forms.Form):
    username = forms.CharField(max_length=150, help_text="Letters, digits and @/./+/-/_ only.")
    email = forms.EmailField(required=False, help_text="Optional. The invitation is emailed here when email is set up.")
    first_name = forms.CharField(max_length=150, required=False)
    last_name = forms.CharField(max_length=150, required=False)
    platform_admin = forms.BooleanField(
        required=False, label="Platform admin", help_text="Sees and administers every space, backend and user."
    )

    def clean_email(self) -> str:
        email: str = self.cleaned_data["email"].strip()
        if email and users_with_email(email).exists():
            raise forms.ValidationError(f"Another user has the email {email!r}.")
        return email


class UserFilterForm(forms.Form):
    q = forms.CharField(required=False, label="Search")
    status = forms.ChoiceField(required=False, choices=[("", "Any status")])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from .users import UserStatus

        super().__init__(*args, **kwargs)
        self.fields["status"].choices = [("", "Any status"), *UserStatus.CHOICES]  # type: ignore[attr-defined]


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


LIST_HELP = (
    "One entry per line: a CIDR (10.0.0.0/8), an IP address, or a domain. A plain domain (example.com) is the"
    " name AND all its subdomains (api.example.com, a.b.example.com); *.example.com is its subdomains only,"
    " never example.com itself."
)


class NetworkPolicyForm(forms.Form):
    allow_internet_access = forms.BooleanField(
        required=False,
        label="Outbound internet access",
        help_text="Unchecked: sandboxes get no network at all, whatever the lists below say.",
    )
    allow_out = forms.CharField(
        required=False,
        label="Allow outbound",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text=LIST_HELP + " Empty: every destination but the always-denied ones (this host, other sandboxes,"
        " link-local and metadata addresses, loopback, private ranges). Not empty: ONLY these destinations are"
        " reachable.",
    )
    deny_out = forms.CharField(
        required=False,
        label="Deny outbound",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text=LIST_HELP + " Always refused: a deny entry wins over an allow entry that also matches.",
    )
    allow_private = forms.CharField(
        required=False,
        label="Private addresses also allowed",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
        help_text=(
            "One CIDR per line inside a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10,"
            " fc00::/7, ...):"
            " exceptions to the always-denied private ranges. They never turn the allow list on;"
            " deny entries still win."
        ),
    )
    l7_rules = forms.CharField(
        required=False,
        label="HTTP (L7) rules",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text=(
            "One rule per line, checked in order, first match wins: "
            "'allow|deny DOMAIN [METHODS|*] [PATH-PREFIX]', e.g. 'allow api.github.com GET,POST /repos/'."
            " Where HTTPS is checked by host name only (SNI, no decryption), methods and paths cannot be"
            " seen: an allow rule lets every HTTPS request to its host through, a deny rule with methods"
            " or a path does not apply to HTTPS."
        ),
    )
    allow_public_traffic = forms.BooleanField(
        required=False,
        label="Public inbound traffic",
        help_text="Unchecked: callers of a sandbox's exposed ports need its traffic token.",
    )

    warnings: list[str]

    @classmethod
    def initial_from_policy(cls, policy: Any) -> dict[str, Any]:
        return {
            "allow_internet_access": policy.allow_internet_access,
            "allow_out": "\n".join(policy.allow_out),
            "deny_out": "\n".join(policy.deny_out),
            "allow_private": "\n".join(policy.allow_private),
            "l7_rules": "\n".join(netpolicy.parse_l7_rule(rule).as_line() for rule in policy.l7_rules),
            "allow_public_traffic": policy.allow_public_traffic,
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        self.warnings = []
        if self.errors:
            return cleaned
        cleaned["allow_out"] = lines(cleaned.get("allow_out", ""))
        cleaned["deny_out"] = lines(cleaned.get("deny_out", ""))
        cleaned["allow_private"] = lines(cleaned.get("allow_private", ""))
        cleaned["l7_rules"] = lines(cleaned.get("l7_rules", ""))
        validation = netpolicy.validate(
            allow_internet_access=cleaned.get("allow_internet_access", False),
            allow_out=cleaned["allow_out"],
            deny_out=cleaned["deny_out"],
            l7_rules=list(cleaned["l7_rules"]),
            allow_private=cleaned["allow_private"],
        )
        for field_name, messages in validation.errors.items():
            for message in messages:
                self.add_error(field_name, message)
        self.warnings = validation.warnings
        return cleaned


class ListedSpaceField(forms.ChoiceField):
    """A choice among spaces read once: the choices and the check of the chosen one both use
    the one list (a ModelChoiceField would read the spaces again for each)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(choices=[("", "All spaces")], **kwargs)
        self.spaces: dict[str, Space] = {}

    def set_spaces(self, spaces: Iterable[Space]) -> None:
        self.spaces = {str(space.pk): space for space in spaces}
        self.choices = [("", "All spaces"), *((key, space.name) for key, space in self.spaces.items())]

    def clean(self, value: Any) -> Space | None:
        chosen = super().clean(value)
        return self.spaces[chosen] if chosen else None


class AuditFilterForm(forms.Form):
    space = ListedSpaceField(required=False)
    actor = forms.CharField(required=False, max_length=150)
    action = forms.CharField(
        required=False,
        max_length=64,
        widget=forms.TextInput(attrs={"list": "audit-actions"}),
        help_text="prefix",
    )
    date_from = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    date_to = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args: Any, spaces: Iterable[Space], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["space"].set_spaces(spaces)  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        start, end = cleaned.get("date_from"), cleaned.get("date_to")
        if start and end and start > end:
            self.add_error("date_to", "The end date is before the start date.")
        return cleaned


class SpaceLimitsForm(forms.Form):
    """A space's quotas; a blank field means the platform default (shown as its placeholder)."""

    LABELS = {
        "live_sessions": "Live sessions",
        "concurrent_execs": "Concurrent execs",
        "background_commands": "Running background commands",
        "api_requests_per_minute": "API requests per minute, per space (all its tokens together)",
    }

    def __init__(self, *args: Any, defaults: dict[str, int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, label in self.LABELS.items():
            self.fields[name] = forms.IntegerField(
                label=label,
                required=False,
                min_value=0,
                max_value=1_000_000,
                help_text=f"Blank: the platform default ({defaults[name]}). 0 refuses every call.",
                widget=forms.NumberInput(attrs={"placeholder": str(defaults[name])}),
            )
