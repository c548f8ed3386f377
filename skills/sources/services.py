"""Skills from git repositories: the allowed hosts, importing a folder of a commit, checking
for a newer commit, and importing it as a new version.

An import from git is an archive import: git hands over the commit's folder as a tar.gz and
`skills.services.import_archive`'s reader and `do_import_skill` run on it, so every check of
an upload applies (names, links, sizes, dropped folders, modes) and it is audited
`skill.import` like any import. The skill's `GitSource` row records the URL, ref, folder and
commit in the same transaction. Checks (`check_git_source`) only read the remote and store
what they saw; they are not audited. Only platform admins reach any of this (the pages and
the command), as for every catalog write.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from console.models import AuditAction
from console.periodic import periodic
from console.services import Actor, ServiceError, record_audit

from ..archives import ArchiveError, Limits, read_archive
from ..models import GitHostPolicy, GitSource, Skill
from ..services import ImportResult, do_import_skill
from ..tuning import SKILLS
from .git import GitError, GitLimits, GitPolicy, check_host_entry, check_path, check_ref, check_url, fetch_skill
from .git import remote_commit as ask_remote_commit

logger = logging.getLogger(__name__)

# A periodic pass checks at most this many sources, and starts none after PASS_BUDGET_S: the
# in-process scheduler runs its tasks one after another, so a pass must not hold the reaper
# up. The oldest checks go first; the rest wait for the next pass.
CHECKS_PER_PASS = 50
PASS_BUDGET_S = 30.0


def git_policy() -> GitPolicy:
    row = GitHostPolicy.objects.filter(pk=1).first()
    if row is None:
        return GitPolicy()
    return GitPolicy(allowed_hosts=frozenset(row.host_list), allow_local_paths=row.allow_local_paths)


def do_set_git_hosts(hosts: list[str], *, allow_local_paths: bool, actor: Actor) -> GitHostPolicy:
    """Replace the allowed git hosts (each `host` or `host:port`); audited `skill.git_hosts`."""
    try:
        cleaned = sorted({check_host_entry(host) for host in hosts if host.strip()})
    except GitError as exc:
        raise ServiceError(exc.message) from None
    with transaction.atomic():
        row, _ = GitHostPolicy.objects.select_for_update().get_or_create(pk=1)
        before = row.host_list
        row.allowed_hosts = "\n".join(cleaned)
        row.allow_local_paths = allow_local_paths
        row.updated_by_name = actor.name[:150]
        row.save()
        record_audit(
            actor,
            AuditAction.SKILL_GIT_HOSTS,
            target_type="git_hosts",
            target_id="",
            target_name="allowed git hosts",
            details={
                "hosts": cleaned,
                "added": [host for host in cleaned if host not in before],
                "removed": [host for host in before if host not in cleaned],
                "allow_local_paths": allow_local_paths,
            },
        )
    return row


def _limits() -> GitLimits:
    # The fetched objects of one commit may be as large as an unpacked skill.
    return GitLimits(timeout_s=SKILLS.git_timeout_s, max_bytes=Limits.from_settings().uncompressed_bytes)


def import_from_git(url: str, ref: str, path: str, *, actor: Actor, expect: Skill | None = None) -> ImportResult:
    """Fetch `ref` (default branch if empty), read folder `path` as an archive and import it.

    With `expect`, the folder must still hold that skill (an update): another name refuses.
    Raises ServiceError with the reason; a refusal leaves nothing written."""
    policy = git_policy()
    try:
        url, ref, path = check_url(url, policy), check_ref(ref), check_path(path)
        with fetch_skill(url, ref, path, policy, _limits()) as fetched:
            with fetched.archive.open("rb") as archive:
                source = read_archive(archive, fetched.filename, Limits.from_settings())
            commit = fetched.commit
    except (GitError, ArchiveError) as exc:
        raise ServiceError(exc.message) from None
    origin = f"git {url}{' ' + ref if ref else ''}{' ' + path if path else ''} @ {commit[:12]}"[:300]
    try:
        with transaction.atomic():
            result = do_import_skill(source, actor=actor, origin=origin, source_commit=commit)
            skill = result.version.skill
            if expect is not None and skill.pk != expect.pk:
                raise ServiceError(
                    f"Commit {commit[:12]} holds the skill {skill.name!r} in that folder, not {expect.name!r}; "
                    "nothing was imported."
                )
            GitSource.objects.update_or_create(
                skill=skill,
                defaults={
                    "url": url,
                    "ref": ref,
                    "path": path,
                    "commit": commit,
                    "remote_commit": commit,
                    "checked": timezone.now(),
                    "check_error": "",
                },
            )
    finally:
        source.close()
    return result


def check_git_source(source: GitSource) -> GitSource:
    """Ask the remote which commit the source's ref names now; store it, or the error."""
    limits = GitLimits(timeout_s=SKILLS.git_check_timeout_s)
    try:
        seen = ask_remote_commit(source.url, source.ref, git_policy(), limits)
    except GitError as exc:
        source.check_error = exc.message[:2000]
    else:
        source.remote_commit, source.check_error = seen, ""
    source.checked = timezone.now()
    source.save(update_fields=["remote_commit", "check_error", "checked", "updated"])
    return source


def update_from_git(source: GitSource, *, actor: Actor) -> ImportResult:
    """Import the ref's newest commit as a new version of the source's skill (audited like an import)."""
    return import_from_git(source.url, source.ref, source.path, actor=actor, expect=source.skill)


# Runs hourly (or more often for a shorter interval); each source is checked once per interval.
@periodic("skill-git-check", task="skills.git_check", every=lambda: min(SKILLS.git_check_interval_s or 3600.0, 3600.0))
def check_git_sources() -> int:
    """Check the sources not checked for `git_check_interval_s`, oldest first; returns how many."""
    interval = SKILLS.git_check_interval_s
    if interval <= 0:
        return 0
    due = timezone.now() - timedelta(seconds=interval)
    sources = GitSource.objects.select_related("skill").filter(Q(checked__isnull=True) | Q(checked__lt=due))
    sources = sources.order_by(F("checked").asc(nulls_first=True))
    done, started = 0, time.monotonic()
    for source in sources[:CHECKS_PER_PASS]:
        if time.monotonic() - started > PASS_BUDGET_S:
            break
        check_git_source(source)
        done += 1
        if source.check_error:
            logger.info("git source of %s: %s", source.skill.name, source.check_error)
    return done
