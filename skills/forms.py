"""Forms of the skills app."""

from __future__ import annotations

from django import forms
from django.core.files.uploadedfile import UploadedFile

from .archives import Limits, human_size


class SkillImportForm(forms.Form):
    """Upload of one skill archive (multipart; works without JavaScript)."""

    archive = forms.FileField(
        label="Skill archive",
        help_text=".zip or .skill (one top-level folder holding SKILL.md), or a .tar / .tar.gz.",
        widget=forms.ClearableFileInput(attrs={"accept": ".zip,.skill,.tar,.tgz,.tar.gz,.tar.xz,.tar.bz2"}),
    )

    def clean_archive(self) -> UploadedFile:
        archive: UploadedFile = self.cleaned_data["archive"]
        limit = Limits.from_settings().archive_bytes
        if archive.size is not None and archive.size > limit:
            raise forms.ValidationError(
                f"The archive is {human_size(archive.size)}; "
                f"the limit is {human_size(limit)} (skills.archive_max_bytes)."
            )
        return archive


class SkillInstallForm(forms.Form):
    """Install a skill version into a space's skill image on one of the space's configs."""

    config = forms.TypedChoiceField(label="Sandbox config", coerce=str)
    version = forms.TypedChoiceField(label="Skill version", coerce=str)

    def __init__(
        self,
        *args: object,
        configs: list[tuple[str, str]],
        versions: list[tuple[str, str]],
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        config_field = self.fields["config"]
        version_field = self.fields["version"]
        assert isinstance(config_field, forms.TypedChoiceField)
        assert isinstance(version_field, forms.TypedChoiceField)
        config_field.choices = configs
        version_field.choices = versions


class GitImportForm(forms.Form):
    """Import a skill from a folder of a git repository (the allowed hosts only)."""

    url = forms.CharField(
        label="Repository URL",
        max_length=1000,
        help_text="https://, http:// or git:// on an allowed host (file:// if local paths are allowed).",
    )
    ref = forms.CharField(label="Branch or tag", max_length=200, required=False, help_text="Empty: the default branch.")
    path = forms.CharField(
        label="Folder", max_length=1024, required=False, help_text="The folder holding SKILL.md; empty: the root."
    )


class GitHostsForm(forms.Form):
    """The platform's allowed git hosts for skill imports."""

    allowed_hosts = forms.CharField(
        label="Allowed hosts",
        required=False,
        max_length=20000,
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text="One per line: a host name (any port) or host:port. Nothing else can be imported from.",
    )
    allow_local_paths = forms.BooleanField(
        label="Allow file:// URLs", required=False, help_text="Repositories on the console server's own disk."
    )
