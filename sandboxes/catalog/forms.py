"""Forms of the sandboxes app."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.core.exceptions import ValidationError

from console.crypto import REDACTED
from console.models import Space

from ..backends import BACKEND_CLASSES, describe
from ..backends.base import KindDescription, RemoteError, is_snapshot_id
from ..backends.guard import check_endpoint
from ..backends.unix_socket import SCHEME as UNIX_SCHEME
from ..backends.unix_socket import unix_socket_problem
from ..models import PlatformBackend, SandboxConfig
from .by_kind import ByKindForm
from .platform import BACKEND_FIELDS, granted_backends
from .services import CONFIG_FIELDS

DEBIAN_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$|^localhost$")


class SecretInput(forms.PasswordInput):
    """A secret's field: shows *** when one is stored, and never what was typed (a form that
    fails validation would otherwise echo a new key back into the page)."""

    def __init__(self, *, stored: bool = False) -> None:
        super().__init__(attrs={"autocomplete": "new-password"}, render_value=True)
        self.stored = stored

    def get_context(self, name: str, value: Any, attrs: Any) -> dict[str, Any]:
        return super().get_context(name, REDACTED if self.stored else None, attrs)


class SecretTextarea(forms.Textarea):
    """PEM material (TLS client key, certificate, CA): never rendered, typed or stored."""

    def __init__(self) -> None:
        super().__init__(attrs={"rows": 3, "spellcheck": "false", "autocomplete": "off"})

    def get_context(self, name: str, value: Any, attrs: Any) -> dict[str, Any]:
        return super().get_context(name, None, attrs)


class TemplateChoiceField(forms.ChoiceField):
    """The template picker: a posted snapshot id is named as such, not as an unknown choice."""

    def validate(self, value: Any) -> None:
        if value and is_snapshot_id(str(value)):
            raise forms.ValidationError("Snapshot ids (snap-…) are not templates; pick a template.")
        super().validate(value)


# Config fields that only some kinds take, and the KindDescription flag that says which.
KIND_CONFIG_FIELDS = {
    "api_key": "takes_api_key",
    "protocol_pin": "versioned_protocol",
    "pids_limit": "limits_processes",
    "disk_mb": "limits_disk",
}
# What a field the chosen kind does not take is saved as (None: left as it is).
NEUTRAL_VALUES: dict[str, Any] = {"protocol_pin": "", "api_key": None}


def chosen_backend(space: Space, value: Any) -> PlatformBackend | None:
    """The backend a form names, if it is granted to the space (anything else: none)."""
    if not value:
        return None
    try:
        return granted_backends(space).filter(pk=value).first()
    except (ValueError, TypeError, ValidationError):
        return None


def _kept_when_empty(form: forms.ModelForm[Any], name: str) -> int:
    """A limit added after forms were written (disk): empty keeps the stored value, or the
    model's default for a new row, so a form posted without it still saves."""
    value = form.cleaned_data.get(name)
    if value is None:
        stored = getattr(form.instance, name, None)
        return int(stored if stored is not None else form.instance._meta.get_field(name).get_default())
    return int(value)


class SandboxConfigForm(ByKindForm, forms.ModelForm):
    """A space admin's config: a backend granted to the space, template, resources within the
    backend's limits, idle behaviour. Infrastructure fields are not on it: a posted endpoint,
    unix path, TLS, private opt-in, host root or package source is ignored.

    Only the chosen backend's kind's fields are on it (from its `KindDescription`); without a
    backend (`backend=None`) the form is the first step: the backend alone.

    The API key is the space's own, accepted only where the backend allows one; it shows as
    *** when set, and sending *** back keeps it.
    """

    api_key = forms.CharField(
        required=False,
        label="Own API key",
        widget=SecretInput(),
        help_text="The platform lets spaces bring their own key to this backend (public endpoints only). "
        "Stored encrypted; leave *** to keep the stored key, empty to use the platform's.",
    )
    chooser = "backend"
    kind_fields = KIND_CONFIG_FIELDS
    neutral_values = NEUTRAL_VALUES

    class Meta:
        model = SandboxConfig
        fields = [*CONFIG_FIELDS[:2], "api_key", *CONFIG_FIELDS[2:]]
        labels = {
            "backend": "Backend",
            "default_template": "Default template",
            "cpus": "CPUs",
            "memory_mb": "Memory (MB)",
            "pids_limit": "Process limit",
            "disk_mb": "Disk (MiB)",
            "idle_mode": "When idle",
            "idle_timeout_s": "Idle timeout (seconds)",
            "persistent_workspace": "Persistent /workspace",
            "protocol_pin": "Protocol",
            "is_default": "Default for sessions",
        }
        help_texts = {
            "cpus": "CPU cores per sandbox, e.g. 0.5 or 2.",
            "memory_mb": "Per sandbox, in MiB (1024 = 1 GiB).",
            "pids_limit": "Most processes per sandbox.",
            "disk_mb": "What a sandbox may write, in MiB (1024 = 1 GiB); the config page says where it holds.",
            "idle_mode": "What happens to a session's sandbox after the idle timeout.",
            "idle_timeout_s": "Without activity, from 60 (one minute) to 86400 (a day).",
            "protocol_pin": "The wire protocol to speak. Empty: detect it from the server's answers.",
        }

    def __init__(
        self,
        *args: Any,
        space: Space,
        backend: PlatformBackend | None = None,
        template_choices: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.chosen = backend
        # Only backends granted to the space: a forged id of another is a field error.
        backend_field = self.fields["backend"]
        backend_field.queryset = granted_backends(space)  # type: ignore[attr-defined]
        backend_field.help_text = "Infrastructure the platform granted this space; the fields below are its kind's."
        self.show_kind_fields(describe(backend.kind) if backend else None, str(backend.pk) if backend else "")
        if "disk_mb" in self.fields:
            self.fields["disk_mb"].required = False  # empty keeps the stored limit
        if backend is None:
            return
        self.initial.setdefault("backend", backend.pk)
        if "api_key" in self.fields and not backend.allow_space_api_key:
            del self.fields["api_key"]
        if "protocol_pin" in self.fields:
            # This kind's protocols only (the adapters' option values start with the kind).
            pin = self.fields["protocol_pin"]
            pin.choices = [(v, label) for v, label in pin.choices if not v or v.startswith(f"{backend.kind}-")]  # type: ignore[attr-defined]
        if "api_key" in self.fields and self.instance.pk and self.instance.has_api_key:
            self.initial["api_key"] = REDACTED
            self.fields["api_key"].widget = SecretInput(stored=True)
        # The picker lists templates only: a snapshot id never appears here.
        choices = [t for t in template_choices or [] if not is_snapshot_id(t)]
        current = self.instance.default_template if self.instance.pk else ""
        if current and current not in choices and not is_snapshot_id(current):
            choices.append(current)
        if choices:
            self.fields["default_template"] = TemplateChoiceField(
                choices=[(t, t) for t in choices],
                label="Default template",
                help_text="The platform's templates and this space's own. Snapshots live in their own list.",
            )
        else:
            self.fields["default_template"].help_text = (
                "A template id of the backend (it could not list its templates now). "
                "Snapshot ids (snap-…) are not templates."
            )

    def config_data(self) -> dict[str, Any]:
        """What the services take: the fields on the form, and neutral values for the others."""
        return self.kind_data(CONFIG_FIELDS)

    def api_key_value(self) -> str | None:
        """The typed key, "" to clear; None keeps the stored one (the field is not offered).

        A key posted although the field is not offered goes to the service, which refuses it
        (a secret is never dropped silently)."""
        if "api_key" not in self.fields:
            posted = str(self.data.get("api_key") or "") if self.is_bound else ""
            return posted if posted and posted != REDACTED else None
        return str(self.cleaned_data.get("api_key") or "")

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not name:
            raise forms.ValidationError("Give the config a name.")
        return name

    def clean_default_template(self) -> str:
        template: str = self.cleaned_data["default_template"].strip()
        if is_snapshot_id(template):
            raise forms.ValidationError("Snapshot ids (snap-…) are not templates; pick a template.")
        return template

    def clean_disk_mb(self) -> int:
        return _kept_when_empty(self, "disk_mb")

    def clean_api_key(self) -> str:
        # A typed secret is never rendered back, so nothing here echoes it.
        return str(self.cleaned_data.get("api_key") or "")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        backend, pin = cleaned.get("backend"), cleaned.get("protocol_pin") or ""
        if backend is not None and pin and not pin.startswith(f"{backend.kind}-"):
            self.add_error("protocol_pin", "This protocol belongs to another kind of backend.")
        return cleaned


# Backend fields that only some kinds take, and the KindDescription attribute that says which.
KIND_BACKEND_FIELDS = {
    "domain": "needs_domain",
    "sandbox_url": "takes_sandbox_url",
    "api_key": "takes_api_key",
    "allow_space_api_key": "takes_api_key",
    "workspace_host_root": "takes_workspace_host_root",
    "tls_ca": "takes_tls_client_cert",
    "tls_cert": "takes_tls_client_cert",
    "tls_key": "takes_tls_client_cert",
    "clear_tls": "takes_tls_client_cert",
    "max_pids": "limits_processes",
    "max_disk_mb": "limits_disk",
}
# What a field the kind does not take is saved as (None: left as it is, or the default).
BACKEND_NEUTRAL_VALUES: dict[str, Any] = {
    "domain": "",
    "sandbox_url": "",
    "allow_space_api_key": False,
    "workspace_host_root": "",
    "max_pids": None,
    "max_disk_mb": None,
}
BACKEND_SECRETS = ("api_key", "tls_ca", "tls_cert", "tls_key")
SECRET_LABELS = {"api_key": "API key", "tls_ca": "TLS CA", "tls_cert": "TLS client certificate", "tls_key": "TLS key"}


class PlatformBackendForm(ByKindForm, forms.ModelForm):
    """Infrastructure a platform admin registers, and the spaces it is granted to.

    Only the chosen kind's fields are on it (from its `KindDescription`); without a kind
    (`kind=None`) the form is the first step: the kind alone.

    Secrets (API key, TLS client certificate, key and CA) are stored encrypted and never
    rendered back: empty (or ***) keeps what is stored.
    """

    api_key = forms.CharField(
        required=False,
        label="API key",
        widget=SecretInput(),
        help_text="Stored encrypted; leave *** to keep the stored key.",
    )
    tls_ca = forms.CharField(
        required=False,
        label="TLS CA certificate (PEM)",
        widget=SecretTextarea(),
        help_text="A tcp:// endpoint with TLS: the CA the engine's certificate is checked against. Empty keeps it.",
    )
    tls_cert = forms.CharField(
        required=False,
        label="TLS client certificate (PEM)",
        widget=SecretTextarea(),
        help_text="A tcp:// endpoint with TLS: the console's client certificate. Stored encrypted; empty keeps it.",
    )
    tls_key = forms.CharField(
        required=False,
        label="TLS client key (PEM)",
        widget=SecretTextarea(),
        help_text="Stored encrypted, never shown again; empty keeps it.",
    )
    clear_tls = forms.BooleanField(required=False, label="Remove the stored TLS material")
    spaces = forms.ModelMultipleChoiceField(
        queryset=Space.objects.order_by("name"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Granted to",
        help_text="The spaces whose admins may create configs on this backend.",
    )
    chooser = "kind"
    kind_fields = KIND_BACKEND_FIELDS
    neutral_values = BACKEND_NEUTRAL_VALUES

    class Meta:
        model = PlatformBackend
        fields = [*BACKEND_FIELDS[:5], "api_key", "tls_ca", "tls_cert", "tls_key", "clear_tls", *BACKEND_FIELDS[5:]]
        labels = {
            "kind": "Kind",
            "domain": "Sandbox domain",
            "sandbox_url": "Data-plane URL",
            "allow_private_endpoints": "Allow private endpoints",
            "workspace_host_root": "Workspace host root",
            "pip_index_url": "pip index URL",
            "pip_find_links": "pip wheel folder",
            "npm_registry_url": "npm registry URL",
            "max_cpus": "Most CPU cores per sandbox",
            "max_memory_mb": "Most memory per sandbox (MiB)",
            "max_pids": "Most processes per sandbox",
            "max_disk_mb": "Most disk per sandbox (MiB)",
        }
        # How each source reaches the build sandbox (docs/skills.md, "The build sandbox's network").
        help_texts = {
            "kind": "What runs the sandboxes; it decides which settings follow.",
            "domain": "The sandboxes' (data-plane) domain, e.g. e2b.app.",
            "sandbox_url": "Optional: one data-plane (envd) URL for every sandbox, routed by header "
            "(a Cube proxy, or a test server). Empty: https://49983-<sandbox>.<domain>.",
            "allow_space_api_key": "On a public endpoint: a space's config may use its own API key instead of this "
            "backend's (always through the SSRF guard, never with private endpoints).",
            "max_memory_mb": "The most a config on this backend may give a sandbox, in MiB (1024 = 1 GiB).",
            "max_pids": "The most processes a config on this backend may allow a sandbox.",
            "max_disk_mb": "The most disk a config on this backend may give a sandbox, in MiB (10240 = 10 GiB).",
            "pip_index_url": "Package source for skill installs: a pip index URL (PEP 503 simple API), used when no "
            "find-links folder is set; pip never falls back to PyPI. The build sandbox then gets outbound network to "
            "its host: only to it where the backend has allow lists (E2B, Cube); all outbound on Docker.",
            "npm_registry_url": "Package source for skill installs: an npm registry URL (the template needs npm). "
            "The build sandbox gets outbound network to its host, as for the pip index URL.",
        }

    def __init__(self, *args: Any, kind: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        described = describe(kind) if kind in BACKEND_CLASSES else None
        self.show_kind_fields(described, kind if kind is not None and described is not None else "")
        if "max_disk_mb" in self.fields:
            self.fields["max_disk_mb"].required = False  # empty keeps the stored limit
        if described is None:
            kinds = self.fields["kind"]
            kinds.choices = [("", "Choose a kind…"), *[c for c in kinds.choices if c[0]]]  # type: ignore[attr-defined]
            self.initial["kind"] = ""
            return
        self.initial["kind"] = kind
        self.fields["endpoint"].help_text = described.endpoint_rule
        if self.instance.pk:
            self.initial.setdefault("spaces", list(self.instance.spaces.all()))
            if "api_key" in self.fields and self.instance.has_api_key:
                self.initial["api_key"] = REDACTED
                self.fields["api_key"].widget = SecretInput(stored=True)
            if "tls_cert" in self.fields and self.instance.has_tls:
                self.fields["tls_cert"].help_text += " A certificate is stored."

    def backend_data(self) -> dict[str, Any]:
        """What the services take: the kind's fields, and neutral values for the others."""
        return self.kind_data(BACKEND_FIELDS)

    def clean_max_disk_mb(self) -> int:
        return _kept_when_empty(self, "max_disk_mb")

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not name:
            raise forms.ValidationError("Give the backend a name.")
        return name

    def clean_domain(self) -> str:
        domain: str = self.cleaned_data["domain"].strip().lower().rstrip(".")
        if domain and not DOMAIN.match(domain):
            raise forms.ValidationError(f"{domain!r} is not a domain name (e.g. e2b.app).")
        return domain

    def clean_pip_find_links(self) -> str:
        from django.conf import settings

        name: str = self.cleaned_data["pip_find_links"].strip()
        if not name:
            return ""
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", name):
            raise forms.ValidationError("A folder name: letters, digits, '.', '_' and '-' (no paths).")
        if not (settings.SKILL_PACKAGE_SOURCES_ROOT / name).is_dir():
            raise forms.ValidationError(f"There is no folder {name!r} under {settings.SKILL_PACKAGE_SOURCES_ROOT}.")
        return name

    def _clean_url(self, field: str) -> str:
        url: str = self.cleaned_data[field].strip()
        if url and not url.startswith(("https://", "http://")):
            raise forms.ValidationError("An http(s) URL.")
        if url:
            try:
                check_endpoint(url, allow_private=bool(self.data.get("allow_private_endpoints")))
            except (RemoteError, ValueError, UnicodeError) as exc:
                raise forms.ValidationError(getattr(exc, "message", str(exc))) from None
        return url

    def clean_pip_index_url(self) -> str:
        return self._clean_url("pip_index_url")

    def clean_npm_registry_url(self) -> str:
        return self._clean_url("npm_registry_url")

    def _clean_pem(self, field: str, marker: str) -> str:
        value: str = (self.cleaned_data.get(field) or "").strip()
        if value and value != REDACTED and f"-----BEGIN {marker}" not in value:
            raise forms.ValidationError(f"Paste the PEM text (-----BEGIN {marker}…).")
        return value + "\n" if value and value != REDACTED else ""

    def clean_tls_ca(self) -> str:
        return self._clean_pem("tls_ca", "CERTIFICATE")

    def clean_tls_cert(self) -> str:
        return self._clean_pem("tls_cert", "CERTIFICATE")

    def clean_tls_key(self) -> str:
        return self._clean_pem("tls_key", "")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        kind = cleaned.get("kind")
        if self.kind is not None:
            for name in self.refused_secrets(BACKEND_SECRETS):  # posted, though this kind takes none
                self.add_error(None, f"{self.kind.label} backends take no {SECRET_LABELS[name]}; nothing was saved.")
        endpoint = (cleaned.get("endpoint") or "").strip()
        cleaned["endpoint"] = endpoint
        api_key = cleaned.get("api_key") or ""
        has_key = bool(api_key) and (api_key != REDACTED or self.instance.has_api_key)
        allow_private = bool(cleaned.get("allow_private_endpoints"))
        # What the kind takes comes from its adapter package (no branch on the kind here).
        described = describe(kind) if kind in BACKEND_CLASSES else None
        if described is not None:
            if described.endpoint_required and not endpoint:
                self.add_error("endpoint", f"{described.label} backends need their control-plane URL.")
            elif endpoint and not endpoint.startswith(described.endpoint_schemes):
                self.add_error("endpoint", described.endpoint_rule)
            if described.needs_domain and not cleaned.get("domain"):
                self.add_error("domain", f"{described.label} backends need their sandbox domain.")
            elif not described.needs_domain and cleaned.get("domain"):
                self.add_error("domain", f"{described.label} backends have no sandbox domain; leave it empty.")
            if described.takes_api_key and not has_key and not cleaned.get("allow_space_api_key"):
                self.add_error(
                    "api_key", f"{described.label} backends need an API key (or let spaces bring their own)."
                )
            elif not described.takes_api_key and cleaned.get("allow_space_api_key"):
                self.add_error("allow_space_api_key", f"{described.label} backends take no API key.")
        tls_given = any(cleaned.get(f) for f in ("tls_cert", "tls_key", "tls_ca"))
        if tls_given and not endpoint.startswith("tcp://"):
            self.add_error("tls_cert", "TLS client certificates are for Docker tcp:// endpoints.")
        if bool(cleaned.get("tls_cert")) != bool(cleaned.get("tls_key")) and not self.instance.has_tls:
            self.add_error("tls_key", "A client certificate needs its key, and a key its certificate.")
        if cleaned.get("allow_space_api_key") and allow_private:
            self.add_error(
                "allow_space_api_key", "Spaces' own keys go to public endpoints only: turn private endpoints off."
            )
        sandbox_url = (cleaned.get("sandbox_url") or "").strip()
        cleaned["sandbox_url"] = sandbox_url
        if sandbox_url:
            if described is not None and not described.takes_sandbox_url:
                self.add_error("sandbox_url", f"{described.label} backends have no data-plane URL; leave it empty.")
            elif not sandbox_url.startswith(("https://", "http://")):
                self.add_error("sandbox_url", "The data-plane URL starts with https:// (or http://).")
            else:
                try:
                    check_endpoint(sandbox_url, allow_private=allow_private)
                except (RemoteError, ValueError, UnicodeError) as exc:  # a malformed URL is a field error
                    self.add_error("sandbox_url", getattr(exc, "message", str(exc)))
        self._clean_workspace_host_root(cleaned, described)
        if endpoint.startswith(UNIX_SCHEME) and "endpoint" not in self.errors:
            if problem := unix_socket_problem(endpoint):
                self.add_error("endpoint", problem)
        elif endpoint and "endpoint" not in self.errors:
            try:
                check_endpoint(_guard_form(endpoint), allow_private=allow_private)
            except (RemoteError, ValueError, UnicodeError) as exc:
                self.add_error("endpoint", getattr(exc, "message", str(exc)))
        return cleaned

    def _clean_workspace_host_root(self, cleaned: dict[str, Any], described: KindDescription | None) -> None:
        root = (cleaned.get("workspace_host_root") or "").strip()
        cleaned["workspace_host_root"] = root
        if not root:
            return
        if described is None or described.workspace_host_root_problem is None:
            takers = " and ".join(d.label for d in map(describe, BACKEND_CLASSES) if d.takes_workspace_host_root)
            self.add_error("workspace_host_root", f"Only {takers} backends mount workspaces from a host directory.")
        elif problem := described.workspace_host_root_problem(root):
            self.add_error("workspace_host_root", f"The workspace host root must be {problem}.")


def _guard_form(endpoint: str) -> str:
    """ssh://user@host[:port] is judged as the host and port it dials (tcp://host:port)."""
    if not endpoint.startswith("ssh://"):
        return endpoint
    parts = urlsplit(endpoint)
    if not parts.hostname:
        raise ValueError(f"{endpoint!r}: no host name")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"tcp://{host}:{parts.port or 22}"


class TemplateBuildForm(forms.Form):
    name = forms.CharField(max_length=63, help_text="Lowercase letters, digits, '.', '_' and '-'.")
    description = forms.CharField(max_length=200, required=False)
    debian_packages = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="Build from Debian packages: names separated by spaces or lines (added to the base system).",
    )
    base_template_id = forms.ChoiceField(
        required=False, label="Base template", help_text="Build from an existing template plus a script."
    )
    script = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        help_text="Shell script run as root in a build sandbox without network, then frozen.",
    )

    def __init__(self, *args: Any, template_choices: list[str], offer_platform: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if offer_platform:
            self.fields["platform_template"] = forms.BooleanField(
                required=False,
                label="Platform template",
                help_text="Offered to every space granted this backend; only platform admins can delete it. "
                "Unticked: a template of this space only.",
            )
        self.fields["base_template_id"].choices = [("", "—")] + [  # type: ignore[attr-defined]
            (t, t) for t in template_choices if not is_snapshot_id(t)
        ]

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not TEMPLATE_NAME.match(name):
            raise forms.ValidationError("Use lowercase letters, digits, '.', '_' and '-' (at most 63).")
        return name

    def clean_debian_packages(self) -> list[str]:
        packages = self.cleaned_data["debian_packages"].split()
        bad = [p for p in packages if not DEBIAN_PACKAGE.match(p)]
        if bad:
            raise forms.ValidationError("Not Debian package names: " + ", ".join(bad))
        if len(set(packages)) != len(packages):
            raise forms.ValidationError("A package is listed twice.")
        return packages

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        packages = cleaned.get("debian_packages") or []
        script = (cleaned.get("script") or "").strip()
        base = cleaned.get("base_template_id")
        if packages and (script or base):
            raise forms.ValidationError("Build either from Debian packages, or from a base template plus a script.")
        if not packages and not script:
            raise forms.ValidationError("Give Debian packages, or a base template and a script.")
        if script and not base:
            self.add_error("base_template_id", "Pick the template the script runs on.")
        return cleaned
