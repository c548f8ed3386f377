"""A skill's dependency report: what it declares, what its files show it needs, what was set
aside (pure: no ORM, no settings; reads a {path: bytes} mapping).

Most published skills declare nothing in a form an installer reads: SKILL.md says "pip install
pypdf" or "requires LibreOffice", scripts import `PIL` and call `soffice`. The report reads
them so an admin can confirm the needs into the skill's install plan:

- **declared**: `requirements.txt` and `package.json` (root or `scripts/`), `pyproject.toml`
  `[project] dependencies`, frontmatter `metadata` `debian-packages` (what the installer
  reads), and a frontmatter `dependencies` key (a string or list of pip requirements);
- **inferred**: Python imports read with `ast` from the skill's scripts (and per line from
  Python code blocks of its Markdown), mapped to distributions through `IMPORT_TO_DISTRIBUTION`
  where the names differ; programs called from scripts (`subprocess`, `os.system`,
  `shutil.which`, shell lines) and named in Markdown ("requires LibreOffice", `pdftoppm` in a
  code block) mapped to Debian packages through `PROGRAM_TO_DEBIAN`; `pip install`,
  `npm install` and `apt-get install` lines in Markdown and shell scripts; `require()` and
  `import` of Node modules in .js/.mjs/.cjs/.ts files;
- **ignored**: standard-library modules (`sys.stdlib_module_names`), Node built-ins, the skill's
  own modules, and programs with no known Debian package (listed so a reader can check).

Each entry says where it was found (`file:line`). Names an import is assumed to share with its
distribution are marked, so the admin can correct them before confirming.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .install.dependencies import NPM_NAME, PIP_REQUIREMENT, Dependencies

# Files larger than this are not read for needs (generated or vendored code).
READ_MAX_BYTES = 512 * 1024
WHERE_MAX = 8
ENTRIES_MAX = 300

PIP, NPM, DEBIAN = "pip", "npm", "debian"

# Import name → distribution, where they differ (the rest are assumed equal, and marked so).
IMPORT_TO_DISTRIBUTION = {
    "PIL": "pillow",
    "yaml": "PyYAML",
    "docx": "python-docx",
    "pptx": "python-pptx",
    "cv2": "opencv-python",
    "bs4": "beautifulsoup4",
    "sklearn": "scikit-learn",
    "skimage": "scikit-image",
    "fitz": "PyMuPDF",
    "pymupdf": "PyMuPDF",
    "dateutil": "python-dateutil",
    "dotenv": "python-dotenv",
    "magic": "python-magic",
    "jwt": "PyJWT",
    "Crypto": "pycryptodome",
    "OpenSSL": "pyOpenSSL",
    "git": "GitPython",
    "serial": "pyserial",
    "usb": "pyusb",
    "zmq": "pyzmq",
    "attr": "attrs",
    "google.protobuf": "protobuf",
    "mpl_toolkits": "matplotlib",
    "pkg_resources": "setuptools",
    "win32api": "pywin32",
    "MySQLdb": "mysqlclient",
    "psycopg2": "psycopg2-binary",
    "Levenshtein": "python-Levenshtein",
    "slugify": "python-slugify",
    "multipart": "python-multipart",
    "jose": "python-jose",
    "pdfminer": "pdfminer.six",
    "PyPDF2": "PyPDF2",
    "docx2pdf": "docx2pdf",
    "xlsxwriter": "XlsxWriter",
    "websocket": "websocket-client",
    "socks": "PySocks",
    "lxml": "lxml",
    "markdown": "Markdown",
    "ruamel": "ruamel.yaml",
    "tomli_w": "tomli-w",
    "typing_extensions": "typing-extensions",
}


def words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Program → Debian package. Programs of the base image (coreutils, bash, python3) are not needs.
PROGRAM_TO_DEBIAN = {
    "soffice": "libreoffice-core",
    "libreoffice": "libreoffice-core",
    "lowriter": "libreoffice-core",
    "localc": "libreoffice-core",
    "pdftoppm": "poppler-utils",
    "pdftotext": "poppler-utils",
    "pdfimages": "poppler-utils",
    "pdfinfo": "poppler-utils",
    "pdftocairo": "poppler-utils",
    "pdfunite": "poppler-utils",
    "pdfseparate": "poppler-utils",
    "qpdf": "qpdf",
    "pandoc": "pandoc",
    "tesseract": "tesseract-ocr",
    "ffmpeg": "ffmpeg",
    "ffprobe": "ffmpeg",
    "node": "nodejs",
    "nodejs": "nodejs",
    "npm": "npm",
    "npx": "npm",
    "convert": "imagemagick",
    "magick": "imagemagick",
    "identify": "imagemagick",
    "gs": "ghostscript",
    "ghostscript": "ghostscript",
    "git": "git",
    "jq": "jq",
    "curl": "curl",
    "wget": "wget",
    "java": "default-jre-headless",
    "xvfb-run": "xvfb",
    "inkscape": "inkscape",
    "rsvg-convert": "librsvg2-bin",
    "mutool": "mupdf-tools",
    "ocrmypdf": "ocrmypdf",
    "sqlite3": "sqlite3",
    "dot": "graphviz",
    "pdflatex": "texlive-latex-base",
    "latex": "texlive-latex-base",
    "xelatex": "texlive-xetex",
    "wkhtmltopdf": "wkhtmltopdf",
    "exiftool": "libimage-exiftool-perl",
    "zip": "zip",
    "unzip": "unzip",
    "sox": "sox",
    "chromium": "chromium",
    "make": "make",
    "gcc": "gcc",
}

# Product names in prose ("requires LibreOffice") → Debian package.
PROSE_TO_DEBIAN = {
    "libreoffice": "libreoffice-core",
    "soffice": "libreoffice-core",
    "poppler": "poppler-utils",
    "poppler-utils": "poppler-utils",
    "pdftoppm": "poppler-utils",
    "pdftotext": "poppler-utils",
    "qpdf": "qpdf",
    "pandoc": "pandoc",
    "tesseract": "tesseract-ocr",
    "tesseract-ocr": "tesseract-ocr",
    "ffmpeg": "ffmpeg",
    "imagemagick": "imagemagick",
    "ghostscript": "ghostscript",
    "node.js": "nodejs",
    "nodejs": "nodejs",
    "graphviz": "graphviz",
    "wkhtmltopdf": "wkhtmltopdf",
    "inkscape": "inkscape",
}

# Python distributions named in prose next to a need word ("Requires: pypdf, pdfplumber").
PROSE_PYTHON = {
    "pypdf": "pypdf",
    "pypdf2": "PyPDF2",
    "pdfplumber": "pdfplumber",
    "pdf2image": "pdf2image",
    "pillow": "pillow",
    "openpyxl": "openpyxl",
    "pandas": "pandas",
    "numpy": "numpy",
    "reportlab": "reportlab",
    "python-docx": "python-docx",
    "python-pptx": "python-pptx",
    "markitdown": "markitdown",
    "playwright": "playwright",
    "defusedxml": "defusedxml",
    "lxml": "lxml",
    "imageio": "imageio",
    "matplotlib": "matplotlib",
    "pymupdf": "PyMuPDF",
    "pytesseract": "pytesseract",
    "beautifulsoup4": "beautifulsoup4",
    "requests": "requests",
    "httpx": "httpx",
    "xlsxwriter": "XlsxWriter",
}
NEED_WORDS = re.compile(
    r"\b(requires?|required|needs?|install(?:ed|ing)?|depends?|dependenc(?:y|ies)|prerequisites?)\b", re.I
)
NEED_HEADING = re.compile(r"^#{1,6}\s.*\b(requirements?|dependenc|prerequisite|install|setup)", re.I)

# Programs a session has without installing anything; never reported.
BASE_PROGRAMS = words(
    "python python3 pip pip3 bash sh env echo printf cd ls cat cp mv rm mkdir rmdir touch chmod chown ln "
    "grep egrep sed awk find xargs head tail sort uniq wc cut tr tee date sleep test true false export "
    "source set unset exit return read which command type for while if then else fi do done case esac in "
    "local basename dirname realpath readlink mktemp pwd kill trap wait exec time nohup timeout diff cmp "
    "stat du df tar gzip gunzip base64 sha256sum md5sum file less more uname id whoami hostname ps xxd od "
    "yes seq"
)

NODE_BUILTINS = words(
    "assert async_hooks buffer child_process cluster console constants crypto dgram diagnostics_channel "
    "dns domain events fs http http2 https inspector module net os path perf_hooks process punycode "
    "querystring readline repl stream string_decoder sys timers tls trace_events tty url util v8 vm wasi "
    "worker_threads zlib test"
)

PYTHON_SUFFIXES = (".py", ".pyw")
JS_SUFFIXES = (".js", ".mjs", ".cjs", ".ts", ".mts", ".cts", ".jsx", ".tsx")
SHELL_SUFFIXES = (".sh", ".bash")
MARKDOWN_SUFFIXES = (".md", ".markdown")
SUBPROCESS_CALLS = frozenset({"run", "call", "check_call", "check_output", "Popen", "getoutput", "getstatusoutput"})
OS_SHELL_CALLS = frozenset({"system", "popen"})
OS_EXEC_CALLS = frozenset({"execv", "execvp", "execl", "execlp", "spawnv", "spawnvp", "spawnl", "spawnlp"})

JS_REQUIRE = re.compile(r"""\brequire\s*\(\s*['"]([^'"]+)['"]\s*\)""")
JS_IMPORT = re.compile(r"""^\s*(?:import|export)\s[^'"]*?\bfrom\s*['"]([^'"]+)['"]|^\s*import\s*['"]([^'"]+)['"]""")
JS_DYNAMIC_IMPORT = re.compile(r"""\bimport\s*\(\s*['"]([^'"]+)['"]\s*\)""")
JS_CHILD_PROCESS = re.compile(r"""\b(?:exec|execSync|spawn|spawnSync|execFile|execFileSync)\s*\(\s*['"`]([^'"`\s]+)""")
PY_LINE_IMPORT = re.compile(
    r"^\s*(?:from\s+([A-Za-z_][\w.]*)\s+import\b|import\s+([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*))"
)
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
PIP_INSTALL = re.compile(r"\b(?:pip3?|python3?\s+-m\s+pip|uv\s+pip)\s+install\s+([^`\n;&|#]+)")
NPM_INSTALL = re.compile(
    r"\b(?:npm\s+(?:install|i|add)|yarn\s+(?:global\s+)?add|pnpm\s+(?:add|install))\s+([^`\n;&|#]+)"
)
APT_INSTALL = re.compile(r"\bapt(?:-get)?\s+install\s+([^`\n;&|#]+)")
SHELL_LANGS = frozenset({"", "bash", "sh", "shell", "console", "zsh", "terminal"})
PYTHON_LANGS = frozenset({"python", "py", "python3"})
# Arguments of `pip install` that take a value, so the value is not a package.
PIP_VALUE_OPTIONS = frozenset(
    {
        "-r",
        "--requirement",
        "-c",
        "--constraint",
        "-i",
        "--index-url",
        "--extra-index-url",
        "-t",
        "--target",
        "-f",
        "--find-links",
    }
)


def canonical(kind: str, name: str) -> str:
    if kind == PIP:
        return re.sub(r"[-_.]+", "-", name).lower()
    return name.lower()


@dataclass
class Need:
    """One package the skill needs: of a kind (pip, npm, debian), why, and where it was seen."""

    kind: str
    name: str
    requirement: str
    reasons: list[str] = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    assumed: bool = False  # import name taken as the distribution name
    optional: bool = True  # every sighting was guarded (try/except ImportError)

    @property
    def key(self) -> str:
        return f"{self.kind}:{canonical(self.kind, self.name)}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "name": self.name,
            "requirement": self.requirement,
            "reasons": self.reasons,
            "where": self.where,
            "assumed": self.assumed,
            "optional": self.optional,
        }


@dataclass
class Report:
    declared: dict[str, Need] = field(default_factory=dict)
    inferred: dict[str, Need] = field(default_factory=dict)
    ignored: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What the installer installs without a confirmation: the validated declarations.
    declared_plan: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        inferred = [need for key, need in self.inferred.items() if key not in self.declared]
        return {
            "declared": [need.as_dict() for need in self.declared.values()][:ENTRIES_MAX],
            "inferred": [need.as_dict() for need in sorted(inferred, key=lambda n: (n.kind, n.key))][:ENTRIES_MAX],
            "ignored": sorted(self.ignored.values(), key=lambda e: (e["why"], e["name"]))[:ENTRIES_MAX],
            "declared_plan": self.declared_plan,
        }

    def add(
        self,
        table: dict[str, Need],
        kind: str,
        name: str,
        requirement: str,
        reason: str,
        where: str,
        *,
        assumed: bool = False,
        optional: bool = False,
    ) -> None:
        need = Need(kind, name, requirement, assumed=assumed)
        existing = table.setdefault(need.key, need)
        if reason not in existing.reasons:
            existing.reasons.append(reason)
        if where and where not in existing.where and len(existing.where) < WHERE_MAX:
            existing.where.append(where)
        existing.assumed = existing.assumed and assumed
        existing.optional = existing.optional and optional

    def ignore(self, name: str, why: str, where: str) -> None:
        entry = self.ignored.setdefault(f"{why}:{name}", {"name": name, "why": why, "where": []})
        if where not in entry["where"] and len(entry["where"]) < WHERE_MAX:
            entry["where"].append(where)


def build_report(
    files: Mapping[str, bytes],
    metadata: Mapping[str, str],
    extra_frontmatter: Mapping[str, Any],
    declared: Dependencies,
) -> Report:
    """The report for a skill's files ({path: bytes}; read lazily), frontmatter and declarations."""
    report = Report()
    _declared(files, extra_frontmatter, declared, report)
    local = local_modules(files)
    # A spool-backed view (skills.archives.FileView) gives sizes without reading the bytes.
    entry_of = getattr(files, "entry", None)
    for path in sorted(files):
        reader = _reader_for(path, files)
        if reader is None:
            continue
        entry = entry_of(path) if entry_of is not None else None
        if entry is not None and entry.size > READ_MAX_BYTES:
            continue
        data = files[path]
        if len(data) > READ_MAX_BYTES:
            continue
        text = data.decode("utf-8", "replace")
        reader(path, text, report, local)
    if _has_javascript(files) and "debian:nodejs" not in report.inferred:
        first = next(path for path in sorted(files) if path.endswith(JS_SUFFIXES))
        report.add(report.inferred, DEBIAN, "nodejs", "nodejs", "runs JavaScript", first)
    return report


def _reader_for(path: str, files: Mapping[str, bytes]) -> Any:
    if path.endswith(PYTHON_SUFFIXES):
        return read_python
    if path.endswith(JS_SUFFIXES) and not path.endswith(".d.ts"):
        return read_javascript
    if path.endswith(SHELL_SUFFIXES):
        return read_shell_file
    if path.endswith(MARKDOWN_SUFFIXES):
        return read_markdown
    return None


def _has_javascript(files: Mapping[str, bytes]) -> bool:
    return any(path.endswith(JS_SUFFIXES) and not path.endswith(".d.ts") for path in files)


def local_modules(files: Iterable[str]) -> set[str]:
    """Names a script can import from the skill itself: every .py file's stem, every folder."""
    names: set[str] = set()
    for path in files:
        parts = path.split("/")
        names.update(part for part in parts[:-1])
        if parts[-1].endswith(PYTHON_SUFFIXES):
            names.add(parts[-1].rsplit(".", 1)[0])
    return names


# --- Declared ----------------------------------------------------------------------------


def _declared(
    files: Mapping[str, bytes], extra_frontmatter: Mapping[str, Any], declared: Dependencies, report: Report
) -> None:
    plan: dict[str, Any] = declared.as_dict()
    plan = {"pip": list(plan["pip"]), "npm": list(plan["npm"]), "debian": list(plan["debian"])}
    for dep in declared.pip:
        report.add(report.declared, PIP, dep["name"], dep["requirement"], "declared", dep["source"])
    for dep in declared.npm:
        report.add(report.declared, NPM, dep["name"], dep["version"], "declared", dep["source"])
    for name in declared.debian:
        report.add(report.declared, DEBIAN, name, name, "declared", "SKILL.md metadata debian-packages")
    extra: list[tuple[str, str]] = []
    pyproject = files.get("pyproject.toml")
    if pyproject is not None:
        try:
            project = tomllib.loads(pyproject.decode("utf-8")).get("project") or {}
            listed = project.get("dependencies") or []
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError, RecursionError):
            # RecursionError: tomllib on a few hundred nested arrays.
            listed = []
        if not isinstance(listed, list):
            listed = []  # PEP 621 makes it an array of strings; a string would be read letter by letter
        extra += [(str(line), "pyproject.toml") for line in listed if isinstance(line, str)]
    frontmatter = extra_frontmatter.get("dependencies")
    if isinstance(frontmatter, str):
        frontmatter = re.split(r"[,\n]", frontmatter)
    if isinstance(frontmatter, list):
        extra += [(str(item).strip(), "SKILL.md frontmatter dependencies") for item in frontmatter if str(item).strip()]
    seen = {canonical(PIP, dep["name"]) for dep in plan["pip"]}
    for requirement, source in extra:
        match = PIP_REQUIREMENT.match(requirement)
        if match is None or match.group("name").lower() == "python":
            continue
        name = match.group("name")
        report.add(report.declared, PIP, name, requirement, "declared", source)
        if canonical(PIP, name) not in seen:
            seen.add(canonical(PIP, name))
            plan["pip"].append({"requirement": requirement, "name": name, "source": source})
    report.declared_plan = plan


# --- Python ------------------------------------------------------------------------------


def python_import(report: Report, module: str, where: str, local: set[str], *, optional: bool = False) -> None:
    top = module.split(".", 1)[0]
    if not top or top == "__future__" or top in sys.stdlib_module_names:
        report.ignore(top, "standard library", where)
        return
    if top in local:
        report.ignore(top, "the skill's own module", where)
        return
    two = ".".join(module.split(".")[:2])
    distribution = IMPORT_TO_DISTRIBUTION.get(two) or IMPORT_TO_DISTRIBUTION.get(top)
    assumed = distribution is None
    name = distribution or top
    report.add(report.inferred, PIP, name, name, f"import {top}", where, assumed=assumed, optional=optional)


def _guarded_imports(tree: ast.AST) -> set[int]:
    """ids of import nodes inside a try whose handlers catch ImportError (or everything)."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        catches = False
        for handler in node.handlers:
            names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            for caught in names:
                if caught is None or (
                    isinstance(caught, ast.Name) and caught.id in {"ImportError", "ModuleNotFoundError", "Exception"}
                ):
                    catches = True
        if catches:
            for statement in node.body:
                for inner in ast.walk(statement):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        guarded.add(id(inner))
    return guarded


def read_python(path: str, text: str, report: Report, local: set[str]) -> None:
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # Deep nesting (a long `a+a+…` chain, thousands of unary minuses) exhausts the parser:
        # RecursionError or MemoryError, not SyntaxError. It is the file's problem, not the import's.
        report.ignore(path, "Python file that does not parse", path)
        return
    guarded = _guarded_imports(tree)
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                python_import(report, alias.name, where, local, optional=id(node) in guarded)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            python_import(report, node.module, where, local, optional=id(node) in guarded)
        elif isinstance(node, ast.Call):
            _python_call(node, where, report)


def _call_name(func: ast.expr) -> tuple[str, str]:
    """(module, attribute) of `module.attribute(...)`, or ("", name) of `name(...)`."""
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.value.id, func.attr
    if isinstance(func, ast.Name):
        return "", func.id
    return "", ""


def _python_call(node: ast.Call, where: str, report: Report) -> None:
    module, name = _call_name(node.func)
    if not node.args:
        return
    first = node.args[0]
    text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
    if module in {"subprocess", ""} and name in SUBPROCESS_CALLS:
        if isinstance(first, ast.List | ast.Tuple) and first.elts:
            argv = _constant_strings(first.elts)
            if argv:
                _program_argv(argv, where, report)
        elif text is not None:
            read_shell_line(text, where, report)
    elif text is not None and module == "os" and name in OS_SHELL_CALLS:
        read_shell_line(text, where, report)
    elif text is not None and ((module == "os" and name in OS_EXEC_CALLS) or (module, name) == ("shutil", "which")):
        program(text, where, report)


def _constant_strings(nodes: list[ast.expr]) -> list[str]:
    words = []
    for node in nodes:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            break
        words.append(node.value)
    return words


# --- Programs and shell ------------------------------------------------------------------


def program(word: str, where: str, report: Report, *, note_unknown: bool = True) -> None:
    """A program a script runs: a Debian need when mapped; else noted (from scripts only)."""
    if not word or word.startswith((".", "$", "-", "~", "{", "<")):
        return
    if "/" in word and not word.startswith(("/usr/bin/", "/usr/local/bin/", "/bin/")):
        return  # a path: the skill's own script, or a file argument
    name = word.rsplit("/", 1)[-1]
    if name in BASE_PROGRAMS:
        return
    package = PROGRAM_TO_DEBIAN.get(name)
    if package is not None:
        report.add(report.inferred, DEBIAN, package, package, f"runs {name}", where)
    elif (
        note_unknown and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name) and not name.endswith((".py", ".sh", ".js"))
    ):
        report.ignore(name, "program with no known Debian package", where)


def _program_argv(argv: list[str], where: str, report: Report) -> None:
    if not argv:
        return
    name = argv[0].rsplit("/", 1)[-1]
    if name in {"pip", "pip3"} or (name.startswith("python") and argv[1:3] == ["-m", "pip"]):
        read_install_words(PIP, " ".join(argv[argv.index("install") + 1 :]) if "install" in argv else "", where, report)
        return
    if name == "npm" and len(argv) > 1 and argv[1] in {"install", "i", "add"}:
        read_install_words(NPM, " ".join(argv[2:]), where, report)
        return
    program(argv[0], where, report)


def read_shell_line(line: str, where: str, report: Report, *, note_unknown: bool = True) -> None:
    """The programs a shell line runs, and the packages its install commands name."""
    line = line.split(" #", 1)[0].strip()
    if not line or line.startswith("#"):
        return
    for match in PIP_INSTALL.finditer(line):
        read_install_words(PIP, match.group(1), where, report)
    for match in NPM_INSTALL.finditer(line):
        read_install_words(NPM, match.group(1), where, report)
    for match in APT_INSTALL.finditer(line):
        read_install_words(DEBIAN, match.group(1), where, report)
    for command in re.split(r"\|\||&&|[;|&()]|\$\(", line):
        try:
            words = shlex.split(command, comments=True)
        except ValueError:
            words = command.split()
        while words and (
            re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])
            or words[0] in {"sudo", "exec", "time", "command", "nohup", "env", "then", "do", "else", "!"}
        ):
            words = words[1:]
        if words and words[0] not in {"pip", "pip3", "apt", "apt-get", "yarn", "pnpm"}:
            if words[0] == "npm" and len(words) > 1 and words[1] in {"install", "i", "add"}:
                continue
            if words[0] == "npx" and len(words) > 1:
                package = words[2] if words[1] in {"-y", "--yes"} and len(words) > 2 else words[1]
                if NPM_NAME.match(package):
                    report.add(report.inferred, NPM, package, "*", "run with npx", where)
            program(words[0], where, report, note_unknown=note_unknown)


# In prose, "pip install pypdf to read PDFs" stops at "to".
PROSE_STOP_WORDS = words(
    "to and or then for with if the a an first before after get use run in on from via is are it this"
)


def read_install_words(kind: str, text: str, where: str, report: Report, *, prose: bool = False) -> None:
    """Package names after `pip install`, `npm install`, `apt-get install` (options skipped)."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    skip_next = False
    for raw in words:
        word = raw.rstrip(".,;:)") if prose else raw
        if prose and (word.lower() in PROSE_STOP_WORDS or not word):
            break
        if skip_next:
            skip_next = False
            continue
        if word.startswith("-"):
            skip_next = kind == PIP and word in PIP_VALUE_OPTIONS
            continue
        if kind == PIP:
            match = PIP_REQUIREMENT.match(word)
            if match is None or word.endswith((".txt", ".whl")) or word in {".", "-e"}:
                continue
            report.add(report.inferred, PIP, match.group("name"), word, "pip install", where)
        elif kind == NPM:
            name = word.rsplit("@", 1)[0] if word.count("@") > (1 if word.startswith("@") else 0) else word
            if NPM_NAME.match(name):
                report.add(report.inferred, NPM, name, "*", "npm install", where)
        elif re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", word):
            report.add(report.inferred, DEBIAN, word, word, "apt-get install", where)
        if prose and word != raw:
            break  # the sentence ended


def read_shell_file(path: str, text: str, report: Report, local: set[str]) -> None:
    for number, line in enumerate(text.splitlines(), start=1):
        read_shell_line(line, f"{path}:{number}", report)


# --- Markdown ----------------------------------------------------------------------------


def read_markdown(path: str, text: str, report: Report, local: set[str]) -> None:
    """Code blocks as shell or Python lines; prose for install commands and named needs."""
    fence = ""
    lang = ""
    need_section = False
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{path}:{number}"
        opened = FENCE.match(line)
        if opened and not fence:
            fence, lang = opened.group(1), opened.group(2).lower()
            continue
        if fence:
            if line.strip().startswith(fence):
                fence = ""
            elif lang in PYTHON_LANGS:
                _python_line(line, where, report, local)
            elif lang in SHELL_LANGS:
                read_shell_line(line.strip().removeprefix("$ "), where, report, note_unknown=False)
            continue
        if line.startswith("#"):
            need_section = bool(NEED_HEADING.match(line))
        for span in INLINE_CODE.findall(line):
            read_shell_line(span, where, report, note_unknown=False)
        bare = INLINE_CODE.sub(" ", line)
        for pattern, kind in ((PIP_INSTALL, PIP), (NPM_INSTALL, NPM), (APT_INSTALL, DEBIAN)):
            for match in pattern.finditer(bare):
                read_install_words(kind, match.group(1), where, report, prose=True)
        prose = INLINE_CODE.sub(lambda m: m.group(1), line)
        if not (PIP_INSTALL.search(prose) or NPM_INSTALL.search(prose) or APT_INSTALL.search(prose)):
            # A line with an install command already says which kind each name is.
            _prose_names(prose, where, report, need_section or bool(NEED_WORDS.search(prose)))


def _prose_names(prose: str, where: str, report: Report, about_needs: bool) -> None:
    words = {word.lower().strip(".,;:()[]*_'\"") for word in re.split(r"[\s/]+", prose)}
    for word in words:
        package = PROSE_TO_DEBIAN.get(word)
        if package is not None and (about_needs or word in PROGRAM_TO_DEBIAN):
            report.add(report.inferred, DEBIAN, package, package, f"named in prose ({word})", where)
        distribution = PROSE_PYTHON.get(word)
        if distribution is not None and about_needs:
            report.add(report.inferred, PIP, distribution, distribution, f"named in prose ({word})", where)


def _python_line(line: str, where: str, report: Report, local: set[str]) -> None:
    match = PY_LINE_IMPORT.match(line)
    if match is None:
        return
    if match.group(1):
        python_import(report, match.group(1), where, local)
    else:
        for module in match.group(2).split(","):
            python_import(report, module.strip(), where, local)


# --- JavaScript --------------------------------------------------------------------------


def npm_package(spec: str) -> str:
    parts = spec.split("/")
    return "/".join(parts[:2]) if spec.startswith("@") else parts[0]


def read_javascript(path: str, text: str, report: Report, local: set[str]) -> None:
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{path}:{number}"
        specs = [m.group(1) for m in JS_REQUIRE.finditer(line)]
        specs += [m.group(1) for m in JS_DYNAMIC_IMPORT.finditer(line)]
        found = JS_IMPORT.match(line)
        if found:
            specs.append(found.group(1) or found.group(2))
        for spec in specs:
            if spec.startswith((".", "/")):
                continue
            if spec.startswith("node:") or npm_package(spec) in NODE_BUILTINS:
                report.ignore(spec.removeprefix("node:").split("/")[0], "Node built-in", where)
                continue
            package = npm_package(spec)
            if NPM_NAME.match(package):
                report.add(report.inferred, NPM, package, "*", f"require/import {package}", where)
        for match in JS_CHILD_PROCESS.finditer(line):
            program(match.group(1), where, report)
