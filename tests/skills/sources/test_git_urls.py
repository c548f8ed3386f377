"""What a git URL, ref and folder may be before git is ever run: the allowed hosts, the
transports (no remote helpers, file:// only when allowed), no credentials, clean folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from skills.sources.git import GitError, GitPolicy, check_host_entry, check_path, check_ref, check_url, folder_name

POLICY = GitPolicy(allowed_hosts=frozenset({"git.example.test", "127.0.0.1:9418", "[::1]"}))


@pytest.mark.parametrize(
    "url",
    [
        "https://git.example.test/skills.git",
        "http://git.example.test:8080/skills",
        "git://127.0.0.1:9418/skills",
        "https://[::1]/skills.git",
    ],
)
def test_urls_on_an_allowed_host_pass(url: str) -> None:
    assert check_url(f"  {url} ", POLICY) == url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("", "Give the repository's URL"),
        ("ext::sh -c touch% /tmp/pwned", "Remote helpers"),
        ("fd::3", "Remote helpers"),
        ("ssh://git.example.test/skills.git", "scheme ssh:// is not allowed"),
        ("git.example.test:skills.git", "scp-like"),
        ("https://other.example.test/skills.git", "host other.example.test is not in the allowed git hosts"),
        ("git://127.0.0.1:9419/skills", "host 127.0.0.1 is not in the allowed"),  # allowed on 9418 only
        ("https://user:secret@git.example.test/skills.git", "Credentials"),
        ("https://git.example.test/skills.git?x=1", "query"),
        ("file:///srv/skills", "file:// URLs are not allowed"),
        ("https://git.example.test/a b", "spaces"),
        ("https://git.example.test:99999/x", "port cannot be read"),
    ],
)
def test_refused_urls_say_why(url: str, reason: str) -> None:
    with pytest.raises(GitError) as refused:
        check_url(url, POLICY)
    assert reason in refused.value.message


def test_file_urls_need_the_local_paths_switch_and_a_folder(tmp_path: Path) -> None:
    local = GitPolicy(allow_local_paths=True)
    assert check_url(f"file://{tmp_path}", local) == f"file://{tmp_path}"
    with pytest.raises(GitError, match="no folder"):
        check_url(f"file://{tmp_path}/missing", local)
    with pytest.raises(GitError, match="path on this server"):
        check_url(f"file://elsewhere{tmp_path}", local)


@pytest.mark.parametrize("ref", ["-upload-pack=touch", "a..b", "main.lock", "x@{1}", "with space", "a//b"])
def test_refs_that_git_could_misread_are_refused(ref: str) -> None:
    with pytest.raises(GitError):
        check_ref(ref)


def test_refs_and_folders_that_pass() -> None:
    assert check_ref(" release/v1.2 ") == "release/v1.2"
    assert check_ref("") == ""
    assert check_path("/skills/pdf/") == "skills/pdf"
    assert check_path("") == ""
    assert folder_name("https://git.example.test/org/tools.git", "") == "tools"
    assert folder_name("https://git.example.test/org/tools.git", "skills/pdf") == "pdf"


@pytest.mark.parametrize("path", ["../x", "a/../../b", "a/./b", "a\\b", "a\x00b"])
def test_folders_leaving_the_repository_are_refused(path: str) -> None:
    with pytest.raises(GitError):
        check_path(path)


@pytest.mark.parametrize("entry", ["git.example.test", "Git.Example.Test:443", "10.0.0.1", "[::1]:9418"])
def test_host_entries(entry: str) -> None:
    assert check_host_entry(entry) == entry.lower()


@pytest.mark.parametrize("entry", ["https://git.example.test", "host/path", "host:0", "host:70000", "-x", "a b"])
def test_bad_host_entries(entry: str) -> None:
    with pytest.raises(GitError):
        check_host_entry(entry)


def test_without_git_on_the_server_the_refusal_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A console host without the git program: a refusal in words, never a traceback."""
    from skills.sources.git import GitLimits, remote_commit

    monkeypatch.setattr("skills.sources.git._argv", lambda args: [str(tmp_path / "no-git"), *args])
    with pytest.raises(GitError, match="git cannot run on the console server"):
        remote_commit("https://git.example.test/x.git", "", POLICY, GitLimits(timeout_s=5))


@pytest.mark.parametrize(
    "url",
    [
        "https://git.example.test/org/x\x9b2J.git",
        "https://git.example.test/org/\u202elld.git",
        "https://git.example.test/a\u200bb",
    ],
)
def test_urls_with_a_control_or_format_character_are_refused(url: str) -> None:
    """The rule of every skill name (`skills.names`): a C1 control repaints a terminal, a bidi
    override or zero-width space makes the stored and shown URL read as another."""
    with pytest.raises(GitError) as refused:
        check_url(url, POLICY)
    assert "control characters" in refused.value.message


@pytest.mark.parametrize("path", ["skills/x\x9b2J", "skills/\u202efdp", "skills/p\u200bdf", "a\u2028b"])
def test_folders_with_a_control_or_format_character_are_refused_before_git_runs(path: str) -> None:
    with pytest.raises(GitError) as refused:
        check_path(path)
    assert not any(char in refused.value.message for char in "\x9b\u202e\u200b\u2028")
