"""The apt source as apt reads it, and a repository folder's index: pure, no services."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from sandboxes.backends.base import NetworkCapabilities
from skills.install.apt import REPO_DIR, index_file, read_index, source_label, sources_line
from skills.install.network import OFFLINE, build_network, sources_to_reach
from skills.install.packages import PackageSources
from skills.install.steps import SkillPayload, StepFailed

MIRROR = "http://10.9.8.7:3142/debian"


def skill(*debian: str) -> SkillPayload:
    return SkillPayload(name="pdf", version_id="v", content_hash="h", files=(), dependencies={"debian": list(debian)})


def test_a_folder_is_a_trusted_flat_repository_copied_into_scratch(tmp_path: Path) -> None:
    sources = PackageSources(apt_folder=tmp_path / "debian", apt_url=MIRROR)
    assert sources_line(sources) == f"deb [trusted=yes] file:{REPO_DIR} ./"
    assert source_label(sources) == "the apt repository folder debian/"


def test_a_url_is_checked_against_the_templates_keyrings_unless_trusted() -> None:
    assert sources_line(PackageSources(apt_url=MIRROR, apt_suite="bookworm main")) == f"deb {MIRROR} bookworm main"
    assert sources_line(PackageSources(apt_url=MIRROR, apt_trusted=True)) == f"deb [trusted=yes] {MIRROR} ./"
    labelled = PackageSources(apt_url="http://u:secret@10.9.8.7/debian", apt_suite="bookworm main")
    assert source_label(labelled) == "the apt source http://u:***@10.9.8.7/debian (bookworm main)"


def test_a_stored_url_or_suite_with_a_line_break_never_reaches_sources_list() -> None:
    for sources in (
        PackageSources(apt_url=MIRROR + "\ndeb [trusted=yes] http://10.9.8.6/ ./"),
        PackageSources(apt_url=MIRROR + "\t./ x"),
        PackageSources(apt_url=MIRROR, apt_suite="bookworm\ndeb http://10.9.8.6/ ./"),
    ):
        with pytest.raises(StepFailed, match="holds a line break or a tab"):
            sources_line(sources)


def test_the_apt_url_is_opened_only_for_debian_packages_and_only_without_a_folder(tmp_path: Path) -> None:
    url = PackageSources(apt_url=MIRROR)
    assert [s.host for s in sources_to_reach(url, [skill("qpdf")])] == ["10.9.8.7"]
    assert sources_to_reach(url, [skill()]) == []
    folder = PackageSources(apt_url=MIRROR, apt_folder=tmp_path)
    assert sources_to_reach(folder, [skill("qpdf")]) == []
    caps = NetworkCapabilities(outbound_toggle=True, allow_out_cidr=True, allow_private=True)
    assert build_network(caps, "Docker", sources_to_reach(folder, [skill("qpdf")])).spec == OFFLINE
    spec = build_network(caps, "Docker", sources_to_reach(url, [skill("qpdf")])).spec
    assert [str(entry) for entry in spec.allow_out] == ["10.9.8.7/32"]


def test_the_index_keeps_files_inside_the_folder_only(tmp_path: Path) -> None:
    (tmp_path / "Packages").write_text(
        "Package: qpdf\nVersion: 11.3.0-1\nDescription: tools\n more: here\nFilename: ./qpdf_11.3.0-1_amd64.deb\n\n"
        "Package: evil\nVersion: 1\nFilename: ../../etc/passwd\n\n"
        "Package: nofile\nVersion: 1\n"
    )
    index = read_index(tmp_path)
    assert list(index) == [("qpdf", "11.3.0-1")]
    assert index[("qpdf", "11.3.0-1")].filename == "qpdf_11.3.0-1_amd64.deb"


def test_an_index_that_unpacks_past_the_limit_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Packages.gz is read into the console's memory: a small file that unpacks to gigabytes
    must stop at the limit, not be unpacked whole."""
    monkeypatch.setattr("skills.install.apt.INDEX_MAX_BYTES", 1024 * 1024)
    stanza = b"Package: qpdf\nVersion: 1\nFilename: qpdf.deb\n\n"
    (tmp_path / "Packages.gz").write_bytes(gzip.compress(stanza + b"X: " + b"y" * (3 * 1024 * 1024)))
    with pytest.raises(StepFailed, match=r"Packages index over 1 MiB unpacked"):
        read_index(tmp_path)
    (tmp_path / "Packages.gz").write_bytes(gzip.compress(stanza))
    assert list(read_index(tmp_path)) == [("qpdf", "1")]
    (tmp_path / "Packages.gz").unlink()
    (tmp_path / "Packages").write_bytes(stanza + b"X: " + b"y" * (2 * 1024 * 1024))
    with pytest.raises(StepFailed, match=r"Packages index over 1 MiB unpacked"):
        index_file(tmp_path)  # before prepare_apt reads it whole to copy it in


def test_a_folder_without_an_index_is_named(tmp_path: Path) -> None:
    (tmp_path / "debian").mkdir()
    with pytest.raises(StepFailed, match=r"the apt repository folder debian/ has no Packages index"):
        read_index(tmp_path / "debian")
