"""Forms of the sandboxes app."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from console.crypto import REDACTED
from console.models import Space

from ..backends import BACKEND_CLASSES, all_settings, describe
from ..backends.base import RemoteError, is_snapshot_id
from ..backends.guard import check_endpoint
from ..backends.settings import Scope, SettingType
from ..models import PlatformBackend, SandboxConfig
from .by_kind import ByKindForm, secret_names
from .platform import BACKEND_FIELDS, granted_backends
from .services import CONFIG_FIELDS

# The fields every kind's form has; the rest are the kinds' declared settings.
COMMON_BACKEND_FIELDS = frozenset(BACKEND_FIELDS) - set(all_settings(Scope.BACKEND))
COMMON_CONFIG_FIELDS = frozenset(CONFIG_FIELDS) - set(all_settings(Scope.CONFIG))
BACKEND_SECRETS = secret_names(Scope.BACKEND)

DEBIAN_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class TemplateChoiceField(forms.ChoiceField):
    """The template picker: a posted snapshot id is named as such, not as an unknown choice."""

    def validate(self, value: Any) -> None:
        if value and is_snapshot_id(str(value)):
            raise forms.ValidationError("Snapshot ids (snap-…) are not templates; pick a template.")
        super().validate(value)


def chosen_backend(space: Space, value: Any) -> PlatformBackend | None:
    """The backend a form names, if it is granted to the space (anything else: none)."""
    if not value:
        return None
    try:
        return granted_backends(space).filter(pk=value).first()
    except (ValueError, TypeError, ValidationError):
        return None


class SandboxConfigForm(ByKindForm, forms.ModelForm):
    """A space admin's config: a backend granted to the space, template, resources within the
    backend's limits, idle behaviour. Infrastructure fields are not on it: a posted endpoint,
    unix path, TLS, private opt-in, host root or package source is ignored.

    The chosen backend's kind's config settings are generated from its adapter's schema
    (`describe(kind)`, scope `config`); without a backend (`backend=None`) the form is the
    first step: the backend alone.

    The space's own API key (a declared secret) is offered only where the backend allows
    one; it shows as *** when set, and sending *** back keeps it.
    """

    chooser = "backend"
    scope = Scope.CONFIG

    class Meta:
        model = SandboxConfig
        fields = [name for name in CONFIG_FIELDS if name in COMMON_CONFIG_FIELDS]
        labels = {
            "backend": "Backend",
            "default_template": "Default template",
            "cpus": "CPUs",
            "memory_mb": "Memory (MB)",
            "idle_mode": "When idle",
            "idle_timeout_s": "Idle timeout (seconds)",
            "persistent_workspace": "Persistent /workspace",
            "is_default": "Default for sessions",
        }
        help_texts = {
            "cpus": "CPU cores per sandbox, e.g. 0.5 or 2.",
            "memory_mb": "Per sandbox, in MiB (1024 = 1 GiB).",
            "idle_mode": "What happens to a session's sandbox after the idle timeout.",
            "idle_timeout_s": "Without activity, from 60 (one minute) to 86400 (a day).",
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
        if backend is None:
            return
        self.initial.setdefault("backend", backend.pk)
        if "api_key" in self.fields and not backend.allow_space_api_key:
            del self.fields["api_key"]
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


class PlatformBackendForm(ByKindForm, forms.ModelForm):
    """Infrastructure a platform admin registers, and the spaces it is granted to.

    The chosen kind's settings (endpoint, credentials, limits, …) are generated from its
    adapter's schema (`describe(kind)`, scope `backend`) and checked by it; without a kind
    (`kind=None`) the form is the first step: the kind alone.

    Secrets are stored encrypted and never rendered back: a stored one shows as ***, and
    *** (or, for PEM material, empty) keeps it.
    """

    spaces = forms.ModelMultipleChoiceField(
        queryset=Space.objects.order_by("name"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Granted to",
        help_text="The spaces whose admins may create configs on this backend.",
    )
    chooser = "kind"
    scope = Scope.BACKEND

    class Meta:
        model = PlatformBackend
        fields = [name for name in BACKEND_FIELDS if name in COMMON_BACKEND_FIELDS]
        labels = {
            "kind": "Kind",
            "allow_private_endpoints": "Allow private endpoints",
            "pip_index_url": "pip index URL",
            "pip_find_links": "pip wheel folder",
            "npm_registry_url": "npm registry URL",
            "npm_folder": "npm tarball folder",
            "apt_folder": "apt repository folder",
            "apt_url": "apt mirror or proxy URL",
            "apt_suite": "apt suite and components",
            "max_cpus": "Most CPU cores per sandbox",
            "max_memory_mb": "Most memory per sandbox (MiB)",
            "max_pool_size": "Most ready sandboxes per config (warm pool)",
        }
        # How each source reaches the build sandbox (docs/skills.md, "The build sandbox's network").
        help_texts = {
            "kind": "What runs the sandboxes; it decides which settings follow.",
            "max_memory_mb": "The most a config on this backend may give a sandbox, in MiB (1024 = 1 GiB).",
            "pip_index_url": "Package source for skill installs: a pip index URL (PEP 503 simple API), used when no "
            "find-links folder is set; pip never falls back to PyPI. The build sandbox then gets outbound network to "
            "its host only where the backend has allow lists (E2B, Cube, Docker with the host packet filter); a Docker "
            "engine without it can only switch outbound on (docs/skills.md).",
            "npm_registry_url": "Package source for skill installs: an npm registry URL, used when no npm tarball "
            "folder is set. The build sandbox gets outbound network to its host, as for the pip index URL.",
            "npm_folder": "Package source for skill installs: a folder of npm tarballs (.tgz) under the package "
            "sources' root, served to npm inside the build sandbox (offline; wins over the registry URL).",
            "apt_folder": "Package source for skills' Debian packages: a folder under the package sources folder with "
            ".deb files and a Packages index (dpkg-scanpackages). The index and the .deb files an install needs are "
            "copied into the build sandbox, which stays offline. Wins over the apt URL.",
            "apt_url": "Package source for skills' Debian packages: an apt mirror or proxy URL. The build sandbox "
            "gets outbound network to its host only, as for the pip index URL; apt reads no other source.",
        }

    def __init__(self, *args: Any, kind: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        described = describe(kind) if kind in BACKEND_CLASSES else None
        self.show_kind_fields(described, kind if kind is not None and described is not None else "")
        if described is None:
            kinds = self.fields["kind"]
            kinds.choices = [("", "Choose a kind…"), *[c for c in kinds.choices if c[0]]]  # type: ignore[attr-defined]
            self.initial["kind"] = ""
            return
        self.initial["kind"] = kind
        if "max_pool_size" in self.fields:
            # Left out of a post (an older form, a script): the stored limit, or the default.
            self.fields["max_pool_size"].required = False
        if self.instance.pk:
            self.initial.setdefault("spaces", list(self.instance.spaces.all()))

    def backend_data(self) -> dict[str, Any]:
        """What the services take: the kind's fields, and neutral values for the others."""
        return self.kind_data(BACKEND_FIELDS)

    def clean_max_pool_size(self) -> int:
        value = self.cleaned_data.get("max_pool_size")
        if value is None:
            stored: int = self.instance.max_pool_size
            return stored
        return int(value)

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not name:
            raise forms.ValidationError("Give the backend a name.")
        return name

    def _clean_folder(self, field: str) -> str:
        """A package source folder: a plain name of a folder under the package sources root."""
        from django.conf import settings

        name: str = self.cleaned_data[field].strip()
        if not name:
            return ""
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", name):
            raise forms.ValidationError("A folder name: letters, digits, '.', '_' and '-' (no paths).")
        if not (settings.SKILL_PACKAGE_SOURCES_ROOT / name).is_dir():
            raise forms.ValidationError(f"There is no folder {name!r} under {settings.SKILL_PACKAGE_SOURCES_ROOT}.")
        return name

    def clean_pip_find_links(self) -> str:
        return self._clean_folder("pip_find_links")

    def clean_npm_folder(self) -> str:
        return self._clean_folder("npm_folder")

    def clean_apt_folder(self) -> str:
        return self._clean_folder("apt_folder")

    def clean_apt_suite(self) -> str:
        suite: str = " ".join(self.cleaned_data["apt_suite"].split())
        if suite and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*( [A-Za-z0-9][A-Za-z0-9._/-]*)*$", suite):
            raise forms.ValidationError("The suite, then its components, separated by spaces (e.g. 'bookworm main').")
        return suite

    def _clean_url(self, field: str) -> str:
        url: str = self.cleaned_data[field].strip()
        if url and not url.startswith(("https://", "http://")):
            raise forms.ValidationError("An http(s) URL.")
        # The URL parser drops tabs and newlines before the endpoint check reads the host; pip,
        # npm and apt would get them (apt: a second sources.list line).
        if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
            raise forms.ValidationError("A URL without spaces or control characters.")
        if url:
            try:
                check_endpoint(url, allow_private=self._allows_private())
            except (RemoteError, ValueError, UnicodeError) as exc:
                raise forms.ValidationError(getattr(exc, "message", str(exc))) from None
        return url

    def _allows_private(self) -> bool:
        """The private-endpoint switch as its checkbox reads the post ("false" is unticked),
        whichever field is cleaned first."""
        name = "allow_private_endpoints"
        widget = self.fields[name].widget
        return bool(widget.value_from_datadict(self.data, self.files, self.add_prefix(name)))

    def clean_pip_index_url(self) -> str:
        return self._clean_url("pip_index_url")

    def clean_npm_registry_url(self) -> str:
        return self._clean_url("npm_registry_url")

    def clean_apt_url(self) -> str:
        return self._clean_url("apt_url")

    def clean(self) -> dict[str, Any]:
        """The kind's own checks (`ByKindForm.clean`), then the endpoint guard on every
        endpoint and URL the kind declares, as the adapter will dial it."""
        for refusal in self.refused_secrets():  # posted, though this kind takes none
            self.add_error(None, refusal)
        cleaned = super().clean()
        if self.kind is None:
            return cleaned
        cleaned.setdefault("endpoint", "")
        allow_private = bool(cleaned.get("allow_private_endpoints"))
        for setting in self.kind.of(self.scope):
            value = cleaned.get(setting.name)
            if setting.type not in (SettingType.ENDPOINT, SettingType.URL) or not value or setting.name in self.errors:
                continue
            try:
                target = setting.dials(value) if setting.dials is not None else value
                if target:
                    check_endpoint(target, allow_private=allow_private)
            except (RemoteError, ValueError, UnicodeError) as exc:  # a malformed URL is a field error
                self.add_error(setting.name, getattr(exc, "message", str(exc)))
        return cleaned


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
