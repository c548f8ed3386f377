"""Template comments: Django strips `{# … #}` only when it opens and closes on one line; a
comment spread over lines is printed on the page as text (longer ones use `{% comment %}`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]


def _template_files() -> list[Path]:
    return sorted(
        path for folder in ROOT.glob("**/templates") if ".venv" not in folder.parts for path in folder.rglob("*.html")
    )


def test_no_template_opens_a_one_line_comment_it_does_not_close_on_that_line() -> None:
    files = _template_files()
    assert files, "no templates found"
    broken = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "{#" in line and "#}" not in line[line.index("{#") :]
    ]
    assert not broken, "comments spread over lines (use {% comment %}):\n" + "\n".join(broken)


@pytest.mark.django_db
def test_the_login_page_shows_no_template_text(client: Client) -> None:
    page = client.get("/login/").content.decode()
    for text in ("{#", "#}", "{%"):
        assert text not in page
