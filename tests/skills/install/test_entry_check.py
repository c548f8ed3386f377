"""The entry checks (skills/install/entry_check.py) on this machine's Python: what a script
imports and calls is read with `ast` (Python) or a small lexer (shell), optional needs are
not required, and problems name the script, the line and the missing name. The same source
runs in the built image in tests/skills/install/test_verify.py."""

from __future__ import annotations

from pathlib import Path

from skills.install import entry_check


def _check(root: Path, files: dict[str, str], entries: list[str]) -> dict[str, list[str]]:
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    report = entry_check.main({"root": str(root), "pip": [], "entries": entries})
    return {key: report[key] for key in ("problems", "warnings")}


def test_optional_imports_and_programs_are_not_required(tmp_path: Path) -> None:
    script = (
        "import json, os.path\n"
        "try:\n    import ujson_not_here\nexcept ImportError:\n    ujson_not_here = None\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import stubs_not_here\n"
        "import shutil, subprocess\n"
        "if shutil.which('soffice_not_here'):\n    subprocess.run(['soffice_not_here'])\n"
        "try:\n    subprocess.run(['pandoc_not_here'])\nexcept FileNotFoundError:\n    pass\n"
        "subprocess.run(['python3', '-V'])\n"
    )
    report = _check(tmp_path / "skill", {"scripts/run.py": script}, ["scripts/run.py"])
    assert [p for p in report["problems"] if "writable" not in p] == []


def test_missing_modules_names_and_programs_are_named(tmp_path: Path) -> None:
    files = {
        "scripts/run.py": (
            "import sys\nimport helpers\nfrom json import loads\n"
            "from email.mime.text import MIMEText\nimport subprocess\n"
            "subprocess.run('pdftoppm_not_here -png x', shell=True)\n"
        ),
        "scripts/helpers.py": "import yaml_not_here\nfrom helpers2 import nothing_here\n",
        "scripts/helpers2.py": "def something():\n    pass\n",
    }
    problems = _check(tmp_path / "skill", files, ["scripts/run.py"])["problems"]
    assert "scripts/run.py: calls pdftoppm_not_here (line 6), which is not on PATH" in problems
    assert (
        "scripts/run.py -> scripts/helpers.py: import yaml_not_here (line 1): "
        "yaml_not_here is not installed in the image"
    ) in problems
    assert (
        "scripts/run.py -> scripts/helpers.py: from helpers2 import nothing_here (line 2): helpers2 has no nothing_here"
    ) in problems


def test_shell_commands_are_read_past_quotes_heredocs_cases_and_functions() -> None:
    script = (
        "#!/bin/bash\nset -euo pipefail\n# soffice in a comment\n"
        'usage() {\n  echo "Usage: $0\n  pdftoppm in a string" >&2\n  exit 1\n}\n'
        'function helper { jq . "$1"; }\n'
        "X=1 qpdf --check a.pdf 2>/dev/null || true\n"
        'case "${1:-}" in\n  --help|-h) usage ;;\n  start|begin) pandoc in.md ;;\n  *) ;;\nesac\n'
        'for f in *.txt; do wc -l "$f" | sort -n; done\n'
        "out=$(convert a.png b.jpg)\n(( count++ ))\nn=$(( 1 + 2 ))\n"
        "cat <<EOT\nsoffice --headless\nEOT\n"
        "[[ -f x ]] && grep -q foo x\n"
    )
    words = [word for word, _ in entry_check.shell_programs(script)]
    assert words == ["jq", "qpdf", "usage", "pandoc", "wc", "sort", "convert", "cat", "grep"]


def test_a_script_too_deep_for_the_parser_is_named_not_a_crash(tmp_path: Path) -> None:
    files = {
        "scripts/chain.py": "x = " + "+".join(["1"] * 3000) + "\n",
        "scripts/visit.py": "x = " + "+".join(["1"] * 600) + "\n",  # parses, too deep to walk recursively
        "scripts/unary.py": "x = " + "-" * 10_000 + "1\n",
        "scripts/helper_user.py": "import deep_helper\n",
        "scripts/deep_helper.py": "y = " + "+".join(["2"] * 3000) + "\n",
    }
    entries = ["scripts/chain.py", "scripts/visit.py", "scripts/unary.py", "scripts/helper_user.py"]
    report = _check(tmp_path / "skill", files, entries)
    problems = [p for p in report["problems"] if "writable" not in p]
    assert [p.split(":")[0] for p in problems] == [
        "scripts/chain.py",
        "scripts/unary.py",
        "scripts/helper_user.py -> scripts/deep_helper.py",
    ]
    assert all("too deeply nested for the parser (Python cannot compile it)" in p for p in problems)
    # Python compiles and runs this one: not a problem, but what it imports is not checked.
    assert "scripts/visit.py: too deeply nested to read its imports and programs; not checked" in report["warnings"]


def test_a_lookup_that_exits_when_the_program_is_missing_requires_it(tmp_path: Path) -> None:
    # Scripts that stop at once without a program (exit 127 before --help) need it on PATH;
    # a lookup that only chooses another way stays optional.
    shell = (
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        'command -v qpdf_not_here >/dev/null 2>&1 || { echo "qpdf not found" >&2; exit 127; }\n'
        "which pdfinfo_not_here >/dev/null || exit 1\n"
        "if ! hash tesseract_not_here 2>/dev/null; then\n  echo missing >&2\n  exit 2\nfi\n"
        "if command -v pandoc_not_here >/dev/null; then pandoc_not_here -o out.html in.md; else cat in.md; fi\n"
        'qpdf_not_here --linearize "$1" "$2"\npdfinfo_not_here "$1"\ntesseract_not_here "$1" out\n'
    )
    python = (
        "import shutil, subprocess, sys\n"
        "if not shutil.which('soffice_not_here'):\n    sys.exit('LibreOffice is required')\n"
        "if shutil.which('ffmpeg_not_here') is None:\n    raise SystemExit('ffmpeg is required')\n"
        "if shutil.which('magick_not_here'):\n    subprocess.run(['magick_not_here', 'a.png', 'b.jpg'])\n"
        "subprocess.run(['soffice_not_here', '--headless'])\nsubprocess.run(['ffmpeg_not_here', '-i', 'a'])\n"
    )
    files = {"scripts/shrink.sh": shell, "scripts/convert.py": python}
    report = _check(tmp_path / "skill", files, ["scripts/shrink.sh", "scripts/convert.py"])
    problems = sorted(p for p in report["problems"] if "writable" not in p)
    assert problems == [
        "scripts/convert.py: calls ffmpeg_not_here (line 9), which is not on PATH",
        "scripts/convert.py: calls soffice_not_here (line 8), which is not on PATH",
        "scripts/shrink.sh: calls pdfinfo_not_here (line 11), which is not on PATH",
        "scripts/shrink.sh: calls qpdf_not_here (line 10), which is not on PATH",
        "scripts/shrink.sh: calls tesseract_not_here (line 12), which is not on PATH",
    ]
