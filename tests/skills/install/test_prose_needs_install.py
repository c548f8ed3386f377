"""A document skill whose SKILL.md only names its needs in prose, from import to a working
session, on the real Docker engine with local package sources.

SKILL.md says it needs pypdf, pdfplumber, Pillow and poppler-utils; nothing declares them. The
skill page lists them as inferred, a platform admin confirms them through the page's form,
the install job checks every package against its source before copying anything, and a new
session runs every script of the skill with `--help` as the session user.

Sources: real wheels from PyPI, downloaded on the host once into
`var/package-sources/pdf-wheels` (the `pdf_wheels` fixture; CI's host reaches PyPI), and
the local apt repository `var/package-sources/debian` (scripts/apt_repo.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.urls import reverse

from console.models import JobStatus
from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore
from skills.install.plan import payload_for
from skills.install.steps import entry_scripts
from tests.conftest import IN_CI, REDIS_URL
from tests.personas import World
from tests.support.skill_install import import_skill, job_error, pypi_wheels, run_install, skill_zip, skills_config

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db]

WHEELS = "pdf-wheels"
DISTRIBUTIONS = ("pypdf", "pdfplumber", "pillow")
NEEDS = ["debian:poppler-utils", "pip:pdfplumber", "pip:pillow", "pip:pypdf"]

SKILL_BODY = """# PDF forms and text

## Requirements

This skill needs pypdf, pdfplumber and Pillow, and poppler-utils for rendering pages.

- `scripts/extract_text.py in.pdf` prints each page's text.
- `scripts/fill_form.py in.pdf out.pdf name=value...` fills form fields.
- `scripts/render.py in.pdf outdir` renders pages to PNG and prints their sizes.
"""


def script(doc: str, imports: str, arguments: str, work: str) -> bytes:
    lines = [
        "#!/usr/bin/env python3",
        f'"""{doc}"""',
        "import argparse",
        imports,
        "",
        f"parser = argparse.ArgumentParser(description={doc!r})",
        *(f"parser.add_argument({argument})" for argument in arguments.split(";")),
        "args = parser.parse_args()",
        work,
    ]
    return ("\n".join(lines) + "\n").encode()


SCRIPTS = {
    "scripts/extract_text.py": script(
        "Print each page's text.",
        "import pdfplumber",
        "'pdf'",
        "with pdfplumber.open(args.pdf) as doc:\n    print('\\n'.join(p.extract_text() or '' for p in doc.pages))",
    ),
    "scripts/fill_form.py": script(
        "Fill a PDF form's fields.",
        "from pypdf import PdfReader, PdfWriter",
        "'pdf';'output';'fields', nargs='*'",
        "writer = PdfWriter(clone_from=PdfReader(args.pdf))\n"
        "writer.update_page_form_field_values(writer.pages[0], dict(f.split('=', 1) for f in args.fields))\n"
        "writer.write(args.output)",
    ),
    "scripts/render.py": script(
        "Render pages to PNG with pdftoppm and print their sizes.",
        "import subprocess\nfrom pathlib import Path\nfrom PIL import Image",
        "'pdf';'outdir'",
        "subprocess.run(['pdftoppm', '-png', args.pdf, f'{args.outdir}/page'], check=True)\n"
        "print([Image.open(p).size for p in sorted(Path(args.outdir).glob('*.png'))])",
    ),
}


@pytest.fixture(scope="session")
def pdf_wheels() -> Path:
    """Real wheels of pypdf, pdfplumber and Pillow with their dependencies, from PyPI on the
    host, kept in var/ for later runs."""
    folder = Path(django_settings.BASE_DIR) / "var" / "package-sources" / WHEELS
    failed = pypi_wheels(folder, list(DISTRIBUTIONS))
    if failed:
        if IN_CI:
            pytest.fail(failed)
        pytest.skip(failed)
    return folder


@pytest.fixture
def installation(settings: Any, test_run_id: str) -> str:
    settings.CONSOLE_INSTALLATION_ID = f"test-{test_run_id}-skills-prose"
    return str(settings.CONSOLE_INSTALLATION_ID)


@pytest.fixture
def config(
    world: World, docker_base_image: str, installation: str, apt_folder: Path, pdf_wheels: Path
) -> Iterator[SandboxConfig]:
    assert pdf_wheels.parent == apt_folder.parent, "one package sources root"
    extra = {"memory_mb": 512, "pip_find_links": WHEELS, "apt_folder": apt_folder.name}
    with skills_config(world.space_a, docker_base_image, installation, **extra) as made:
        yield made


def test_prose_needs_are_confirmed_installed_checked_first_and_every_script_starts(
    world: World, config: SandboxConfig, installation: str
) -> None:
    executable = tuple(SCRIPTS)
    version = import_skill(skill_zip("pdf-forms", SCRIPTS, executable=executable, body=SKILL_BODY))
    assert version.dependencies == {"pip": [], "npm": [], "debian": []}, "nothing declared"

    # The page lists the needs as inferred, each with where it was found.
    admin = world.client_for("root")
    page = admin.get(version.get_absolute_url()).content.decode()
    for key in NEEDS:
        assert f'name="need" value="{key}"' in page
    assert [need["key"] for need in version.dependency_report["inferred"]] == NEEDS

    # Confirmed through the page's form.
    response = admin.post(reverse("skills:version_dependencies", args=[version.id]), {"need": NEEDS})
    assert response.status_code == 302
    version.refresh_from_db()

    job = run_install(world.space_a, config, version)
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    messages = [str(line.get("message")) for line in job.log]
    planned = [i for i, m in enumerate(messages) if m.startswith("plan: ")]
    copied = next(i for i, m in enumerate(messages) if m.startswith("copied "))
    checked = [messages[i] for i in planned]
    for name in ("poppler-utils", "pdfplumber", "pillow", "pypdf"):
        assert any(name in line.lower() for line in checked), (name, checked)
    assert planned, messages
    assert max(planned) < copied, "every source is checked before anything is copied"
    assert any(m.startswith("every package found in its source (4 checked)") for m in messages), messages

    # A new session from the skill image runs each script with --help as uid 1000.
    runtime = Runtime(RedisSessionStore(REDIS_URL))
    session = runtime.resolve(world.space_a, "pdf-forms").session
    scripts = entry_scripts(payload_for(version))
    assert sorted(scripts) == sorted(SCRIPTS)
    for path in scripts:
        request = ExecRequest(shell=f"id -u; python3 /opt/skills/pdf-forms/{path} --help", user="user", timeout_s=60)
        result = runtime.exec(session, request)
        out = (result.stdout + result.stderr).decode()
        assert result.exit_code == 0, (path, out)
        assert out.startswith("1000\nusage: "), out
    result = runtime.exec(session, ExecRequest(shell="pdftoppm -v", user="user", timeout_s=30))
    assert result.exit_code == 0, result.stderr
