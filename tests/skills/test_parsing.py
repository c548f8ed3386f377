"""SKILL.md parsing: valid files, warnings (rules official skills break) and errors with lines."""

from __future__ import annotations

import time

import pytest

from skills.parsing import Severity, parse_skill_md

pytestmark = pytest.mark.django_db

LONG_DESCRIPTION = "x" * 1100
BLOCK_DESCRIPTION = "description: |-\n  " + "word " * 220 + "\n  second line\n"


def frontmatter(yaml_text: str, body: str = "# Body\n") -> str:
    return f"---\n{yaml_text}---\n{body}"


MINIMAL = "name: my-skill\ndescription: Does a thing. Use when testing.\nlicense: MIT\n"

VALID = {
    "minimal": MINIMAL,
    "all six keys": MINIMAL
    + "compatibility: Needs Python 3.11\nmetadata:\n  author: team\n  debian-packages: jq\n"
    + "allowed-tools: Bash(git:*) Read\n",
    "inline comment": "name: my-skill # the folder name\ndescription: Does a thing.\nlicense: MIT\n",
    "quoted strings": "name: 'my-skill'\ndescription: \"Does: a thing.\"\nlicense: 'Proprietary. LICENSE.txt'\n",
}


@pytest.mark.parametrize("case", list(VALID))
def test_valid_frontmatter_has_no_issues(case: str) -> None:
    parsed = parse_skill_md(frontmatter(VALID[case]), folder="my-skill")
    assert parsed.issues == []
    assert parsed.name == "my-skill"
    assert parsed.description.startswith("Does")
    assert parsed.body == "# Body\n"


def test_all_fields_are_read() -> None:
    parsed = parse_skill_md(frontmatter(VALID["all six keys"]), folder="my-skill")
    assert parsed.license == "MIT"
    assert parsed.compatibility == "Needs Python 3.11"
    assert parsed.metadata == {"author": "team", "debian-packages": "jq"}
    assert parsed.allowed_tools == ["Bash(git:*)", "Read"]


WARNINGS = {
    # (frontmatter or whole text, folder, expected message fragment, expected line)
    "description over 1024 as a |- block": (
        frontmatter("name: my-skill\nlicense: MIT\n" + BLOCK_DESCRIPTION),
        "my-skill",
        "the spec allows 1024",
        4,
    ),
    "name differs from folder": (frontmatter(MINIMAL), "template", "differs from its folder 'template'", 2),
    "reserved word": (
        frontmatter("name: claude-helper\ndescription: x\nlicense: MIT\n"),
        "claude-helper",
        "reserves",
        2,
    ),
    "not kebab-case": (frontmatter("name: My_Skill\ndescription: x\nlicense: MIT\n"), "My_Skill", "kebab-case", 2),
    "name over 64": (frontmatter(f"name: {'a' * 70}\ndescription: x\nlicense: MIT\n"), "a" * 70, "kebab-case", 2),
    "angle brackets": (frontmatter("name: my-skill\ndescription: use <this>\nlicense: MIT\n"), None, "'<' or '>'", 3),
    "extra key": (frontmatter(MINIMAL + "version: 2\n"), None, "not one of the six", 5),
    "no licence": (frontmatter("name: my-skill\ndescription: x\n"), None, "No 'license'", None),
    "empty compatibility": (frontmatter(MINIMAL + "compatibility: ''\n"), None, "non-empty string", 5),
    "long compatibility": (frontmatter(MINIMAL + f"compatibility: {'c' * 501}\n"), None, "over 500", 5),
    "metadata value not a string": (frontmatter(MINIMAL + "metadata:\n  count: 3\n"), None, "should be a string", 5),
    "allowed-tools as a list": (frontmatter(MINIMAL + "allowed-tools: [Read, Bash]\n"), None, "space-separated", 5),
    "duplicate key": (frontmatter(MINIMAL + "license: Apache-2.0\n"), None, "appears twice", 5),
    "CRLF": (frontmatter(MINIMAL).replace("\n", "\r\n"), None, "CRLF", 1),
    "BOM": ("\ufeff" + frontmatter(MINIMAL), None, "byte-order mark", 1),
}


@pytest.mark.parametrize("case", list(WARNINGS))
def test_rules_real_skills_break_are_warnings(case: str) -> None:
    text, folder, fragment, line = WARNINGS[case]
    parsed = parse_skill_md(text, folder=folder)
    assert parsed.errors == []
    matching = [issue for issue in parsed.warnings if fragment in issue.message]
    assert matching, [str(i) for i in parsed.issues]
    assert matching[0].line == line
    assert parsed.name


def test_crlf_and_bom_are_normalised_before_parsing() -> None:
    parsed = parse_skill_md(("\ufeff" + frontmatter(MINIMAL, "a\nb\n")).replace("\n", "\r\n").encode())
    assert parsed.name == "my-skill"
    assert parsed.body == "a\nb\n"


INFOS = {
    "Claude Code key": (frontmatter(MINIMAL + "disable-model-invocation: true\n"), "specific to Claude Code"),
    "long body": (frontmatter(MINIMAL, "line\n" * 600), "600 lines"),
}


@pytest.mark.parametrize("case", list(INFOS))
def test_platform_keys_and_long_bodies_are_info(case: str) -> None:
    text, fragment = INFOS[case]
    parsed = parse_skill_md(text)
    infos = [i for i in parsed.issues if i.severity == Severity.INFO]
    assert any(fragment in i.message for i in infos), [str(i) for i in parsed.issues]
    assert parsed.errors == []


ERRORS = {
    # (text, expected message fragment, expected line)
    "no frontmatter": ("# Just markdown\n", "must start with a frontmatter line", 1),
    "unterminated frontmatter": ("---\nname: x\ndescription: y\n", "never closed", 1),
    "invalid YAML": ("---\nname: a\ndescription: b: c\n---\n", "Invalid YAML", 3),
    "invalid YAML later": ("---\nname: a\ndescription: ok\nlicense: [MIT\n---\n", "Invalid YAML", 4),
    "list instead of mapping": ("---\n- name: a\n- description: b\n---\n", "must be a YAML mapping", 2),
    "empty frontmatter": ("---\n---\nbody\n", "is empty", 2),
    "missing name": ("---\ndescription: b\n---\n", "no 'name'", 2),
    "name not a string": ("---\ndescription: b\nname: 123\n---\n", "'name' must be a string", 3),
    "name with a slash": ("---\nname: a/b\ndescription: b\n---\n", "slash", 2),
    "name with dot-dot": ("---\nname: ..\ndescription: b\n---\n", "'..'", 2),
    "missing description": ("---\nname: a\n---\n", "no 'description'", 2),
    "description not a string": ("---\nname: a\ndescription: [x, y]\n---\n", "'description' must be a string", 3),
    "empty description": ("---\nname: a\ndescription: ''\n---\n", "'description' is empty", 3),
    "YAML alias": ("---\nname: &n a\ndescription: *n\n---\n", "aliases", 3),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_unloadable_files_are_errors_with_the_line(case: str) -> None:
    text, fragment, line = ERRORS[case]
    parsed = parse_skill_md(text)
    assert parsed.errors, case
    error = parsed.errors[0]
    assert fragment in error.message, str(error)
    assert error.line == line, str(error)
    assert f"line {line}" in str(error)


def test_invalid_utf8_is_an_error_with_its_line() -> None:
    parsed = parse_skill_md(b"---\nname: a\ndescription: \xff\xfe\n---\n")
    assert parsed.errors[0].line == 3
    assert "UTF-8" in parsed.errors[0].message


def test_a_nul_byte_is_an_error_with_its_line() -> None:
    parsed = parse_skill_md(frontmatter(MINIMAL, body="# Body\n\nText\x00\n"))
    assert [(issue.line, issue.message) for issue in parsed.errors] == [
        (8, "SKILL.md holds a NUL byte, which no text field can store.")
    ]


def test_odd_yaml_values_are_stored_as_json() -> None:
    parsed = parse_skill_md(frontmatter(MINIMAL + "released: 2026-01-02\nmetadata:\n  when: 2026-01-02\n"))
    assert parsed.extra == {"released": "2026-01-02"}
    assert parsed.metadata == {"when": "2026-01-02"}


def test_never_raises_on_garbage() -> None:
    for text in ["", "---", "---\n---", "---\n\x00\n---\n", "---\n!!python/object:os.system x\n---\n", "\n" * 5]:
        parsed = parse_skill_md(text)
        assert parsed.errors


@pytest.mark.parametrize("opening", ["[", "{a: "])
def test_frontmatter_nested_past_the_recursion_limit_is_an_error_not_a_crash(opening: str) -> None:
    """PyYAML composes nodes recursively: 500 nested flow collections raise RecursionError."""
    closing = {"[": "]", "{a: ": "}"}[opening]
    text = f"---\nname: deep\ndescription: Deep. Use when testing.\nx: {opening * 500}1{closing * 500}\n---\nBody\n"
    result = parse_skill_md(text)
    assert [(issue.message, issue.line) for issue in result.errors] == [
        ("The frontmatter is nested too deeply to read.", 2)
    ]


@pytest.mark.parametrize(
    "description",
    [
        '"' + "[" * 200 + '"',
        "'" + "{[" * 100 + "'",
        "|\n  " + "[" * 200,
        "Matches " + "[" * 200 + " # and {{{{ in a comment",
    ],
    ids=["double-quoted", "single-quoted", "block scalar", "plain with a comment"],
)
def test_brackets_inside_strings_are_text_not_nesting(description: str) -> None:
    """Only flow collections nest: a bracket inside a string or comment opens none, so a
    description of 200 `[` is read, not refused as too deep."""
    result = parse_skill_md(frontmatter(f"name: my-skill\ndescription: {description}\n"))
    assert result.errors == []
    assert sum(result.description.count(bracket) for bracket in "[{") == 200


def test_flow_nesting_at_the_limit_is_read_and_one_past_it_refused() -> None:
    """The limit counts the collections that are open at once: `{a: [` pairs up to it are read."""
    from skills.parsing import MAX_FLOW_DEPTH

    def nested(depth: int) -> str:
        levels = "".join("{a: " if i % 2 == 0 else "[" for i in range(depth))
        return levels + "1" + "".join("}" if i % 2 == 0 else "]" for i in reversed(range(depth)))

    read = parse_skill_md(frontmatter(f"name: my-skill\ndescription: Deep.\nx: {nested(MAX_FLOW_DEPTH)}\n"))
    refused = parse_skill_md(frontmatter(f"name: my-skill\ndescription: Deep.\nx: {nested(MAX_FLOW_DEPTH + 1)}\n"))
    assert read.errors == []
    assert [issue.message for issue in refused.errors] == ["The frontmatter is nested too deeply to read."]


def test_a_frontmatter_past_its_size_limit_is_refused_before_pyyaml_reads_it() -> None:
    """PyYAML reads about 35 KB a second: a flat list of a few MB (a zip holds it in a few KB)
    held an import for minutes. Real frontmatter is a few hundred bytes."""
    from skills.parsing import MAX_FRONTMATTER_BYTES

    listed = "x: [" + "a, " * (MAX_FRONTMATTER_BYTES // 3) + "a]\n"
    started = time.monotonic()
    result = parse_skill_md(frontmatter(f"name: my-skill\ndescription: Long.\n{listed}"))
    assert time.monotonic() - started < 5
    assert [(issue.message, issue.line) for issue in result.errors] == [
        (f"The frontmatter is over {MAX_FRONTMATTER_BYTES // 1024} KiB.", 2)
    ]
    # A generous real one: every field at its longest, metadata and tools listed.
    generous = (
        f"name: my-skill\ndescription: {'d' * 1024}\ncompatibility: {'c' * 500}\nmetadata:\n"
        + "".join(f"  key-{n}: {'v' * 100}\n" for n in range(100))
        + "allowed-tools: "
        + " ".join(f"Bash(tool-{n}:*)" for n in range(200))
        + "\n"
    )
    assert parse_skill_md(frontmatter(generous)).errors == []


@pytest.mark.parametrize("shape", ["unclosed", "closed"])
def test_deep_flow_nesting_is_refused_before_pyyaml_spends_minutes_on_it(shape: str) -> None:
    """PyYAML's scanner re-checks every open flow level for each token: 20,000 `[` (20 KB of
    SKILL.md) held an import for minutes before any limit answered."""
    depth = 20_000
    nested = "[" * depth + ("" if shape == "unclosed" else "]" * depth)
    text = f"---\nname: deep\ndescription: Deep. Use when testing.\nx: {nested}\n---\nBody\n"
    started = time.monotonic()
    result = parse_skill_md(text)
    assert time.monotonic() - started < 5
    assert [(issue.message, issue.line) for issue in result.errors] == [
        ("The frontmatter is nested too deeply to read.", 2)
    ]


CONTROL_FIELDS = {
    # (frontmatter, the key named, the character shown escaped)
    "name with DEL": ('name: "my-skill\\x7f"\ndescription: x\nlicense: MIT\n', "'name'", "\\x7f"),
    "name with C1 CSI": ('name: "my-skill\\x9b2J"\ndescription: x\nlicense: MIT\n', "'name'", "\\x9b"),
    "description with ESC": ('name: my-skill\ndescription: "a\\e[2Jb"\nlicense: MIT\n', "'description'", "\\x1b"),
    "license with CR": ('name: my-skill\ndescription: x\nlicense: "MIT\\rforged"\n', "'license'", "\\r"),
    "metadata value": ('name: my-skill\ndescription: x\nmetadata:\n  author: "a\\x1bb"\n', "'metadata'", "\\x1b"),
    "extra key": ('name: my-skill\ndescription: x\n"odd\\nkey": 1\n', "'odd\\nkey'", "\\n"),
}


@pytest.mark.parametrize("case", list(CONTROL_FIELDS))
def test_control_characters_in_frontmatter_fields_are_errors_shown_escaped(case: str) -> None:
    text, key, escaped = CONTROL_FIELDS[case]
    parsed = parse_skill_md(frontmatter(text), folder="my-skill")
    messages = [str(issue) for issue in parsed.errors]
    assert any(key in message and f"contains a control character ({escaped})" in message for message in messages), (
        messages
    )
    assert not any(ord(char) < 32 or 0x7F <= ord(char) <= 0x9F for char in "".join(messages))


def test_tabs_and_line_breaks_in_text_fields_are_kept() -> None:
    parsed = parse_skill_md(frontmatter('name: my-skill\ndescription: "one\\ttwo\\nthree"\nlicense: MIT\n'))
    assert parsed.errors == []
    assert parsed.description == "one\ttwo\nthree"


@pytest.mark.parametrize(("char", "escaped"), [("\u202e", "\\u202e"), ("\u200b", "\\u200b"), ("\u2028", "\\u2028")])
def test_a_name_with_an_invisible_character_is_an_error_shown_escaped(char: str, escaped: str) -> None:
    """'pd\u200bf' would be a second skill looking like 'pdf'; a bidi override reorders it."""
    parsed = parse_skill_md(frontmatter(f'name: "pd{escaped}f"\ndescription: x\nlicense: MIT\n'))
    messages = [str(issue) for issue in parsed.errors]
    assert any(f"contains a control character ({escaped})" in message for message in messages), messages
    assert not any(char in message for message in messages)


def test_a_name_in_decomposed_form_is_read_composed() -> None:
    """'cafe\u0301' and 'caf\u00e9' are one name: the catalog keys the composed (NFC) one."""
    parsed = parse_skill_md(frontmatter('name: "cafe\\u0301"\ndescription: x\nlicense: MIT\n'), folder="caf\u00e9")
    assert parsed.errors == []
    assert parsed.name == "caf\u00e9"
    assert not any("differs from its folder" in issue.message for issue in parsed.warnings)


SURROGATE_FIELDS = {
    # A YAML escape makes a lone surrogate, which no UTF-8 text (nor PostgreSQL) can hold.
    "name": ('name: "my\\ud800skill"\ndescription: x\n', "'name'"),
    "description": ('name: my-skill\ndescription: "a\\udfffb"\n', "'description'"),
    "metadata key": ('name: my-skill\ndescription: x\nmetadata:\n  "k\\ud83d": 1\n', "'metadata'"),
}


@pytest.mark.parametrize("case", list(SURROGATE_FIELDS))
def test_a_lone_surrogate_in_the_frontmatter_is_an_error_not_a_crash(case: str) -> None:
    text, key = SURROGATE_FIELDS[case]
    parsed = parse_skill_md(frontmatter(text), folder="my-skill")
    messages = [str(issue) for issue in parsed.errors]
    assert any(key in message and "contains a control character (\\u" in message for message in messages), messages
    "".join(messages).encode()  # every message is printable text
