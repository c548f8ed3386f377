"""The install plan's check of every package against its source, before anything installs.

Run as the build's `check` step, right after the build sandbox exists and before the copy:
each Debian package, pip requirement and npm package the skills declare is looked up in the
source the config names, and the first pass collects every miss, so one failure names them
all. Nothing is installed and no installer runs; `install.packages` installs afterwards.

- Debian: in the image (`dpkg-query`), else in the backend's apt source with the version apt
  would install, and installable together from it (`install.apt.check_debian`). A template
  without npm needs Node.js and npm from Debian when a skill declares npm packages
  (`npm.node_debian_packages`): checked the same way, the reason added to a miss.
- pip, a find-links folder: read on the console host (the wheels' file names).
- pip, an index URL: each project's PEP 503 page, fetched from the build sandbox.
- npm, a tarball folder: read on the console host (each tarball's package.json), the
  packages' dependencies included (`npm.plan_folder`).
- npm, a registry URL: each package's document, fetched from the build sandbox, has a version
  in the declared range.

A requirement with an environment marker is not checked (pip evaluates it in the image).
Versions are matched with `packaging` (pip) and `npm.npm_range_matches` (npm's common range
forms: exact, `^`, `~`, comparators, x-ranges, hyphen ranges, `||`, dist-tags).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from sandboxes.backends.base import Backend

from .apt import check_debian
from .npm import few_versions, no_source_message, node_debian_packages, npm_range_matches, plan_folder
from .packages import (
    PackageSources,
    pep503_name,
    probe_page_url,
    probe_source,
    redact_userinfo,
)
from .steps import Log, SkillPayload, StepFailed, output_tail, run

STEP = "check"
LISTING_TIMEOUT_S = 15

# Fetches each URL from the build sandbox: argv kind (pip or npm), timeout, JSON list of
# URLs. Prints {url: {"status", "files" | "versions" and "tags" | "error"}}.
SOURCE_LISTING = """
import base64, json, re, sys, urllib.error, urllib.parse, urllib.request
kind, timeout, urls = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
out = {}
for url in urls:
    split = urllib.parse.urlsplit(url)
    netloc = split.hostname if ":" not in (split.hostname or "") else f"[{split.hostname}]"
    netloc += f":{split.port}" if split.port else ""
    request = urllib.request.Request(urllib.parse.urlunsplit(split._replace(netloc=netloc)))
    request.add_header("Accept", "application/json" if kind == "npm" else "text/html")
    if split.username is not None:
        pair = f"{urllib.parse.unquote(split.username)}:{urllib.parse.unquote(split.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = answer.read(50_000_000).decode("utf-8", "replace")
        if kind == "npm":
            doc = json.loads(body)
            if not isinstance(doc, dict):
                raise ValueError("the registry's document is not a JSON object")
            versions, tags = doc.get("versions"), doc.get("dist-tags")
            versions = sorted(versions) if isinstance(versions, dict) else []
            tags = {k: v for k, v in tags.items() if isinstance(v, str)} if isinstance(tags, dict) else {}
            out[url] = {"status": 200, "versions": versions, "tags": tags}
        else:
            out[url] = {"status": 200, "files": [n.strip() for n in re.findall(r"<a[^>]*>([^<]+)</a>", body)]}
    except urllib.error.HTTPError as exc:
        out[url] = {"status": exc.code}
    except (OSError, ValueError) as exc:
        out[url] = {"status": 0, "error": str(getattr(exc, "reason", None) or exc)}
print(json.dumps(out))
"""


def check_sources(
    backend: Backend, sandbox_id: str, skills: Sequence[SkillPayload], sources: PackageSources, log: Log
) -> None:
    """Every declared package present in its source in a matching version, or StepFailed
    naming each missing one and the source."""
    problems: list[str] = []
    planned: list[str] = []
    node, why = node_debian_packages(backend, sandbox_id, skills, STEP)  # npm's own, when the template lacks it
    declared = sorted({name for skill in skills for name in skill.debian_packages} - set(node))
    for names, reason in ((declared, ""), (node, why)):
        if names:
            found_problems, found_planned = check_debian(backend, sandbox_id, names, sources, log, step=STEP)
            problems += [f"{problem} (needed: {reason})" if reason else problem for problem in found_problems]
            planned += found_planned
    npm = [(skill, dep) for skill in skills for dep in skill.npm_packages]
    if npm:
        _check_npm(backend, sandbox_id, npm, sources, problems, planned, log)
    pip = [(skill, requirement) for skill in skills for requirement in skill.pip_requirements]
    if pip:
        _check_pip(backend, sandbox_id, pip, sources, problems, planned, log)
    for line in planned:
        log(f"plan: {line}")
    if problems:
        raise StepFailed(STEP, "; ".join(problems))
    log(f"every package found in its source ({len(planned)} checked)" if planned else "no packages to check")


def _check_npm(
    backend: Backend,
    sandbox_id: str,
    needs: list[tuple[SkillPayload, dict[str, str]]],
    sources: PackageSources,
    problems: list[str],
    planned: list[str],
    log: Log,
) -> None:
    names = ", ".join(f"{dep['name']}@{dep['version']}" for _, dep in needs)
    if not sources.has_npm:
        problems.append(no_source_message((skill.name for skill, _ in needs), names))
        return
    if sources.npm_folder is not None:
        plan = plan_folder(sources.npm_folder, [(dep["name"], dep["version"]) for _, dep in needs])
        problems += plan.problems
        planned += plan.planned
        return
    registry = sources.npm_registry_url
    try:
        probe_source(
            backend,
            sandbox_id,
            "the npm registry",
            registry,
            log,
            page_url=probe_page_url(registry, needs[0][1]["name"], pep503=False),
            step=STEP,
        )
    except StepFailed as exc:  # named with the other misses
        problems.append(exc.message)
        return
    urls = {dep["name"]: probe_page_url(registry, dep["name"], pep503=False) for _, dep in needs}
    listing = _listing(backend, sandbox_id, "npm", sorted(set(urls.values())))
    shown = f"the npm registry {redact_userinfo(registry)}"
    for _, dep in needs:
        answer = listing.get(urls[dep["name"]]) or {}
        if answer.get("status") != 200:
            problems.append(f"npm {dep['name']}@{dep['version']}: not in {shown} ({_why(answer)})")
            continue
        versions = [str(v) for v in answer.get("versions") or []]
        matching = npm_range_matches(dep["version"], versions, dict(answer.get("tags") or {}))
        if not matching:
            problems.append(
                f"npm {dep['name']}@{dep['version']}: {shown} has {few_versions(versions)}, "
                f"none in the range {dep['version']}"
            )
        else:
            planned.append(f"npm {dep['name']}@{dep['version']}: {matching[-1]} in {shown}")


def _check_pip(
    backend: Backend,
    sandbox_id: str,
    needs: list[tuple[SkillPayload, str]],
    sources: PackageSources,
    problems: list[str],
    planned: list[str],
    log: Log,
) -> None:
    if not sources.has_pip:
        problems.append(
            "the skill declares pip dependencies but the config has no pip package source "
            "(set 'pip find-links folder' or 'pip index URL' on the config)"
        )
        return
    parsed: list[Requirement] = []
    for _, text in needs:
        try:
            parsed.append(Requirement(text))
        except InvalidRequirement as exc:
            problems.append(f"pip {text}: not a requirement pip can read ({exc})")
    if sources.pip_folder is not None:
        shown = f"the pip find-links folder {sources.pip_folder.name}/"
        files = [path.name for path in sources.pip_folder.rglob("*.whl") if path.is_file() and not path.is_symlink()]
        available = wheel_versions(files)
        lookup: dict[str, list[Version]] = {
            canonicalize_name(req.name): available.get(canonicalize_name(req.name), []) for req in parsed
        }
    else:
        index = sources.pip_index_url
        shown = f"the pip index {redact_userinfo(index)}"
        first = pep503_name(parsed[0].name) if parsed else None
        probe_source(backend, sandbox_id, "the pip index", index, log, page_url=probe_page_url(index, first), step=STEP)
        urls = {canonicalize_name(req.name): probe_page_url(index, pep503_name(req.name)) for req in parsed}
        listing = _listing(backend, sandbox_id, "pip", sorted(set(urls.values())))
        lookup = {}
        for name, url in urls.items():
            answer = listing.get(url) or {}
            if answer.get("status") == 200:
                lookup[name] = wheel_versions([str(f) for f in answer.get("files") or []]).get(name, [])
            else:
                lookup[name] = []
    for req in parsed:
        name = canonicalize_name(req.name)
        if req.marker is not None:
            planned.append(f"pip {req}: not checked (pip evaluates the marker in the image)")
            continue
        versions = lookup.get(name, [])
        if not versions:
            problems.append(f"pip {req}: no wheel of {req.name} in {shown}")
            continue
        matching = list(req.specifier.filter(versions, prereleases=True if req.specifier.prereleases else None))
        if not matching:
            problems.append(
                f"pip {req}: {shown} has {req.name} {few_versions([str(v) for v in versions])}, "
                f"none matching {req.specifier}"
            )
        else:
            planned.append(f"pip {req}: {max(matching)} in {shown}")


def wheel_versions(filenames: list[str]) -> dict[str, list[Version]]:
    """{normalised project name: sorted versions} of the wheel file names (others skipped)."""
    found: dict[str, set[Version]] = {}
    for filename in filenames:
        if not filename.endswith(".whl"):
            continue
        try:
            name, version, _, _ = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        found.setdefault(str(name), set()).add(version)
    return {name: sorted(versions) for name, versions in found.items()}


def _listing(backend: Backend, sandbox_id: str, kind: str, urls: list[str]) -> dict[str, dict[str, Any]]:
    argv = ["python3", "-c", SOURCE_LISTING, kind, str(LISTING_TIMEOUT_S), json.dumps(urls)]
    result = run(backend, sandbox_id, STEP, shlex.join(argv), timeout_s=LISTING_TIMEOUT_S * len(urls) + 30, check=False)
    try:
        answer = json.loads(result.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise StepFailed(
            STEP, f"could not list the {kind} source from the build sandbox: {output_tail(result)}"
        ) from None
    return answer if isinstance(answer, dict) else {}


def _why(answer: dict[str, Any]) -> str:
    status = answer.get("status")
    return f"HTTP {status}" if status else str(answer.get("error") or "no answer")
