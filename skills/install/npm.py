"""npm for skill installs: the sources (the config's registry URL, or a folder of tarballs
served to npm inside the build sandbox), the ranges npm accepts, Node.js from Debian when the
template lacks npm, and `npm install` itself.

npm never runs a package's scripts here. A skill's package.json, and any package it pulls
in, may declare `preinstall`/`install`/`postinstall`; npm would run them with the installing
user's rights during the build. So every install passes `--ignore-scripts`, runs as the
session user (uid 1000) in a work folder of its own, and reads no `.npmrc` of the skill or
the image; only the finished `node_modules` is moved into the root-owned skill folder. A
package with an install script is named in a warning: a native part it would have built is
missing, and verify (or the skill) fails where it is used (docs/skills.md, "npm").

The tarball folder works offline, like the pip wheel folder: the console reads each
tarball's package.json on its host (the check needs no sandbox), copies in the tarballs the
skills need (their dependencies included), and starts a registry of them on 127.0.0.1 inside
the build sandbox (`REGISTRY_SERVER`, run by node as the session user); npm installs from
it as from any registry.

Orchestration over a `Backend` like `install.packages`: no ORM, no settings. May import
`sandboxes.backends` and `skills.install`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
import re
import shlex
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxes.backends.base import Backend

from .packages import PackageSources, probe_page_url, probe_source, redact_userinfo
from .steps import Log, SkillPayload, StepFailed, last_json_line, output_tail, run, tar_of, upload_tree

STEP = "dependencies"
NPM_TIMEOUT_S = 600.0
SESSION_USER = "user"
# npm's work folder, owned by the session user; outside the root-only scratch folder.
NPM_WORK = "/tmp/skill-build-npm"  # noqa: S108 - inside the build sandbox, removed after the step
REGISTRY_DIR = f"{NPM_WORK}/registry"
# What a template without npm needs for it, from a Debian package source.
NODE_DEBIAN_PACKAGES = ("nodejs", "npm")
TARBALL_MANIFEST_MAX = 1_000_000  # bytes of a tarball's package.json read on the console host

# No config file of the image or the user (a registry, a scoped registry or scripts turned
# back on would come from there); scripts off; the cache and home in the work folder.
NPM_ENV = {
    "HOME": NPM_WORK,
    # Files that do not exist (npm refuses one file for both).
    "NPM_CONFIG_USERCONFIG": f"{NPM_WORK}/no-user-npmrc",
    "NPM_CONFIG_GLOBALCONFIG": f"{NPM_WORK}/no-global-npmrc",
    "NPM_CONFIG_CACHE": f"{NPM_WORK}/cache",
    "NPM_CONFIG_IGNORE_SCRIPTS": "true",
    "NPM_CONFIG_UPDATE_NOTIFIER": "false",
    "NPM_CONFIG_FUND": "false",
    "NPM_CONFIG_AUDIT": "false",
}

# A registry of the copied tarballs on 127.0.0.1 (node, argv: folder, port file). The folder
# holds index.json ({name: {version: {manifest, file, shasum, integrity}}}, "latest") and
# files/. Serves `/<name>` (a packument) and `/-/files/<file>`; nothing else.
REGISTRY_SERVER = r"""
const http = require("http"), fs = require("fs"), path = require("path");
const [root, portFile] = process.argv.slice(1);
const index = JSON.parse(fs.readFileSync(path.join(root, "index.json"), "utf8"));
const files = new Set();
for (const versions of Object.values(index.packages)) for (const v of Object.values(versions)) files.add(v.file);
const server = http.createServer((req, res) => {
  let url = "";
  try { url = decodeURIComponent(req.url.split("?")[0]); } catch (e) {}
  const base = "http://127.0.0.1:" + server.address().port;
  if (url.startsWith("/-/files/") && files.has(url.slice(9))) {
    res.writeHead(200, {"Content-Type": "application/octet-stream"});
    fs.createReadStream(path.join(root, "files", url.slice(9))).pipe(res);
    return;
  }
  const name = url.slice(1), versions = index.packages[name];
  if (!versions) { res.writeHead(404, {"Content-Type": "application/json"}); res.end('{"error":"not found"}'); return; }
  const doc = {name: name, "dist-tags": {latest: index.latest[name]}, versions: {}};
  for (const [version, entry] of Object.entries(versions)) {
    doc.versions[version] = Object.assign({}, entry.manifest, {name: name, version: version, dist: {
      tarball: base + "/-/files/" + entry.file, shasum: entry.shasum, integrity: entry.integrity}});
  }
  res.writeHead(200, {"Content-Type": "application/json"});
  res.end(JSON.stringify(doc));
});
server.listen(0, "127.0.0.1", () => fs.writeFileSync(portFile, String(server.address().port)));
"""

# What npm put in node_modules (node, argv: the work folder): every package, and every
# package with an install script (npm's own rule: preinstall, install, postinstall,
# or a binding.gyp, which npm would build with node-gyp).
INSTALLED_REPORT = r"""
const fs = require("fs"), path = require("path");
const installed = new Set(), scripted = new Set();
function walk(dir) {
  let names = [];
  try { names = fs.readdirSync(dir); } catch (e) { return; }
  for (const name of names) {
    if (name.startsWith(".")) continue;
    const folder = path.join(dir, name);
    if (name.startsWith("@")) { walk(folder); continue; }
    let pkg;
    try { pkg = JSON.parse(fs.readFileSync(path.join(folder, "package.json"), "utf8")); } catch (e) { continue; }
    const id = pkg.name + "@" + pkg.version, scripts = pkg.scripts || {};
    installed.add(id);
    if (scripts.preinstall || scripts.install || scripts.postinstall || fs.existsSync(path.join(folder, "binding.gyp")))
      scripted.add(id);
    walk(path.join(folder, "node_modules"));
  }
}
walk(path.join(process.argv[1], "node_modules"));
console.log(JSON.stringify({installed: [...installed].sort(), scripted: [...scripted].sort()}));
"""


# --- Node.js ----------------------------------------------------------------------------


def node_debian_packages(
    backend: Backend, sandbox_id: str, skills: Sequence[SkillPayload], step: str
) -> tuple[list[str], str]:
    """The Debian packages of Node.js and npm, and why, when a skill declares npm packages and
    the image has no npm; ([], "") otherwise. The Debian step checks and installs them like
    any Debian package the skills declare."""
    needing = sorted({skill.name for skill in skills if skill.npm_packages})
    if not needing or run(backend, sandbox_id, step, "command -v npm", check=False).exit_code == 0:
        return [], ""
    return list(NODE_DEBIAN_PACKAGES), f"npm is not in the template and {', '.join(needing)} declares npm packages"


def no_source_message(skills: Iterable[str], packages: str) -> str:
    return (
        f"{', '.join(sorted(set(skills)))} declares npm dependencies ({packages}) but the config has no npm "
        "package source (set 'npm tarball folder' or 'npm registry URL' on the backend)"
    )


# --- The tarball folder -----------------------------------------------------------------


@dataclass(frozen=True)
class Tarball:
    """One tarball of the folder: its package.json and where it is."""

    name: str
    version: str
    path: Path
    manifest: Mapping[str, Any]

    @property
    def has_install_script(self) -> bool:
        scripts = self.manifest.get("scripts") or {}
        return isinstance(scripts, dict) and any(scripts.get(key) for key in ("preinstall", "install", "postinstall"))


def folder_tarballs(folder: Path) -> dict[str, dict[str, Tarball]]:
    """{package name: {version: Tarball}} of the `.tgz` files in (or below) the folder; links
    and tarballs without a readable package.json are skipped."""
    found: dict[str, dict[str, Tarball]] = {}
    for path in sorted(folder.rglob("*.tgz")):
        if path.is_symlink() or not path.is_file():
            continue
        manifest = tarball_manifest(path)
        if manifest is None:
            continue
        name, version = manifest.get("name"), manifest.get("version")
        if isinstance(name, str) and isinstance(version, str) and _release(version) is not None:
            found.setdefault(name, {})[version] = Tarball(name, version, path, manifest)
    return found


def tarball_manifest(path: Path) -> dict[str, Any] | None:
    """The package.json of an npm tarball (`package/package.json`, or another one-folder-deep
    package.json as some publishers pack it); None when unreadable."""
    try:
        with tarfile.open(path, "r:gz") as archive:
            members = [m for m in archive.getmembers() if m.isfile() and m.name.count("/") == 1]
            chosen = next((m for m in members if m.name == "package/package.json"), None) or next(
                (m for m in members if m.name.endswith("/package.json")), None
            )
            if chosen is None or chosen.size > TARBALL_MANIFEST_MAX:
                return None
            extracted = archive.extractfile(chosen)
            document = json.loads(extracted.read()) if extracted is not None else None
    except (OSError, tarfile.TarError, ValueError, RecursionError, EOFError):
        return None
    return document if isinstance(document, dict) else None


@dataclass
class FolderPlan:
    """What the folder gives for the skills' npm needs: a `plan:` line per declared package,
    a problem per miss (a dependency's too), and the tarballs npm will need."""

    planned: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tarballs: dict[str, dict[str, Tarball]] = field(default_factory=dict)


def plan_folder(folder: Path, needs: Sequence[tuple[str, str]]) -> FolderPlan:
    """Resolve (name, range) needs against the folder, dependencies included, as npm would:
    the highest version in range, then its dependencies and required peers; a missing
    optional dependency is no miss."""
    available = folder_tarballs(folder)
    shown = f"the npm tarball folder {folder.name}/"
    plan = FolderPlan()
    queue: list[tuple[str, str, str | None, bool]] = [(name, spec, None, False) for name, spec in needs]
    done: set[tuple[str, str]] = set()
    while queue:
        name, spec, parent, optional = queue.pop(0)
        of = f" (a dependency of {parent})" if parent else ""
        versions = available.get(name) or {}
        if not isinstance(spec, str) or ":" in spec or "/" in spec:
            plan.planned.append(f"npm {name}@{spec}{of}: not checked (not a registry range)")
            continue
        matching = npm_range_matches(spec, list(versions), {"latest": latest_version(versions)})
        if not matching:
            if not optional:
                has = (
                    f"has {few_versions(sorted(versions, key=_release_key))}, none in the range {spec}"
                    if versions
                    else ""
                )
                plan.problems.append(f"npm {name}@{spec}{of}: " + (f"{shown} {has}" if has else f"not in {shown}"))
            continue
        chosen = matching[-1]
        if parent is None:
            plan.planned.append(f"npm {name}@{spec}: {chosen} in {shown}")
        if (name, chosen) in done:
            continue
        done.add((name, chosen))
        plan.tarballs.setdefault(name, dict(versions))
        manifest = versions[chosen].manifest
        queue += [(dep, rng, f"{name}@{chosen}", False) for dep, rng in _mapping(manifest, "dependencies")]
        optional_peers = {k for k, v in dict(manifest.get("peerDependenciesMeta") or {}).items() if _is_optional(v)}
        queue += [
            (dep, rng, f"{name}@{chosen}", dep in optional_peers) for dep, rng in _mapping(manifest, "peerDependencies")
        ]
        queue += [(dep, rng, f"{name}@{chosen}", True) for dep, rng in _mapping(manifest, "optionalDependencies")]
    return plan


def _mapping(manifest: Mapping[str, Any], key: str) -> list[tuple[str, str]]:
    value = manifest.get(key)
    return [(str(k), str(v)) for k, v in value.items()] if isinstance(value, dict) else []


def _is_optional(meta: object) -> bool:
    return isinstance(meta, dict) and bool(meta.get("optional"))


def latest_version(versions: Iterable[str]) -> str:
    releases = sorted((key, text) for text in versions if (key := _release(text)) is not None)
    return releases[-1][1] if releases else ""


def _release_key(text: str) -> tuple[int, int, int]:
    return _release(text) or (-1, -1, -1)


def few_versions(versions: list[str]) -> str:
    """The last five versions, for a message."""
    shown = versions[-5:]
    return ("… " if len(versions) > len(shown) else "") + ", ".join(shown) if shown else "no versions"


def registry_index(tarballs: Mapping[str, Mapping[str, Tarball]]) -> tuple[bytes, list[tuple[str, int, bytes]]]:
    """The served registry's index.json and its files (named by content hash) for upload."""
    packages: dict[str, dict[str, Any]] = {}
    files: dict[str, bytes] = {}
    for name, versions in tarballs.items():
        for version, tarball in versions.items():
            data = tarball.path.read_bytes()
            sha1 = hashlib.sha1(data, usedforsecurity=False).hexdigest()
            file = f"{sha1}.tgz"
            files[file] = data
            manifest = dict(tarball.manifest)
            manifest["hasInstallScript"] = tarball.has_install_script
            packages.setdefault(name, {})[version] = {
                "manifest": manifest,
                "file": file,
                "shasum": sha1,
                "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
            }
    latest = {name: latest_version(versions) for name, versions in packages.items()}
    index = json.dumps({"packages": packages, "latest": latest}).encode()
    return index, [(f"files/{file}", 0o644, data) for file, data in sorted(files.items())]


# --- Installing -------------------------------------------------------------------------


def install_npm(
    backend: Backend, sandbox_id: str, skills: Sequence[SkillPayload], sources: PackageSources, log: Log
) -> dict[str, list[str]]:
    """npm install of each skill's npm packages, scripts off, as the session user. Returns
    {skill name: installed name@version} for the skills with npm packages."""
    npm_skills = [skill for skill in skills if skill.npm_packages]
    if not npm_skills:
        return {}
    if not sources.has_npm:
        packages = ", ".join(f"{dep['name']}@{dep['version']}" for s in npm_skills for dep in s.npm_packages)
        raise StepFailed(STEP, no_source_message((s.name for s in npm_skills), packages))
    if run(backend, sandbox_id, STEP, "command -v npm", check=False).exit_code != 0:
        raise StepFailed(
            STEP,
            "npm is not in the image; Node.js and npm come from the Debian packages "
            + ", ".join(NODE_DEBIAN_PACKAGES)
            + " (a Debian package source on the backend, or a template that has them)",
        )
    user = shlex.quote(SESSION_USER)
    run(backend, sandbox_id, STEP, f"rm -rf {NPM_WORK} && mkdir -p {NPM_WORK} && chown {user}: {NPM_WORK}")
    try:
        registry, shown = _registry(backend, sandbox_id, npm_skills, sources, log)
        return {skill.name: _install_skill(backend, sandbox_id, skill, registry, shown, log) for skill in npm_skills}
    finally:
        run(
            backend,
            sandbox_id,
            STEP,
            f"[ -f {REGISTRY_DIR}/pid ] && kill $(cat {REGISTRY_DIR}/pid); rm -rf {NPM_WORK}; true",
            check=False,
        )


def _registry(
    backend: Backend, sandbox_id: str, skills: Sequence[SkillPayload], sources: PackageSources, log: Log
) -> tuple[str, str]:
    """The registry URL npm uses, and how the log names the source."""
    if sources.npm_folder is None:
        url = sources.npm_registry_url
        first = skills[0].npm_packages[0]["name"]
        probe_source(
            backend, sandbox_id, "the npm registry", url, log, page_url=probe_page_url(url, first, pep503=False)
        )
        return url, f"the npm registry {redact_userinfo(url)}"
    folder = sources.npm_folder
    shown = f"the npm tarball folder {folder.name}/"
    plan = plan_folder(folder, [(dep["name"], dep["version"]) for skill in skills for dep in skill.npm_packages])
    if plan.problems:
        raise StepFailed(STEP, "; ".join(plan.problems))
    index, files = registry_index(plan.tarballs)
    upload_tree(backend, sandbox_id, STEP, tar_of([("index.json", 0o644, index), *files]), REGISTRY_DIR)
    server = shlex.join(["setsid", "node", "-e", REGISTRY_SERVER, REGISTRY_DIR, f"{REGISTRY_DIR}/port"])
    run(backend, sandbox_id, STEP, f"chown -R {shlex.quote(SESSION_USER)}: {REGISTRY_DIR}")
    started = run(
        backend,
        sandbox_id,
        STEP,
        f"{server} >{REGISTRY_DIR}/log 2>&1 </dev/null & echo $! >{REGISTRY_DIR}/pid;"
        f" for i in $(seq 100); do [ -s {REGISTRY_DIR}/port ] && exec cat {REGISTRY_DIR}/port; sleep 0.1; done;"
        f" cat {REGISTRY_DIR}/log; exit 1",
        user=SESSION_USER,
        cwd=NPM_WORK,
        check=False,
    )
    port = started.stdout.decode(errors="replace").strip()
    if started.exit_code != 0 or not port.isdigit():
        raise StepFailed(STEP, f"could not serve {shown} inside the build sandbox: {output_tail(started)}")
    count = sum(len(versions) for versions in plan.tarballs.values())
    log(f"serving {shown} ({count} tarball(s)) to npm on 127.0.0.1:{port} inside the build sandbox")
    return f"http://127.0.0.1:{port}/", shown


def package_folders(skill: SkillPayload) -> dict[str, dict[str, str]]:
    """{folder inside the skill: {name: version range}}: a declared package goes beside its
    package.json; a confirmed need (its source says where it was found) to the skill's root."""
    by_folder: dict[str, dict[str, str]] = {}
    for dep in skill.npm_packages:
        source = str(dep.get("source", "package.json"))
        folder = posixpath.dirname(source) if posixpath.basename(source) == "package.json" else ""
        by_folder.setdefault(folder, {})[dep["name"]] = dep["version"]
    return by_folder


def _install_skill(
    backend: Backend, sandbox_id: str, skill: SkillPayload, registry: str, shown: str, log: Log
) -> list[str]:
    """Each folder's declared packages (the validated list, never the skill's raw package.json
    or lock: URL and git specs stay out) installed in a work folder, then moved in."""
    installed: list[str] = []
    for number, (folder, dependencies) in enumerate(sorted(package_folders(skill).items())):
        work = f"{NPM_WORK}/{skill.name}-{number}"
        package = {"name": "skill-dependencies", "version": "0.0.0", "private": True, "dependencies": dependencies}
        upload_tree(backend, sandbox_id, STEP, tar_of([("package.json", 0o644, json.dumps(package).encode())]), work)
        run(backend, sandbox_id, STEP, f"chown -R {shlex.quote(SESSION_USER)}: {shlex.quote(work)}")
        argv = ["npm", "install", "--ignore-scripts", "--omit=dev", "--no-audit", "--no-fund", "--registry", registry]
        log(f"npm install for {skill.name} from {shown} (scripts off, as {SESSION_USER}): {', '.join(dependencies)}")
        result = run(
            backend,
            sandbox_id,
            STEP,
            shlex.join(argv),
            user=SESSION_USER,
            cwd=work,
            env=NPM_ENV,
            timeout_s=NPM_TIMEOUT_S,
            check=False,
        )
        if result.exit_code != 0:
            raise StepFailed(STEP, f"npm install for {skill.name} failed from {shown}: {output_tail(result)}")
        report = _report(backend, sandbox_id, work)
        for package_id in report.get("scripted", []):
            log(
                f"{skill.name}: warning: npm package {package_id} has an install script, which was not run "
                "(npm runs with --ignore-scripts); what it would build is missing"
            )
        installed += report.get("installed", [])
        target = shlex.quote(posixpath.join(skill.root, folder) if folder else skill.root)
        modules = shlex.quote(f"{work}/node_modules")
        run(
            backend,
            sandbox_id,
            STEP,
            f"rm -rf {target}/node_modules && if [ -d {modules} ]; then mv {modules} {target}/node_modules"
            f" && chown -R root:root {target}/node_modules && chmod -R go-w {target}/node_modules; fi",
        )
    log(f"npm installed for {skill.name}: {', '.join(installed) or 'nothing'}")
    return installed


def _report(backend: Backend, sandbox_id: str, work: str) -> dict[str, list[str]]:
    result = run(
        backend,
        sandbox_id,
        STEP,
        shlex.join(["node", "-e", INSTALLED_REPORT, work]),
        user=SESSION_USER,
        check=False,
    )
    report = last_json_line(result)
    return {key: [str(item) for item in report.get(key) or []] for key in ("installed", "scripted")}


# --- npm ranges ---------------------------------------------------------------------------

_SEMVER = re.compile(r"^v?(\d+|[xX*])(?:\.(\d+|[xX*]))?(?:\.(\d+|[xX*]))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


def _release(text: str) -> tuple[int, int, int] | None:
    """A published version's (major, minor, patch); None for a prerelease or not semver."""
    match = _SEMVER.match(text.strip())
    if match is None or match.group(4) or not all(part and part.isdigit() for part in match.groups()[:3]):
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def _bounds(comparator: str) -> list[tuple[str, tuple[int, int, int]]] | None:
    """One comparator (`^1.2`, `~1.2.3`, `>=1`, `1.x`, `1.2.3`) as (operator, version) pairs."""
    operator_match = re.match(r"^(\^|~|>=|<=|>|<|=)?\s*(.*)$", comparator)
    assert operator_match is not None
    operator, rest = operator_match.group(1) or "", operator_match.group(2)
    match = _SEMVER.match(rest)
    if match is None:
        return None
    parts = [int(p) if p and p.isdigit() else None for p in match.groups()[:3]]
    major, minor, patch = parts
    if major is None:
        return []  # *, x: anything
    low = (major, minor or 0, patch or 0)
    if operator == "^":
        if major > 0 or minor is None:
            return [(">=", low), ("<", (major + 1, 0, 0))]
        if minor > 0 or patch is None:
            return [(">=", low), ("<", (0, minor + 1, 0))]
        return [(">=", low), ("<", (0, 0, patch + 1))]
    if operator == "~":
        return [(">=", low), ("<", (major, minor + 1, 0) if minor is not None else (major + 1, 0, 0))]
    partial_top = (major + 1, 0, 0) if minor is None else (major, minor + 1, 0) if patch is None else None
    if operator in ("", "="):
        return [(">=", low), ("<", partial_top)] if partial_top else [("=", low)]
    if operator == ">" and partial_top:
        return [(">=", partial_top)]
    if operator == "<=" and partial_top:
        return [("<", partial_top)]
    return [(operator, low)]


def npm_range_matches(spec: str, versions: list[str], tags: dict[str, str]) -> list[str]:
    """The published versions (releases, sorted) npm's range `spec` accepts; a dist-tag
    (`latest`) matches the version it points at; `1.2 - 2.3` is `>=1.2 <=2.3`."""
    spec = spec.strip()
    if spec in tags:
        return [str(tags[spec])] if str(tags[spec]) in versions else []
    releases = sorted((release, text) for text in versions if (release := _release(text)) is not None)
    accepted = []
    for release, text in releases:
        for alternative in spec.split("||"):
            hyphen = re.sub(r"(\S+)\s+-\s+(\S+)", r">=\1 <=\2", alternative.strip())
            words = re.sub(r"(\^|~|>=|<=|>|<|=)\s+", r"\1", hyphen).split() or ["*"]
            bounds = [_bounds(word) for word in words]
            if any(bound is None for bound in bounds):
                continue
            if all(_holds(release, operator, version) for bound in bounds for operator, version in bound or []):
                accepted.append(text)
                break
    return accepted


def _holds(release: tuple[int, int, int], operator: str, version: tuple[int, int, int]) -> bool:
    return {
        ">=": release >= version,
        "<=": release <= version,
        ">": release > version,
        "<": release < version,
        "=": release == version,
    }[operator]
