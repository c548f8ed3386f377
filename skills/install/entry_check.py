"""The entry-script checks that `verify` runs inside the built image, as the session user.

Not imported by the console: `steps.verify_skill` sends this file's source to
`python3 -c` in the build sandbox with one JSON argument, and reads the JSON on its last
output line: `{"problems": [...], "warnings": [...], "checked": {...}}`. So it uses the
standard library only and runs on the image's Python (3.9 or newer).

For every entry script (docs/skills.md, "Verification"):

- its interpreter exists (`#!` line, else python3, node or bash by suffix);
- Python: the script parses; every module it imports resolves with the search path the
  script gets when run (its own folder first), found with `importlib` finders only, so no
  package code runs; `from m import n` finds `n` in `m` (a submodule, or a name the module's
  source binds); the skill's own modules are followed the same way (the import closure);
- every program it calls (`subprocess.*`, `os.system`, `os.popen`, `os.exec*p`, asyncio's
  subprocess helpers; in shell scripts, the first word of each command) is on PATH;
- JavaScript: node is on PATH and every package it requires or imports is found in a
  `node_modules` above the script or a global one;
- shell: `bash -n` passes.

What is optional is not required: imports under a `try` that catches ImportError (or
Exception), under `if TYPE_CHECKING`, programs under a `try` that catches OSError (or
FileNotFoundError, Exception) and programs the script looks up itself (`shutil.which`,
`command -v`, `which`, `type`, `hash`), unless the script stops when the lookup fails
(`command -v x || exit 1`, `if not shutil.which("x"): sys.exit(...)`): it needs them.
Names a module cannot be read for statically (extension modules, a module-level
`__getattr__`, `import *`, `globals()` writes) pass.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Any

IMPORT_GUARDS = {"*", "ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
PROGRAM_GUARDS = {"*", "FileNotFoundError", "OSError", "EnvironmentError", "IOError", "Exception", "BaseException"}
SUBPROCESS_CALLS = {"run", "call", "check_call", "check_output", "Popen", "getoutput", "getstatusoutput"}
SHELL_WORDS = {
    "if",
    "then",
    "else",
    "elif",
    "fi",
    "for",
    "while",
    "until",
    "do",
    "done",
    "case",
    "esac",
    "in",
    "function",
    "select",
    "time",
    "!",
    "{",
    "}",
    "[[",
    "]]",
    "[",
    "test",
    "echo",
    "printf",
    "cd",
    "pwd",
    "export",
    "set",
    "unset",
    "local",
    "return",
    "exit",
    "source",
    ".",
    "read",
    "shift",
    "eval",
    "exec",
    "trap",
    "wait",
    "declare",
    "typeset",
    "let",
    "true",
    "false",
    ":",
    "break",
    "continue",
    "alias",
    "unalias",
    "umask",
    "ulimit",
    "getopts",
    "builtin",
    "command",
    "type",
    "hash",
    "which",
    "readonly",
    "pushd",
    "popd",
    "dirs",
    "shopt",
    "kill",
    "jobs",
    "fg",
    "bg",
    "disown",
    "enable",
    "help",
    "logout",
    "mapfile",
    "readarray",
    "compgen",
    "complete",
    "caller",
}
PYTHON_SUFFIXES = (".py",)
JS_SUFFIXES = (".js", ".mjs", ".cjs")
SHELL_SUFFIXES = (".sh", ".bash")


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr}" if head else ""
    return ""


class Reader(ast.NodeVisitor):
    """A Python file's imports and the programs it calls, each with its line and whether optional."""

    def __init__(self) -> None:
        self.imports: list[tuple[str, list[str], int, int, bool]] = []  # module, names, level, line, optional
        self.programs: list[tuple[str, int, bool]] = []
        self.looked_up: set[str] = set()
        self.asserted: set[str] = set()  # looked up only to stop when missing: required
        self.subprocess_names: set[str] = set()
        self.import_guard = 0
        self.program_guard = 0

    def visit_Try(self, node: Any) -> None:
        caught: set[str] = set()
        for handler in node.handlers:
            if handler.type is None:
                caught.add("*")
                continue
            kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            caught.update(dotted(kind).rsplit(".", 1)[-1] for kind in kinds)
        imports, programs = int(bool(caught & IMPORT_GUARDS)), int(bool(caught & PROGRAM_GUARDS))
        self.import_guard += imports
        self.program_guard += programs
        for statement in node.body:
            self.visit(statement)
        self.import_guard -= imports
        self.program_guard -= programs
        for part in (node.handlers, node.orelse, node.finalbody):
            for statement in part:
                self.visit(statement)

    visit_TryStar = visit_Try

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.orelse:
                self.visit(statement)
            return
        missing = missing_lookup(node.test)
        if missing and any(stops(statement) for statement in node.body):
            self.asserted.add(missing)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports.append((alias.name, [], 0, node.lineno, self.import_guard > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        names = [alias.name for alias in node.names]
        if node.module == "subprocess":
            self.subprocess_names.update(name for name in names if name in SUBPROCESS_CALLS)
        self.imports.append((node.module or "", names, node.level, node.lineno, self.import_guard > 0))

    def visit_Call(self, node: ast.Call) -> None:
        name = dotted(node.func)
        first = node.args[0] if node.args else None
        shell = any(
            keyword.arg == "shell" and isinstance(keyword.value, ast.Constant) and keyword.value.value is True
            for keyword in node.keywords
        )
        if name in ("shutil.which", "which") and isinstance(first, ast.Constant) and isinstance(first.value, str):
            self.looked_up.add(first.value)
        elif (
            name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput")
            or name == "asyncio.create_subprocess_shell"
        ):
            self._program(first, node.lineno, shell=True)
        elif name in ("asyncio.create_subprocess_exec", "os.execvp", "os.execlp", "os.spawnlp", "os.spawnvp"):
            self._program(node.args[1] if name.startswith("os.spawn") and len(node.args) > 1 else first, node.lineno)
        elif (name.startswith("subprocess.") and name.split(".", 1)[1] in SUBPROCESS_CALLS) or (
            name in self.subprocess_names
        ):
            self._program(first, node.lineno, shell=shell)
        self.generic_visit(node)

    def _program(self, arg: ast.AST | None, line: int, *, shell: bool = False) -> None:
        word = ""
        if isinstance(arg, ast.List | ast.Tuple) and arg.elts:
            head = arg.elts[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str):
                word = head.value
        elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            word = first_command_word(arg.value) if shell else arg.value.split()[0] if arg.value.split() else ""
        if word and plain_program(word):
            self.programs.append((word, line, self.program_guard > 0))


def missing_lookup(test: ast.expr) -> str:
    """The program of `not shutil.which("x")` or `shutil.which("x") is None`, else ""."""
    call: ast.expr | None = None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        call = test.operand
    elif (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Is, ast.Eq))
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        call = test.left
    if not isinstance(call, ast.Call) or dotted(call.func) not in ("shutil.which", "which") or not call.args:
        return ""
    first = call.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""


def stops(statement: ast.stmt) -> bool:
    """The statement raises or exits the script."""
    for node in ast.walk(statement):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call) and dotted(node.func) in ("sys.exit", "exit", "quit", "os._exit"):
            return True
    return False


# A shell lookup whose failure ends the script: `command -v x || exit 1`, `|| { ...; exit; }`,
# `if ! which x; then ... exit ... fi` (without an else). The program is then required.
SHELL_LOOKUP = r"(?:command\s+-v|which|type(?:\s+-[pP])?|hash)\s+([\w.+-]+)"


def shell_asserted(data: str) -> set[str]:
    asserted = set()
    for line in data.splitlines():
        for found in re.finditer(SHELL_LOOKUP, line):
            if re.search(r"\|\|.*\b(?:exit|return)\b", line[found.end() :]):
                asserted.add(found.group(1))
    for found in re.finditer(r"\bif\s+!\s+" + SHELL_LOOKUP, data):
        block = re.split(r"\bfi\b", data[found.end() :], maxsplit=1)[0]
        if re.search(r"\bexit\b", block) and not re.search(r"\b(?:else|elif)\b", block):
            asserted.add(found.group(1))
    return asserted


def first_command_word(line: str) -> str:
    try:
        words = shlex.split(line)
    except ValueError:
        return ""
    for word in words:
        if "=" in word and not word.startswith("="):
            continue  # VAR=value before the command
        return word
    return ""


def plain_program(word: str) -> bool:
    """A program name we can check: no expansion, no relative path."""
    return bool(word) and not re.search(r"[$`{}()<>|&;*?\[\]\\\s'\"]", word) and ("/" not in word or word[0] == "/")


def on_path(program: str) -> bool:
    if program.startswith("/"):
        return os.path.isfile(program) and os.access(program, os.X_OK)
    return shutil.which(program) is not None


# --- Python modules -----------------------------------------------------------------------


def bound_names(path: str) -> set[str] | None:
    """The names a module's source binds at its top level; None when it cannot be told."""
    if not path.endswith(".py"):
        return None
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    names: set[str] = set()

    def targets(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Tuple | ast.List):
            for element in node.elts:
                targets(element)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def walk(statements: list[ast.stmt]) -> bool:
        for statement in statements:
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(statement.name)
            elif isinstance(statement, ast.Assign):
                for target in statement.targets:
                    targets(target)
            elif isinstance(statement, ast.AnnAssign | ast.AugAssign):
                targets(statement.target)
            elif isinstance(statement, ast.Import):
                names.update(alias.asname or alias.name.split(".")[0] for alias in statement.names)
            elif isinstance(statement, ast.ImportFrom):
                for alias in statement.names:
                    if alias.name == "*":
                        return False
                    names.add(alias.asname or alias.name)
            elif isinstance(statement, ast.For | ast.AsyncFor):
                targets(statement.target)
            elif isinstance(statement, ast.With | ast.AsyncWith):
                for item in statement.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
            if "globals()" in ast.unparse(statement) and not isinstance(statement, ast.FunctionDef):
                return False
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(statement, field, None)
                if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    break
                if isinstance(inner, list):
                    blocks = [h.body for h in inner] if field == "handlers" else [inner]
                    for block in blocks:
                        if not walk(block):
                            return False
            if isinstance(statement, ast.Match):
                for case in statement.cases:
                    if not walk(case.body):
                        return False
        return True

    try:
        readable = walk(tree.body)
    except RecursionError:  # ast.unparse of a statement nested deeper than the recursion limit
        return None
    if not readable or "__getattr__" in names:
        return None
    return names


def find(name: str, path: list[str]) -> Any:
    """The spec of the top-level module `name`, searched in `path`, then built-ins."""
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None and (name in sys.builtin_module_names or importlib.machinery.FrozenImporter.find_spec(name)):
        spec = importlib.machinery.ModuleSpec(name, None, origin="built-in")
    return spec


def resolve(parts: list[str], path: list[str]) -> tuple[Any, list[str], str]:
    """Walk a dotted module name down from `path` without importing anything.

    Returns (the deepest module spec found, the parts left over as attributes, a problem or
    "" ). Left-over parts are fine when the parent module binds them.
    """
    spec = find(parts[0], path)
    if spec is None:
        return None, parts, f"{parts[0]} is not installed in the image"
    for index in range(1, len(parts)):
        locations = spec.submodule_search_locations
        child = (
            importlib.machinery.PathFinder.find_spec(".".join(parts[: index + 1]), list(locations))
            if locations
            else None
        )
        if child is None:
            rest = parts[index:]
            names = bound_names(spec.origin or "")
            if names is not None and rest[0] not in names:
                return spec, rest, f"{'.'.join(parts[:index])} has no module or name {rest[0]}"
            return spec, rest, ""
        spec = child
    return spec, [], ""


def distribution_note(top: str) -> str:
    try:
        dists = md.packages_distributions().get(top) or []
    except Exception:
        return ""
    notes = []
    for dist in dists:
        try:
            notes.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            continue
    return f" (installed: {', '.join(notes)})" if notes else ""


class Checker:
    def __init__(self, root: str) -> None:
        self.root = root
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.modules = 0
        self.programs = 0
        self.base_path = [entry for entry in sys.path if entry and os.path.abspath(entry) != os.getcwd()]

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    def python(self, entry: str) -> None:
        script = os.path.join(self.root, entry)
        search = [os.path.dirname(script), *self.base_path]
        seen: set[str] = set()
        queue: list[tuple[str, str, str | None]] = [(script, entry, None)]
        while queue:
            path, chain, package = queue.pop(0)
            if path in seen:
                continue
            seen.add(path)
            try:
                with open(path, "rb") as handle:
                    tree = ast.parse(handle.read(), path)
            except SyntaxError as exc:
                self.problems.append(f"{chain}: Python syntax error line {exc.lineno}: {exc.msg}")
                continue
            except (RecursionError, MemoryError):
                # Python's own compiler stops on the same nesting, so the script cannot run either.
                self.problems.append(f"{chain}: too deeply nested for the parser (Python cannot compile it)")
                continue
            except (OSError, ValueError) as exc:
                self.problems.append(f"{chain}: cannot be read: {exc}")
                continue
            reader = Reader()
            try:
                reader.visit(tree)
            except RecursionError:
                # It compiles (Python runs it), but is nested deeper than this recursive reader goes.
                self.warnings.append(f"{chain}: too deeply nested to read its imports and programs; not checked")
                continue
            for module, names, level, line, optional in reader.imports:
                found = self.python_import(chain, module, names, level, line, optional, search, package)
                for origin in found:
                    if origin.startswith(self.root + os.sep) and origin.endswith(".py") and origin not in seen:
                        # A module straight on the search path is top-level: no package of its own.
                        folder = os.path.dirname(origin)
                        inner = None if folder in search else folder
                        queue.append((origin, f"{chain} -> {self.rel(origin)}", inner))
            self.check_programs(chain, reader.programs, reader.looked_up - reader.asserted)

    def python_import(
        self,
        chain: str,
        module: str,
        names: list[str],
        level: int,
        line: int,
        optional: bool,
        search: list[str],
        package: str | None,
    ) -> list[str]:
        """Check one import statement; returns the files it loads (the caller follows local ones)."""
        shown = f"from {'.' * level}{module} import {', '.join(names)}" if names or level else f"import {module}"
        if level:
            if package is None:
                self.warnings.append(
                    f"{chain}: {shown} (line {line}) is a relative import; run as a file it fails"
                    " ('attempted relative import with no known parent package')"
                )
                return []
            base = package
            for _ in range(level - 1):
                base = os.path.dirname(base)
            where = [base]
            parts = module.split(".") if module else []
        else:
            where = search
            parts = module.split(".")
        self.modules += 1
        if parts and parts[0] in sys.stdlib_module_names and not level:
            if find(parts[0], search) is None and not optional:
                self.problems.append(f"{chain}: {shown} (line {line}): {parts[0]} is not in the image's Python")
            return []
        if parts:
            spec, rest, problem = resolve(parts, where)
        else:  # from . import x: x is a module of the package's folder, or a name of its __init__
            spec = importlib.machinery.ModuleSpec("", None, is_package=True)
            spec.submodule_search_locations = [where[0]]
            init = os.path.join(where[0], "__init__.py")
            spec.origin = init if os.path.exists(init) else None
            rest, problem = [], ""
        if problem:
            if not optional:
                top = parts[0] if parts else ""
                self.problems.append(f"{chain}: {shown} (line {line}): {problem}{distribution_note(top)}")
            return []
        loaded: list[str] = []
        if spec is not None and spec.origin and os.path.isfile(spec.origin):
            loaded.append(spec.origin)
        if rest or not names or spec is None:
            return loaded
        for name in names:
            if name == "*":
                continue
            locations = spec.submodule_search_locations
            sub = (
                importlib.machinery.PathFinder.find_spec(f"{spec.name}.{name}" if spec.name else name, list(locations))
                if locations
                else None
            )
            if sub is not None:
                if sub.origin and os.path.isfile(sub.origin):
                    loaded.append(sub.origin)
                continue
            bound = bound_names(spec.origin or "") if spec.origin else set()
            if bound is not None and name not in bound and not optional:
                what = ".".join(parts) or "."
                note = distribution_note(parts[0] if parts else "")
                self.problems.append(f"{chain}: {shown} (line {line}): {what} has no {name}{note}")
        return loaded

    def check_programs(self, chain: str, programs: list[tuple[str, int, bool]], looked_up: set[str]) -> None:
        for program, line, optional in programs:
            self.programs += 1
            if optional or program in looked_up or on_path(program):
                continue
            self.problems.append(f"{chain}: calls {program} (line {line}), which is not on PATH")

    def shell(self, entry: str, data: str) -> None:
        path = os.path.join(self.root, entry)
        checked = subprocess.run(["bash", "-n", path], capture_output=True, text=True, check=False)
        if checked.returncode:
            self.problems.append(f"{entry}: shell syntax error: {checked.stderr.strip()[:300]}")
            return
        looked_up = set(re.findall(SHELL_LOOKUP, data)) - shell_asserted(data)
        functions = set(re.findall(r"^\s*(?:function\s+)?([A-Za-z_][\w.-]*)\s*(?:\(\s*\)|\{)", data, re.M))
        calls = [(word, line, False) for word, line in shell_programs(data) if word not in functions]
        self.check_programs(entry, calls, looked_up)

    def javascript(self, entry: str, data: str) -> None:
        if not on_path("node"):
            return  # the interpreter check already says node is missing
        script_dir = os.path.dirname(os.path.join(self.root, entry))
        wanted = re.findall(r"""(?:require\s*\(\s*|import\s*\(\s*|from\s+|import\s+)['"]([^'"]+)['"]""", data)
        try:
            listed = subprocess.run(
                ["node", "-p", "require('module').builtinModules.join(' ')"],
                capture_output=True,
                text=True,
                check=False,
                timeout=30,
            ).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            listed = []
        builtins = set(listed)
        roots = [p for p in os.environ.get("NODE_PATH", "").split(":") if p]
        roots += ["/usr/lib/node_modules", "/usr/local/lib/node_modules", "/usr/share/nodejs"]
        for spec in dict.fromkeys(wanted):
            if spec.startswith((".", "/", "node:")) or spec in builtins or spec.split("/")[0] in builtins:
                continue
            package = "/".join(spec.split("/")[:2]) if spec.startswith("@") else spec.split("/")[0]
            self.modules += 1
            folder, found = script_dir, False
            while True:
                if os.path.isdir(os.path.join(folder, "node_modules", package)):
                    found = True
                    break
                parent = os.path.dirname(folder)
                if parent == folder:
                    break
                folder = parent
            if not found and not any(os.path.isdir(os.path.join(root, package)) for root in roots):
                self.problems.append(f"{entry}: needs the Node package {package}, which is not installed")


# Words after which the next word is again a command; words after which it is not.
LEADS = {"then", "do", "else", "elif", "if", "while", "until", "!", "{", "}", "time", "exec", "sudo", "env", "nohup"}
NOT_COMMANDS = {"for", "select", "function", "case", "in", "[[", "[", "test", "esac", "fi", "done"}
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")


def without_heredocs(text: str) -> str:
    lines, out, end = text.split("\n"), [], None
    for line in lines:
        if end is not None:
            out.append("")
            if line.strip() == end:
                end = None
            continue
        found = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if found:
            end = found.group(1)
        out.append(line)
    return "\n".join(out)


def shell_programs(text: str) -> list[tuple[str, int]]:
    """(word, line) of each command word of a shell script: a small lexer that knows quotes,
    comments, here-documents, `$( )`, arithmetic, function definitions and case patterns."""
    text = without_heredocs(text)
    found: list[tuple[str, int]] = []
    i, line, word, quoted, command, depth_case, pattern = 0, 1, "", False, True, 0, False

    def flush(separator: str) -> None:
        nonlocal word, quoted, command, depth_case, pattern
        if not word:
            return
        current, was_quoted, word, quoted = word, quoted, "", False
        if pattern:
            if current == "esac":
                depth_case, pattern, command = max(0, depth_case - 1), False, False
            return
        if current in ("{", "}"):
            command = True
            return
        if not command:
            if current == "in" and depth_case:
                pattern = True
            return
        if "=" in current and NAME.match(current.split("=", 1)[0]):
            return  # VAR=value before a command
        if current in LEADS:
            return
        command = False
        if current == "case":
            depth_case += 1
        elif current == "esac":
            depth_case = max(0, depth_case - 1)
        if current in NOT_COMMANDS or current in SHELL_WORDS or was_quoted or separator == "()":
            return
        if (NAME.match(current) and not current.isdigit()) or (current.startswith("/") and plain_program(current)):
            found.append((current, line))

    while i < len(text):
        char = text[i]
        if char in "'\"":
            close = text.find(char, i + 1)
            while char == '"' and close > 0 and text[close - 1] == "\\":
                close = text.find(char, close + 1)
            close = len(text) - 1 if close < 0 else close
            line += text.count("\n", i, close)
            word, quoted, i = word + "Q", True, close + 1
            continue
        if char == "\\":
            word, quoted, i = word + "Q", True, i + 2
            continue
        if char == "#" and not word:
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        if text.startswith("$((", i) or (text.startswith("((", i) and not word):
            flush("")
            end = text.find("))", i)
            i = len(text) if end < 0 else end + 2
            command = False
            continue
        if text.startswith("$(", i):
            flush("")
            command, i = True, i + 2
            continue
        if char in "<>" or (char == "&" and (word.endswith((">", "<")) or text.startswith("&>", i))):
            word, i = word + char, i + 1
            continue
        if char in " \t":
            flush(" ")
            i += 1
            continue
        if char in ";&|()`\n":
            if char == "(" and text.startswith("()", i):
                flush("()")
                i += 2
                continue
            if char == ")" and pattern:
                word, pattern = "", False
            flush(char)
            if char == "\n":
                line += 1
            if char == ";" and text.startswith(";;", i) and depth_case:
                pattern = True
                i += 1
            command = True
            i += 1
            continue
        word += char
        i += 1
    flush("")
    return found


def interpreter(rel: str, data: bytes) -> tuple[str, str]:
    """(program, kind) of an entry script: kind is python, javascript, shell or other."""
    first = data.split(b"\n", 1)[0].decode(errors="replace") if data.startswith(b"#!") else ""
    if first:
        words = first[2:].split()
        program = words[1] if words and words[0].endswith("/env") and len(words) > 1 else (words[0] if words else "")
        if words and words[0].endswith("/env") and len(words) > 2 and words[1] == "-S":
            program = words[2]
        name = os.path.basename(program)
        kind = (
            "python"
            if name.startswith("python")
            else "javascript"
            if name in ("node", "nodejs")
            else "shell"
            if name in ("bash", "sh", "dash")
            else "other"
        )
        return program, kind
    if rel.endswith(PYTHON_SUFFIXES):
        return "python3", "python"
    if rel.endswith(JS_SUFFIXES):
        return "node", "javascript"
    if rel.endswith(SHELL_SUFFIXES):
        return "bash", "shell"
    return "", "other"


def main(spec: dict[str, Any]) -> dict[str, Any]:
    root = spec["root"]
    checker = Checker(root)
    if os.access(root, os.W_OK):
        checker.problems.append(f"{root} is writable by the session user")
    for dist in spec.get("pip", []):
        try:
            md.distribution(dist)
        except md.PackageNotFoundError:
            checker.problems.append(f"pip dependency {dist} is not installed")
    for rel in spec.get("entries", []):
        path = os.path.join(root, rel)
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            checker.problems.append(f"{rel}: cannot be read by the session user: {exc.strerror}")
            continue
        program, kind = interpreter(rel, data)
        if os.access(path, os.X_OK) and not data.startswith(b"#!"):
            runner = {"python": "python3", "javascript": "node", "shell": "bash"}.get(kind, "its interpreter")
            checker.warnings.append(f"{rel} is executable but has no #! line: run it with {runner}, not as ./{rel}")
        if program and not on_path(program):
            checker.problems.append(f"{rel}: its interpreter {program} is not in the image")
            continue
        if kind == "python":
            checker.python(rel)
        elif kind == "shell":
            checker.shell(rel, data.decode(errors="replace"))
        elif kind == "javascript":
            checker.javascript(rel, data.decode(errors="replace"))
    return {
        "problems": checker.problems,
        "warnings": checker.warnings,
        "checked": {
            "entries": len(spec.get("entries", [])),
            "imports": checker.modules,
            "programs": checker.programs,
        },
    }


if __name__ == "__main__":
    report = main(json.loads(sys.argv[1]))
    print(json.dumps(report))
    sys.exit(1 if report["problems"] else 0)
