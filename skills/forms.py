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
