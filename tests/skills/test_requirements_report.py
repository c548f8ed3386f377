"""The dependency report at import: declared vs inferred vs set aside, each with file:line, for
skills written by the tests in the shapes of published ones (pdf, docx, xlsx, pptx, GIF maker,
web-app testing, MCP builder, artifacts builder, OCR, video, plain instructions) and odd ones."""

from __future__ import annotations

import textwrap

import pytest

from skills.models import SkillVersion
from tests.support.skills import EXECUTABLE, REGULAR, build_zip, import_bytes

from .conftest import World

pytestmark = pytest.mark.django_db


def md(name: str, body: str, extra: str = "") -> bytes:
    head = f"---\nname: {name}\ndescription: The {name} skill. Use when testing reports.\nlicense: MIT\n{extra}---\n"
    return (head + textwrap.dedent(body)).encode()


def skill(name: str, body: str, files: dict[str, str], *, extra: str = "") -> SkillVersion:
    entries = [(f"{name}/SKILL.md", md(name, body, extra), REGULAR)]
    for path, text in files.items():
        mode = EXECUTABLE if text.startswith("#!") else REGULAR
        entries.append((f"{name}/{path}", textwrap.dedent(text).encode(), mode))
    return import_bytes(build_zip(entries), f"{name}.zip").version


def keys(entries: list[dict[str, object]]) -> list[str]:
    return sorted(str(entry["key"]) for entry in entries)


SHAPES: dict[str, tuple[str, dict[str, str], str]] = {
    "pdf": (
        """
        # PDF processing
        ## Quick start
        ```python
        from pypdf import PdfReader, PdfWriter
        import pdfplumber
        from reportlab.pdfgen import canvas
        ```
        ## Command-line tools
        ```bash
        pdftotext -layout input.pdf output.txt
        qpdf --empty --pages a.pdf b.pdf -- merged.pdf
        ```
        For forms, read forms.md.
        """,
        {
            "forms.md": "Convert pages with `python scripts/convert_pdf_to_images.py file.pdf out/`.\n",
            "scripts/convert_pdf_to_images.py": """\
                import os
                import sys
                from pdf2image import convert_from_path
                def convert(path, out):
                    for i, image in enumerate(convert_from_path(path, dpi=200)):
                        image.save(os.path.join(out, f"page_{i}.png"))
                convert(sys.argv[1], sys.argv[2])
                """,
            "scripts/fill_fillable_fields.py": """\
                import json, sys
                from pypdf import PdfReader, PdfWriter
                from extract_form_field_info import get_field_info
                """,
            "scripts/extract_form_field_info.py": "import json\nfrom pypdf import PdfReader\n",
        },
        "",
    ),
    "docx": (
        """
        # DOCX creation, editing, and analysis
        Converting to PDF requires LibreOffice.
        ## Dependencies
        - **docx**: `npm install -g docx` (creating new documents)
        - **defusedxml**: `pip install defusedxml` (secure XML parsing)
        ```bash
        soffice --headless --convert-to pdf document.docx
        pdftoppm -jpeg -r 150 document.pdf page
        ```
        """,
        {
            "ooxml/scripts/pack.py": """\
                import shutil, subprocess, zipfile
                import defusedxml.minidom
                def validate(path):
                    subprocess.run(["soffice", "--headless", "--convert-to", "pdf", path], check=True)
                """,
            "ooxml/scripts/unpack.py": "import zipfile\nfrom pathlib import Path\nimport defusedxml.minidom\n",
            "scripts/document.py": "from ooxml.scripts import pack\nfrom lxml import etree\n",
        },
        "",
    ),
    "xlsx": (
        """
        # XLSX
        ```python
        import pandas as pd
        from openpyxl import load_workbook
        ```
        Recalculate formulas with `python recalc.py output.xlsx` (uses LibreOffice).
        """,
        {
            "recalc.py": """\
                import json, os, platform, subprocess, sys
                from pathlib import Path
                from openpyxl import load_workbook
                def setup():
                    subprocess.run(["soffice", "--headless", "--terminate_after_init"], capture_output=True)
                """,
        },
        "",
    ),
    "pptx": (
        """
        # PPTX
        Read text with `python -m markitdown deck.pptx`.
        ## Dependencies
        - markitdown: `pip install "markitdown[pptx]"`
        - pptxgenjs: `npm install -g pptxgenjs`
        - playwright: `npm install -g playwright`
        - sharp: `npm install -g sharp`
        """,
        {
            "scripts/thumbnail.py": """\
                import subprocess, sys, tempfile
                from pathlib import Path
                from PIL import Image, ImageDraw
                from pptx import Presentation
                subprocess.run(["soffice", "--headless", "--convert-to", "pdf", sys.argv[1]])
                subprocess.run(["pdftoppm", "-jpeg", "out.pdf", "slide"])
                """,
            "scripts/html2pptx.js": """\
                const { chromium } = require('playwright');
                const path = require('path');
                const sharp = require('sharp');
                """,
        },
        "",
    ),
    "slack-gif-creator": (
        "# Slack GIF creator\nBuild with `core/gif_builder.py`.\n",
        {
            "requirements.txt": "pillow>=10.0.0\nimageio>=2.31.0\nimageio-ffmpeg>=0.4.9\nnumpy>=1.24.0\n",
            "core/gif_builder.py": (
                "from pathlib import Path\nimport imageio.v3 as imageio\nfrom PIL import Image\nimport numpy as np\n"
            ),
            "core/easing.py": "import math\n",
            "core/validators.py": "from pathlib import Path\nfrom core.easing import ease\n",
        },
        "",
    ),
    "webapp-testing": (
        """
        # Web application testing
        Start servers with the helper:
        `python scripts/with_server.py --server "npm run dev" --port 5173 -- python test.py`.
        ```python
        from playwright.sync_api import sync_playwright
        ```
        """,
        {
            "scripts/with_server.py": """\
                #!/usr/bin/env python3
                import argparse, socket, subprocess, sys, time
                def main():
                    subprocess.Popen(args.server, shell=True)
                """,
            "examples/element_discovery.py": "from playwright.sync_api import sync_playwright\n",
        },
        "",
    ),
    "mcp-builder": (
        """
        # MCP server development guide
        Run the evaluation harness: `python scripts/evaluation.py -t stdio -c python -a server.py eval.xml`.
        For TypeScript servers, `npm install @modelcontextprotocol/sdk zod`.
        """,
        {
            "scripts/requirements.txt": "anthropic>=0.39.0\nmcp>=1.1.0\n",
            "scripts/evaluation.py": """\
                import argparse, asyncio, json, re, time, traceback
                import xml.etree.ElementTree as ET
                from anthropic import Anthropic
                from connections import create_connection
                """,
            "scripts/connections.py": """\
                from contextlib import AsyncExitStack
                from mcp import ClientSession, StdioServerParameters
                from mcp.client.stdio import stdio_client
                from mcp.client.streamable_http import streamablehttp_client
                """,
        },
        "",
    ),
    "artifacts-builder": (
        "# Artifacts builder\nRun `bash scripts/init-artifact.sh my-app` then `bash scripts/bundle-artifact.sh`.\n",
        {
            "scripts/init-artifact.sh": """\
                #!/bin/bash
                set -e
                NODE_VERSION=$(node -v | cut -d'v' -f2)
                pnpm create vite "$1" --template react-ts
                cd "$1" && pnpm install
                npm install -D parcel @parcel/config-default html-inline
                """,
            "scripts/bundle-artifact.sh": (
                "#!/bin/bash\nnpx parcel build index.html\nnpx html-inline dist/index.html > bundle.html\n"
            ),
        },
        "",
    ),
    "ocr": (
        "# OCR\nRequires Tesseract. Run `python scripts/ocr.py scan.png`.\n",
        {
            "scripts/ocr.py": """\
                import sys
                try:
                    import pytesseract
                except ImportError:
                    pytesseract = None
                from PIL import Image
                import cv2
                print(pytesseract.image_to_string(Image.open(sys.argv[1])))
                """,
        },
        "",
    ),
    "video-maker": (
        "# Video maker\nNeeds ffmpeg on PATH.\n",
        {
            "scripts/make_video.py": """\
                import os, shutil, subprocess
                import yaml
                from moviepy.editor import ImageClip
                if shutil.which("ffprobe") is None:
                    raise SystemExit("ffprobe missing")
                os.system("ffmpeg -y -i in.mp4 out.gif")
                """,
        },
        "",
    ),
    "brand-guidelines": (
        "# Brand guidelines\nUse the colours below. Install nothing; the fonts are in assets/.\n",
        {"assets/palette.txt": "#141413 dark\n"},
        "",
    ),
    "docs-from-metadata": (
        "# Declared everywhere\nRun `node scripts/make.mjs`.\n",
        {
            "pyproject.toml": '[project]\nname = "x"\ndependencies = ["python-docx>=1.1", "requests"]\n',
            "package.json": '{"dependencies": {"docx": "^9.0.0"}}',
            "scripts/make.mjs": (
                "import { Document } from 'docx';\nimport fs from 'node:fs';\nimport lodash from 'lodash';\n"
            ),
            "scripts/use.py": "import docx\nimport requests\n",
        },
        "metadata:\n  debian-packages: pandoc\n",
    ),
}

EXPECTED: dict[str, tuple[list[str], list[str]]] = {
    # name: (declared keys, inferred keys)
    "pdf": (
        [],
        ["debian:poppler-utils", "debian:qpdf", "pip:pdf2image", "pip:pdfplumber", "pip:pypdf", "pip:reportlab"],
    ),
    "docx": (
        [],
        ["debian:libreoffice-core", "debian:poppler-utils", "npm:docx", "pip:defusedxml", "pip:lxml"],
    ),
    "xlsx": ([], ["debian:libreoffice-core", "pip:openpyxl", "pip:pandas"]),
    "pptx": (
        [],
        [
            "debian:libreoffice-core",
            "debian:nodejs",
            "debian:poppler-utils",
            "npm:playwright",
            "npm:pptxgenjs",
            "npm:sharp",
            "pip:markitdown",
            "pip:pillow",
            "pip:python-pptx",
        ],
    ),
    "slack-gif-creator": (["pip:imageio", "pip:imageio-ffmpeg", "pip:numpy", "pip:pillow"], []),
    "webapp-testing": ([], ["pip:playwright"]),
    "mcp-builder": (["pip:anthropic", "pip:mcp"], ["npm:@modelcontextprotocol/sdk", "npm:zod"]),
    "artifacts-builder": (
        [],
        ["debian:nodejs", "debian:npm", "npm:@parcel/config-default", "npm:html-inline", "npm:parcel"],
    ),
    "ocr": ([], ["debian:tesseract-ocr", "pip:opencv-python", "pip:pillow", "pip:pytesseract"]),
    "video-maker": ([], ["debian:ffmpeg", "pip:moviepy", "pip:pyyaml"]),
    "brand-guidelines": ([], []),
    "docs-from-metadata": (
        ["debian:pandoc", "npm:docx", "pip:python-docx", "pip:requests"],
        ["debian:nodejs", "npm:lodash"],
    ),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_report_of_a_published_shape(name: str) -> None:
    body, files, extra = SHAPES[name]
    report = skill(name, body, files, extra=extra).dependency_report
    declared, inferred = EXPECTED[name]
    assert keys(report["declared"]) == declared
    assert keys(report["inferred"]) == inferred


def where_of(version: SkillVersion, key: str) -> list[str]:
    return next(need["where"] for need in version.dependency_report["inferred"] if need["key"] == key)


def test_each_need_says_where_it_was_found() -> None:
    body, files, _ = SHAPES["docx"]
    version = skill("docx", body, files)
    # SKILL.md: 5 frontmatter lines, a blank line, then the body.
    assert where_of(version, "debian:libreoffice-core") == ["SKILL.md:8", "SKILL.md:13", "ooxml/scripts/pack.py:4"]
    assert where_of(version, "pip:defusedxml")[:2] == ["SKILL.md:11", "ooxml/scripts/pack.py:2"]
    assert where_of(version, "npm:docx") == ["SKILL.md:10"]
    ignored = {(entry["name"], entry["why"]) for entry in version.dependency_report["ignored"]}
    assert ("subprocess", "standard library") in ignored
    assert ("ooxml", "the skill's own module") in ignored


def test_import_names_map_to_distributions_and_unknown_ones_are_marked_assumed() -> None:
    body, files, _ = SHAPES["ocr"]
    inferred = {need["key"]: need for need in skill("ocr", body, files).dependency_report["inferred"]}
    assert inferred["pip:opencv-python"]["reasons"] == ["import cv2"]
    assert inferred["pip:opencv-python"]["assumed"] is False
    assert inferred["pip:pytesseract"]["optional"] is True, "imported inside try/except ImportError"
    assert inferred["pip:pytesseract"]["assumed"] is True, "not in the kept mapping: the same name is assumed"
    body, files, _ = SHAPES["video-maker"]
    inferred = {need["key"]: need for need in skill("video-maker", body, files).dependency_report["inferred"]}
    assert inferred["pip:moviepy"]["assumed"] is True
    assert inferred["pip:pyyaml"]["requirement"] == "PyYAML"
    assert sorted(inferred["debian:ffmpeg"]["reasons"]) == ["named in prose (ffmpeg)", "runs ffmpeg", "runs ffprobe"]


def test_declared_needs_are_not_repeated_as_inferred_and_install_as_before() -> None:
    body, files, _ = SHAPES["slack-gif-creator"]
    version = skill("slack-gif-creator", body, files)
    assert version.dependency_report["inferred"] == []
    assert [dep["requirement"] for dep in version.dependencies["pip"]] == [
        "pillow>=10.0.0",
        "imageio>=2.31.0",
        "imageio-ffmpeg>=0.4.9",
        "numpy>=1.24.0",
    ]


def test_pyproject_and_frontmatter_declarations_join_the_install_plan() -> None:
    body, files, extra = SHAPES["docs-from-metadata"]
    version = skill("docs-from-metadata", body, files, extra=extra)
    assert [dep["requirement"] for dep in version.dependencies["pip"]] == ["python-docx>=1.1", "requests"]
    assert version.dependencies["debian"] == ["pandoc"]
    assert [dep["name"] for dep in version.dependencies["npm"]] == ["docx"]
    other = skill("frontmatter-deps", "# x\n", {}, extra="dependencies: python>=3.8, pandas>=1.5.0\n").dependency_report
    assert keys(other["declared"]) == ["pip:pandas"], "python itself is not a package"


def test_a_script_that_does_not_parse_is_set_aside_not_refused() -> None:
    version = skill("broken", "# x\n", {"scripts/bad.py": "def (:\n", "scripts/ok.py": "import requests\n"})
    assert keys(version.dependency_report["inferred"]) == ["pip:requests"]
    assert {"name": "scripts/bad.py", "why": "Python file that does not parse", "where": ["scripts/bad.py"]} in (
        version.dependency_report["ignored"]
    )


def test_report_is_on_the_skill_page(world: World) -> None:
    body, files, _ = SHAPES["pdf"]
    version = skill("pdf", body, files)
    page = world.client_for("bob").get(version.skill.get_absolute_url()).content.decode()
    assert 'id="inferred"' in page
    assert "scripts/convert_pdf_to_images.py:3" in page
    assert "import pdf2image" in page
    assert "standard library" in page


def test_files_over_the_read_limit_are_not_read() -> None:
    # Varied lines, so the zip stays under the compression-ratio cap.
    big = "pip install from-a-huge-file\n" + "".join(f"line {i} {i * 7919 % 104729:x}\n" for i in range(40_000))
    assert len(big) > 512 * 1024
    version = skill("huge", "# x\n", {"reference/huge.md": big, "scripts/run.py": "import requests\n"})
    assert keys(version.dependency_report["inferred"]) == ["pip:requests"]


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("x = " + "+".join(["1"] * 3000) + "\n", id="long chain (RecursionError in ast)"),
        pytest.param("x = " + "-" * 10_000 + "1\n", id="deep unary (MemoryError in the parser)"),
    ],
)
def test_a_script_that_exhausts_the_parser_is_set_aside_not_a_crash(source: str) -> None:
    version = skill("deep", "# x\n", {"scripts/deep.py": source, "scripts/ok.py": "import requests\n"})
    assert keys(version.dependency_report["inferred"]) == ["pip:requests"]
    assert {"name": "scripts/deep.py", "why": "Python file that does not parse", "where": ["scripts/deep.py"]} in (
        version.dependency_report["ignored"]
    )


@pytest.mark.parametrize(
    "pyproject",
    [
        pytest.param("[project]\ndependencies = 5\n", id="not a list"),
        pytest.param('[project]\ndependencies = "numpy"\n', id="a string, not a list"),
        pytest.param('[project]\ndependencies = ["numpy"]\nx = ' + "[" * 600 + "]" * 600 + "\n", id="nested deeply"),
    ],
)
def test_a_pyproject_of_the_wrong_shape_declares_nothing_and_is_not_a_crash(pyproject: str) -> None:
    version = skill("odd-pyproject", "# x\n", {"pyproject.toml": pyproject, "scripts/ok.py": "import requests\n"})
    assert keys(version.dependency_report["declared"]) == []
    assert version.dependencies["pip"] == []
    assert keys(version.dependency_report["inferred"]) == ["pip:requests"]
