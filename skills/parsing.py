"""SKILL.md parsing to the Agent Skills format (pure: no ORM, no settings).

Severity follows docs/skills.md (and the format reference, section 4): what no platform can
load is an *error* carrying a line number; a rule that official skills themselves break is a
*warning*; platform-specific keys and long bodies are *info*. The YAML is read with the safe
loader, never with regular expressions over lines.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from .names import control_problem, same_key

SPEC_KEYS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
# Claude Code accepts these; other validators reject them, so they are info, not warnings.
PLATFORM_KEYS = ("disable-model-invocation", "user-invocable")
RESERVED_NAME_WORDS = ("anthropic", "claude")
KEBAB_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
NAME_MAX = 64
# A name becomes a directory name on install; most filesystems stop at 255 bytes.
NAME_HARD_MAX_BYTES = 255
DESCRIPTION_MAX = 1024
COMPATIBILITY_MAX = 500
BODY_LINES_HINT = 500


class Severity:
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Issue:
    """One finding about a SKILL.md; `line` is 1-based in the file as uploaded, or None."""

    severity: str
    message: str
    line: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "message": self.message, "line": self.line}

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.message}"


@dataclass
class ParsedSkill:
    """The frontmatter fields, the Markdown body and every issue found."""

    name: str = ""
    description: str = ""
    license: str = ""
    compatibility: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    allowed_tools: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    body: str = ""
    issues: list[Issue] = field(default_factory=list)

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == Severity.ERROR]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.severity != Severity.ERROR]

    def add(self, severity: str, message: str, line: int | None = None) -> None:
        self.issues.append(Issue(severity, message, line))


def parse_skill_md(data: bytes | str, *, folder: str | None = None) -> ParsedSkill:
    """Parse SKILL.md content. Never raises on bad input: problems come back as issues."""
    result = ParsedSkill()
    text = _decode(data, result)
    if text is None:
        return result
    frontmatter = _split_frontmatter(text, result)
    if frontmatter is None:
        return result
    yaml_text, body, first_line = frontmatter
    result.body = body
    mapping, key_lines = _load_yaml(yaml_text, first_line, result)
    if mapping is None:
        return result
    _read_fields(mapping, key_lines, first_line, result, folder)
    return result


def _decode(data: bytes | str, result: ParsedSkill) -> str | None:
    if isinstance(data, str):
        text = data
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            result.add(Severity.ERROR, "SKILL.md is not valid UTF-8.", line)
            return None
    if text.startswith("\ufeff"):
        text = text[1:]
        result.add(Severity.WARNING, "SKILL.md starts with a byte-order mark (removed for parsing).", 1)
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
        result.add(Severity.WARNING, "SKILL.md uses CRLF line endings (read as LF); some validators reject them.", 1)
    if "\x00" in text:
        # The body and fields are PostgreSQL text, which cannot hold NUL.
        line = text[: text.index("\x00")].count("\n") + 1
        result.add(Severity.ERROR, "SKILL.md holds a NUL byte, which no text field can store.", line)
        return None
    return text


def _split_frontmatter(text: str, result: ParsedSkill) -> tuple[str, str, int] | None:
    """(yaml text, body, line number of the first YAML line), or None after an error."""
    lines = text.split("\n")
    if not lines or lines[0].rstrip() != "---":
        result.add(Severity.ERROR, "SKILL.md must start with a frontmatter line '---'.", 1)
        return None
    for index in range(1, len(lines)):
        if lines[index].rstrip() == "---":
            yaml_text = "\n".join(lines[1:index])
            body = "\n".join(lines[index + 1 :]).lstrip("\n")
            return yaml_text, body, 2
    result.add(Severity.ERROR, "The frontmatter opened on line 1 is never closed with '---'.", 1)
    return None


TOO_DEEP = "The frontmatter is nested too deeply to read."
# PyYAML reads about 35 KB a second, and an archive's SKILL.md may be up to its uncompressed
# limit (a flat list of 100 MiB zips into a few KB): past this, refused before it reads. Real
# frontmatter is a few hundred bytes; every field at its longest stays far under it.
MAX_FRONTMATTER_BYTES = 64 * 1024
# Flow collections (`[`, `{`) open at once, counted on PyYAML's own tokens (a bracket in a
# quoted string, block scalar or comment opens none) and the count stops at the first level
# past the limit: the scanner re-checks every open level for each token, so 20,000 of them
# kept it busy for minutes (its own RecursionError comes only after that). Real frontmatter
# opens two or three.
MAX_FLOW_DEPTH = 100
_OPENING = (yaml.FlowSequenceStartToken, yaml.FlowMappingStartToken)
_CLOSING = (yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken)


def _too_deep(text: str) -> bool:
    depth = 0
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        if isinstance(token, _OPENING):
            depth += 1
            if depth > MAX_FLOW_DEPTH:
                return True
        elif isinstance(token, _CLOSING):
            depth -= 1
    return False


def _load_yaml(yaml_text: str, first_line: int, result: ParsedSkill) -> tuple[dict[str, Any] | None, dict[str, int]]:
    if len(yaml_text.encode()) > MAX_FRONTMATTER_BYTES:
        result.add(Severity.ERROR, f"The frontmatter is over {MAX_FRONTMATTER_BYTES // 1024} KiB.", first_line)
        return None, {}
    try:
        if _too_deep(yaml_text):
            result.add(Severity.ERROR, TOO_DEEP, first_line)
            return None, {}
        # Aliases let a few lines expand into gigabytes once converted; no real skill uses them.
        for event in yaml.parse(yaml_text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                line = first_line + event.start_mark.line if event.start_mark else None
                result.add(Severity.ERROR, "YAML aliases (*name) are not allowed in the frontmatter.", line)
                return None, {}
        node = yaml.compose(yaml_text, Loader=yaml.SafeLoader)
        value = yaml.safe_load(yaml_text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = first_line + mark.line if mark is not None else first_line
        result.add(Severity.ERROR, f"Invalid YAML in the frontmatter: {exc.problem or exc.context}.", line)
        return None, {}
    except yaml.YAMLError as exc:
        result.add(Severity.ERROR, f"Invalid YAML in the frontmatter: {exc}.", first_line)
        return None, {}
    except RecursionError:
        # PyYAML composes and constructs nodes recursively: a few hundred nested `[` do this.
        result.add(Severity.ERROR, TOO_DEEP, first_line)
        return None, {}
    if not isinstance(value, dict):
        kind = "empty" if value is None else f"a {type(value).__name__}, not a mapping"
        result.add(Severity.ERROR, f"The frontmatter is {kind}; it must be a YAML mapping (key: value).", first_line)
        return None, {}
    key_lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            key = str(key_node.value)
            line = first_line + key_node.start_mark.line
            if key in key_lines:
                result.add(Severity.WARNING, f"Key {key!r} appears twice; the last value wins.", line)
            key_lines[key] = line
    return value, key_lines


def _read_fields(
    mapping: dict[str, Any],
    key_lines: dict[str, int],
    first_line: int,
    result: ParsedSkill,
    folder: str | None,
) -> None:
    def line_of(key: str) -> int:
        return key_lines.get(key, first_line)

    _refuse_controls(mapping, line_of, result)
    result.name = _read_name(mapping, line_of, first_line, result, folder)
    result.description = _read_description(mapping, line_of, first_line, result)
    _read_optional_fields(mapping, line_of, result)
    for key in mapping:
        skey = str(key)
        if skey in SPEC_KEYS:
            continue
        result.extra[skey] = jsonable(mapping[key])
        if skey in PLATFORM_KEYS:
            result.add(
                Severity.INFO, f"Key {skey!r} is specific to Claude Code; other platforms reject it.", line_of(skey)
            )
        else:
            result.add(Severity.WARNING, f"Key {skey!r} is not one of the six spec keys.", line_of(skey))
    body_lines = len(result.body.splitlines())
    if body_lines > BODY_LINES_HINT:
        result.add(Severity.INFO, f"The body has {body_lines} lines; the spec suggests under {BODY_LINES_HINT}.")


def _refuse_controls(mapping: dict[str, Any], line_of: Any, result: ParsedSkill) -> None:
    """An error for each key that, or whose text, holds a control character (`skills.names`).

    YAML escapes (`"\\e"`, `"\\x9b"`) put them in values although the file itself cannot hold
    them; text keeps tabs and line breaks. The name is held to the stricter rule for names."""
    for key, value in mapping.items():
        skey = str(key)
        problem = control_problem(skey) or ("" if skey == "name" else _text_control(value))
        if problem:
            result.add(Severity.ERROR, f"Key {skey!r} {problem}.", line_of(skey))


def _text_control(value: Any) -> str:
    """The control-character problem of the first string inside `value` that has one, or ''."""
    if isinstance(value, str):
        return control_problem(value, multiline=True)
    if isinstance(value, dict):
        items: list[Any] = [str(key) for key in value] + list(value.values())
        return next((problem for item in items if (problem := _text_control(item))), "")
    if isinstance(value, list | tuple | set):
        return next((problem for item in value if (problem := _text_control(item))), "")
    return ""


def _required_string(
    mapping: dict[str, Any], key: str, line_of: Any, first_line: int, result: ParsedSkill
) -> tuple[str | None, int | None]:
    """A required key's value and line: (None, _) with an error when it is missing or not a string."""
    if key not in mapping:
        result.add(Severity.ERROR, f"The frontmatter has no {key!r}.", first_line)
        return None, None
    value, line = mapping[key], line_of(key)
    if not isinstance(value, str):
        result.add(Severity.ERROR, f"{key!r} must be a string, not {type(value).__name__}.", line)
        return None, line
    return value, line


def _read_name(mapping: dict[str, Any], line_of: Any, first_line: int, result: ParsedSkill, folder: str | None) -> str:
    name, line = _required_string(mapping, "name", line_of, first_line, result)
    if name is None:
        return ""
    name = same_key(name.strip())  # the catalog keys one name, whatever Unicode form it came in
    problem = unusable_name_problem(name)
    if problem:
        result.add(Severity.ERROR, f"'name' {problem}.", line)
        return ""
    if len(name) > NAME_MAX or not KEBAB_NAME.match(name):
        result.add(
            Severity.WARNING,
            f"'name' {name!r} should be kebab-case (a-z, 0-9, single hyphens) and at most {NAME_MAX} characters.",
            line,
        )
    for word in RESERVED_NAME_WORDS:
        if word in name.lower():
            result.add(Severity.WARNING, f"'name' contains the word {word!r}, which the Claude API reserves.", line)
    if folder is not None and same_key(folder) != name:
        result.add(Severity.WARNING, f"'name' {name!r} differs from its folder {folder!r}.", line)
    return name


def unusable_name_problem(name: str) -> str:
    """Why `name` cannot serve as a directory name, or '' when it can."""
    if not name:
        return "is empty"
    if "/" in name or "\\" in name or "\x00" in name:
        return "contains a slash, backslash or NUL"
    if name in {".", ".."} or ".." in name:
        return "contains '..'"
    if problem := control_problem(name):  # before encoding: a lone surrogate cannot be
        return problem
    if len(name.encode()) > NAME_HARD_MAX_BYTES:
        return f"is over {NAME_HARD_MAX_BYTES} bytes"
    return ""


def _read_description(mapping: dict[str, Any], line_of: Any, first_line: int, result: ParsedSkill) -> str:
    description, line = _required_string(mapping, "description", line_of, first_line, result)
    if description is None:
        return ""
    if not description.strip():
        result.add(Severity.ERROR, "'description' is empty.", line)
        return ""
    if len(description) > DESCRIPTION_MAX:
        result.add(
            Severity.WARNING,
            f"'description' has {len(description)} characters; the spec allows {DESCRIPTION_MAX}.",
            line,
        )
    if "<" in description or ">" in description:
        result.add(Severity.WARNING, "'description' contains '<' or '>', which the reference validator rejects.", line)
    return description


def _read_optional_fields(mapping: dict[str, Any], line_of: Any, result: ParsedSkill) -> None:
    license_value = mapping.get("license")
    if license_value is None or (isinstance(license_value, str) and not license_value.strip()):
        result.add(Severity.WARNING, "No 'license' is declared.", line_of("license") if "license" in mapping else None)
    else:
        result.license = str(jsonable(license_value))
    if "compatibility" in mapping:
        value = mapping["compatibility"]
        line = line_of("compatibility")
        if not isinstance(value, str) or not value.strip():
            result.add(Severity.WARNING, "'compatibility' should be a non-empty string.", line)
        elif len(value) > COMPATIBILITY_MAX:
            result.add(Severity.WARNING, f"'compatibility' is over {COMPATIBILITY_MAX} characters.", line)
        result.compatibility = "" if value is None else str(jsonable(value))
    if "metadata" in mapping:
        result.metadata = _read_metadata(mapping["metadata"], line_of("metadata"), result)
    if "allowed-tools" in mapping:
        result.allowed_tools = _read_allowed_tools(mapping["allowed-tools"], line_of("allowed-tools"), result)


def _read_metadata(value: Any, line: int, result: ParsedSkill) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        result.add(Severity.WARNING, "'metadata' should be a mapping of strings to strings; ignored.", line)
        return {}
    metadata: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(item, str):
            result.add(Severity.WARNING, f"metadata {key!r} should be a string; read as text.", line)
            item = "" if item is None else str(jsonable(item))
        metadata[str(key)] = item
    return metadata


def _read_allowed_tools(value: Any, line: int, result: ParsedSkill) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        result.add(Severity.WARNING, "'allowed-tools' should be a space-separated string, not a list.", line)
        return [str(v) for v in value]
    result.add(Severity.WARNING, "'allowed-tools' should be a space-separated string; ignored.", line)
    return []


def jsonable(value: Any) -> Any:
    """YAML values (dates, sets, bytes) turned into what a JSONField can store."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or infinity
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime.date | datetime.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [jsonable(v) for v in value]
    return str(value)
