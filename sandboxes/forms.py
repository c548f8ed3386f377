"""Forms of the sandboxes app."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from console.crypto import REDACTED

from .backends.base import RemoteError, is_snapshot_id
from .backends.cube import host_root_problem
from .backends.guard import check_endpoint
from .models import BackendKind, SandboxConfig
from .services import CONFIG_FIELDS

DEBIAN_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$|^localhost$")


class SandboxConfigForm(forms.ModelForm):
    """A config form. The API key shows as *** when set; sending *** back keeps it."""

    api_key = forms.CharField(
        required=False,
        label="API key",
        widget=forms.PasswordInput(render_value=True, attrs={"autocomplete": "new-password"}),
        help_text="E2B/Cube. Stored encrypted; shown as *** once saved. Leave *** to keep the stored key.",
    )

    class Meta:
        model = SandboxConfig
        # The service's fields, with the API key (kept apart: it is stored encrypted) after the endpoint.
        fields = [*CONFIG_FIELDS[:5], "api_key", *CONFIG_FIELDS[5:]]
        # How each source reaches the build sandbox (docs/skills.md, "The build sandbox's network").
        help_texts = {
            "pip_index_url": "Package source for skill installs: a pip index URL (PEP 503 simple API), used when no "
            "find-links folder is set; pip never falls back to PyPI. The build sandbox then gets outbound network to "
            "its host: only to it where the backend has allow lists (E2B, Cube); all outbound on Docker.",
            "npm_registry_url": "Package source for skill installs: an npm registry URL (the template needs npm). "
            "The build sandbox gets outbound network to its host, as for the pip index URL.",
        }

    def __init__(self, *args: Any, template_choices: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk and self.instance.has_api_key:
            self.initial["api_key"] = REDACTED
        if not self.instance._state.adding and self.instance.kind != BackendKind.CUBE:
            # Only Cube mounts workspaces from a host directory; a new config may still become one.
            del self.fields["workspace_host_root"]
        if template_choices is not None:
            # The picker lists templates only: a snapshot id never appears here.
            current = self.instance.default_template if self.instance.pk else ""
            choices = [t for t in template_choices if not is_snapshot_id(t)]
            if current and current not in choices and not is_snapshot_id(current):
                choices.append(current)
            self.fields["default_template"] = forms.ChoiceField(
                choices=[(t, t) for t in choices],
                label="Default template",
                help_text="Templates of this backend. Snapshots live in their own list and are not offered here.",
            )
        else:
            self.fields["default_template"].help_text = (
                "A template id of the backend (Docker: an image tag such as sandbox-console/base:latest). "
                "Snapshot ids (snap-…) are not templates."
            )

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
        return url

    def clean_pip_index_url(self) -> str:
        return self._clean_url("pip_index_url")

    def clean_npm_registry_url(self) -> str:
        return self._clean_url("npm_registry_url")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        kind = cleaned.get("kind")
        pin = cleaned.get("protocol_pin") or ""
        if pin and not pin.startswith(f"{kind}-"):
            self.add_error("protocol_pin", "This protocol belongs to another kind of backend.")
        endpoint = (cleaned.get("endpoint") or "").strip()
        cleaned["endpoint"] = endpoint
        api_key = cleaned.get("api_key") or ""
        has_key = bool(api_key) and (api_key != REDACTED or self.instance.has_api_key)
        if kind in (BackendKind.E2B, BackendKind.CUBE):
            if not endpoint:
                self.add_error("endpoint", "E2B and Cube configs need their control-plane URL.")
            elif not endpoint.startswith(("https://", "http://")):
                self.add_error(
                    "endpoint", "The control-plane URL starts with https:// (or http:// on a private network)."
                )
            if not cleaned.get("domain"):
                self.add_error("domain", "E2B and Cube configs need their sandbox domain.")
            if not has_key:
                self.add_error("api_key", "E2B and Cube configs need an API key.")
        elif kind == BackendKind.DOCKER:
            if endpoint and not endpoint.startswith(("tcp://", "unix://")):
                self.add_error(
                    "endpoint", "A Docker endpoint is empty (local socket), unix:///path or tcp://host:port."
                )
            if cleaned.get("domain"):
                self.add_error("domain", "Docker configs have no sandbox domain; leave it empty.")
        sandbox_url = (cleaned.get("sandbox_url") or "").strip()
        cleaned["sandbox_url"] = sandbox_url
        if sandbox_url:
            if kind == BackendKind.DOCKER:
                self.add_error("sandbox_url", "Docker configs have no data-plane URL; leave it empty.")
            elif not sandbox_url.startswith(("https://", "http://")):
                self.add_error("sandbox_url", "The data-plane URL starts with https:// (or http://).")
            else:
                try:
                    check_endpoint(sandbox_url, allow_private=bool(cleaned.get("allow_private_endpoints")))
                except RemoteError as exc:
                    self.add_error("sandbox_url", exc.message)
        self._clean_workspace_host_root(cleaned, kind)
        if endpoint and not endpoint.startswith("unix://") and "endpoint" not in self.errors:
            try:
                check_endpoint(endpoint, allow_private=bool(cleaned.get("allow_private_endpoints")))
            except RemoteError as exc:
                self.add_error("endpoint", exc.message)
        return cleaned

    def _clean_workspace_host_root(self, cleaned: dict[str, Any], kind: str | None) -> None:
        root = (cleaned.get("workspace_host_root") or "").strip()
        cleaned["workspace_host_root"] = root  # "" also when the field is not on this form
        if not root:
            return
        if kind != BackendKind.CUBE:
            self.add_error("workspace_host_root", "Only Cube configs mount workspaces from a host directory.")
        elif problem := host_root_problem(root):
            self.add_error("workspace_host_root", f"The workspace host root must be {problem}.")


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

    def __init__(self, *args: Any, template_choices: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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
