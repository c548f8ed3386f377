"""Skills written like published ones, for bench/skill_scripts.py (original code, small).

Each skill is {path: (text, executable)}. They follow the shapes public skill collections
have: SKILL.md prose that says what is needed ("pip install pypdf", "requires LibreOffice")
or nothing, scripts with real imports and an argparse `--help`, a local helper module, a
shell script, a Node script; only two declare a requirements.txt. Nothing here runs on the
host; the bench writes the files into a temporary folder and imports them.
"""

from __future__ import annotations

Files = dict[str, tuple[str, bool]]


def skill_md(name: str, description: str, body: str) -> str:
    return f"---\nname: {name}\ndescription: {description}\nlicense: MIT\n---\n\n{body.strip()}\n"


def py(doc: str, imports: str, arguments: str, work: str) -> tuple[str, bool]:
    """An executable Python script: its imports at the top, argparse, then the work."""
    text = (
        f'#!/usr/bin/env python3\n"""{doc}"""\n\nimport argparse\n{imports.strip()}\n\n\n'
        f"def main() -> None:\n    parser = argparse.ArgumentParser(description={doc!r})\n"
        + "".join(f"    parser.add_argument({line})\n" for line in arguments.strip().splitlines())
        + "    args = parser.parse_args()\n"
        + "".join(f"    {line}\n" for line in work.strip().splitlines())
        + '\n\nif __name__ == "__main__":\n    main()\n'
    )
    return text, True


def sh(doc: str, programs: list[str], usage: str, work: str) -> tuple[str, bool]:
    """An executable bash script that checks its programs first, as careful scripts do."""
    checks = "".join(
        f'command -v {p} >/dev/null 2>&1 || {{ echo "{p} not found on PATH" >&2; exit 127; }}\n' for p in programs
    )
    text = (
        f"#!/usr/bin/env bash\n# {doc}\nset -euo pipefail\n{checks}"
        f'case "${{1:-}}" in -h|--help) echo "usage: {usage}"; exit 0;; esac\n{work.strip()}\n'
    )
    return text, True


def pdf() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "pdf",
                "Read, merge, split and render PDF files. Use when a task involves PDF documents.",
                """
# PDF processing

## Setup

    pip install pypdf pdfplumber

Rendering pages to images requires poppler-utils (`pdftoppm`).

## Scripts

- `scripts/extract_text.py file.pdf` prints the text of each page.
- `scripts/merge_pdfs.py out.pdf a.pdf b.pdf` merges files.
- `scripts/render_pages.py file.pdf outdir` writes one PNG per page.
- `scripts/check_fields.py form.pdf` lists fillable form fields.
""",
            ),
            False,
        ),
        "scripts/extract_text.py": py(
            "Print the text of each page of a PDF.",
            "import pdfplumber",
            "'pdf', help='input PDF'",
            "with pdfplumber.open(args.pdf) as doc:\n    for number, page in enumerate(doc.pages, 1):\n"
            "        print(f'--- page {number}')\n        print(page.extract_text() or '')",
        ),
        "scripts/merge_pdfs.py": py(
            "Merge PDF files into one.",
            "from pypdf import PdfReader, PdfWriter",
            "'output'\n'inputs', nargs='+'",
            "writer = PdfWriter()\nfor name in args.inputs:\n    for page in PdfReader(name).pages:\n"
            "        writer.add_page(page)\nwith open(args.output, 'wb') as out:\n    writer.write(out)",
        ),
        "scripts/render_pages.py": py(
            "Render each page of a PDF to a PNG with pdftoppm, then report the image sizes.",
            "import subprocess\nfrom pathlib import Path\n\nfrom PIL import Image",
            "'pdf'\n'outdir'\n'--dpi', type=int, default=100",
            "Path(args.outdir).mkdir(parents=True, exist_ok=True)\n"
            "subprocess.run(['pdftoppm', '-png', '-r', str(args.dpi), args.pdf, f'{args.outdir}/page'], check=True)\n"
            "for png in sorted(Path(args.outdir).glob('page*.png')):\n    print(png.name, Image.open(png).size)",
        ),
        "scripts/check_fields.py": py(
            "List the fillable form fields of a PDF.",
            "from pypdf import PdfReader",
            "'pdf'",
            "fields = PdfReader(args.pdf).get_fields() or {}\nfor name, field in fields.items():\n"
            "    print(name, field.get('/FT'), field.get('/V'))",
        ),
    }


def docx() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "docx",
                "Create and edit Word documents. Use when a task involves .docx files.",
                """
# Word documents

New documents are written with the JavaScript library: `npm install -g docx`, then
`node scripts/create_doc.js out.docx "Title"`.

Editing works on the XML: `scripts/unpack.py` and `scripts/pack.py`.

Converting to PDF requires LibreOffice: `scripts/to_pdf.py in.docx`.
""",
            ),
            False,
        ),
        "scripts/unpack.py": py(
            "Unpack a .docx into a folder of pretty-printed XML.",
            "import zipfile\nfrom pathlib import Path\n\nimport defusedxml.minidom",
            "'docx'\n'outdir'",
            "with zipfile.ZipFile(args.docx) as archive:\n    for name in archive.namelist():\n"
            "        target = Path(args.outdir) / name\n        target.parent.mkdir(parents=True, exist_ok=True)\n"
            "        data = archive.read(name)\n        if name.endswith('.xml'):\n"
            "            data = defusedxml.minidom.parseString(data).toprettyxml().encode()\n"
            "        target.write_bytes(data)",
        ),
        "scripts/pack.py": py(
            "Pack a folder of XML back into a .docx, checking each part parses.",
            "import zipfile\nfrom pathlib import Path\n\nfrom lxml import etree",
            "'folder'\n'docx'",
            "with zipfile.ZipFile(args.docx, 'w', zipfile.ZIP_DEFLATED) as archive:\n"
            "    for path in sorted(Path(args.folder).rglob('*')):\n        if path.is_file():\n"
            "            if path.suffix == '.xml':\n                etree.parse(str(path))\n"
            "            archive.write(path, path.relative_to(args.folder).as_posix())",
        ),
        "scripts/to_pdf.py": py(
            "Convert a document to PDF with LibreOffice.",
            "import subprocess",
            "'document'\n'--outdir', default='.'",
            "subprocess.run(['soffice', '--headless', '--convert-to', 'pdf', '--outdir', args.outdir, args.document], "
            "check=True)",
        ),
        "scripts/create_doc.js": (
            "#!/usr/bin/env node\n// Write a one-paragraph Word document.\n"
            'const fs = require("fs");\nconst { Document, Packer, Paragraph } = require("docx");\n'
            "const args = process.argv.slice(2);\n"
            'if (args.includes("--help") || args.length < 1) {\n'
            '  console.log("usage: create_doc.js OUT.docx [TITLE]");\n  process.exit(args.length < 1 ? 2 : 0);\n}\n'
            'const doc = new Document({ sections: [{ children: [new Paragraph(args[1] || "Untitled")] }] });\n'
            "Packer.toBuffer(doc).then((buffer) => fs.writeFileSync(args[0], buffer));\n",
            True,
        ),
    }


def xlsx() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "xlsx",
                "Read and write spreadsheets. Use for .xlsx and .csv work.",
                """
# Spreadsheets

Use openpyxl for formulas and formatting, pandas for data.

- `scripts/inspect_workbook.py book.xlsx` lists sheets, sizes and formulas.
- `scripts/sheet_to_csv.py book.xlsx Sheet1 out.csv`.
""",
            ),
            False,
        ),
        "scripts/inspect_workbook.py": py(
            "List the sheets of a workbook with their sizes and formula counts.",
            "import openpyxl",
            "'workbook'",
            "book = openpyxl.load_workbook(args.workbook)\nfor sheet in book.worksheets:\n"
            "    formulas = sum(1 for row in sheet.iter_rows() for c in row if c.data_type == 'f')\n"
            "    print(sheet.title, sheet.max_row, sheet.max_column, formulas)",
        ),
        "scripts/sheet_to_csv.py": py(
            "Write one sheet of a workbook as CSV.",
            "import pandas as pd",
            "'workbook'\n'sheet'\n'output'",
            "pd.read_excel(args.workbook, sheet_name=args.sheet).to_csv(args.output, index=False)",
        ),
    }


def pptx() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "pptx",
                "Inspect and make slide decks. Use when a task involves .pptx presentations.",
                """
# Presentations

`scripts/outline.py deck.pptx` prints each slide's title and text.
`scripts/thumbnail.py deck.pptx grid.png` draws a labelled grid of the slides' titles.
""",
            ),
            False,
        ),
        "scripts/outline.py": py(
            "Print the title and text of each slide.",
            "from pptx import Presentation",
            "'deck'",
            "for number, slide in enumerate(Presentation(args.deck).slides, 1):\n"
            "    texts = [s.text_frame.text for s in slide.shapes if s.has_text_frame]\n"
            "    print(number, ' | '.join(t for t in texts if t))",
        ),
        "scripts/thumbnail.py": py(
            "Draw a grid image naming each slide.",
            "from PIL import Image, ImageDraw\nfrom pptx import Presentation",
            "'deck'\n'output'",
            "slides = list(Presentation(args.deck).slides)\n"
            "image = Image.new('RGB', (400, 60 * max(1, len(slides))), 'white')\n"
            "draw = ImageDraw.Draw(image)\nfor i, _ in enumerate(slides):\n"
            "    draw.text((10, 60 * i + 20), f'slide {i + 1}', fill='black')\nimage.save(args.output)",
        ),
    }


def slack_gif_creator() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "slack-gif-creator",
                "Make small animated GIFs sized for Slack. Use when asked for an animated emoji or GIF.",
                """
# Slack GIFs

Emoji GIFs are 128x128 and small. `scripts/make_gif.py out.gif --text hi` makes a
bouncing-text GIF; `scripts/validate_gif.py out.gif` checks size and frame count.
""",
            ),
            False,
        ),
        "requirements.txt": ("pillow>=10.0.0\nimageio>=2.31.0\nnumpy>=1.24.0\n", False),
        "scripts/gif_tools.py": (
            '"""Frame helpers shared by the scripts."""\n\nimport numpy as np\nfrom PIL import Image, ImageDraw\n\n\n'
            "def frame(size: int, text: str, offset: int) -> np.ndarray:\n"
            "    image = Image.new('RGB', (size, size), (255, 255, 255))\n"
            "    ImageDraw.Draw(image).text((size // 4, size // 2 + offset), text, fill=(200, 30, 30))\n"
            "    return np.asarray(image)\n",
            False,
        ),
        "scripts/make_gif.py": py(
            "Make a bouncing-text GIF.",
            "import math\n\nimport imageio.v3 as iio\nfrom gif_tools import frame",
            "'output'\n'--text', default='hi'\n'--size', type=int, default=128\n'--frames', type=int, default=12",
            "frames = [frame(args.size, args.text, int(10 * math.sin(i / args.frames * 6.28))) "
            "for i in range(args.frames)]\niio.imwrite(args.output, frames, duration=80, loop=0)",
        ),
        "scripts/validate_gif.py": py(
            "Check a GIF's size and frame count against Slack's limits.",
            "import os\n\nfrom PIL import Image",
            "'gif'\n'--max-kb', type=int, default=128",
            "image = Image.open(args.gif)\nkb = os.path.getsize(args.gif) / 1024\n"
            "verdict = 'ok' if kb <= args.max_kb else 'too big'\n"
            "print(image.size, getattr(image, 'n_frames', 1), f'{kb:.0f} KB', verdict)",
        ),
    }


def mcp_builder() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "mcp-builder",
                "Build and evaluate MCP servers. Use when creating a Model Context Protocol server.",
                """
# MCP server builder

Evaluate a server with `scripts/evaluation.py --transport stdio -- python server.py`.
""",
            ),
            False,
        ),
        "requirements.txt": ("mcp>=1.1.0\n", False),
        "scripts/connections.py": (
            '"""Open a client session to a server over stdio or streamable HTTP."""\n\n'
            "from contextlib import asynccontextmanager\n\n"
            "from mcp import ClientSession, StdioServerParameters\nfrom mcp.client.stdio import stdio_client\n"
            "from mcp.client.streamable_http import streamablehttp_client\n\n\n@asynccontextmanager\n"
            "async def connect(transport: str, target: list[str]):\n    if transport == 'stdio':\n"
            "        params = StdioServerParameters(command=target[0], args=target[1:])\n"
            "        async with stdio_client(params) as (read, write):\n"
            "            async with ClientSession(read, write) as session:\n"
            "                await session.initialize()\n                yield session\n    else:\n"
            "        async with streamablehttp_client(target[0]) as (read, write, _):\n"
            "            async with ClientSession(read, write) as session:\n"
            "                await session.initialize()\n                yield session\n",
            False,
        ),
        "scripts/evaluation.py": py(
            "List a server's tools as a first evaluation step.",
            "import asyncio\n\nfrom connections import connect",
            "'--transport', choices=['stdio', 'http'], default='stdio'\n'target', nargs='+'",
            "async def run() -> None:\n    async with connect(args.transport, args.target) as session:\n"
            "        for tool in (await session.list_tools()).tools:\n            print(tool.name)\n"
            "asyncio.run(run())",
        ),
    }


def algorithmic_art() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "algorithmic-art",
                "Generative art from seeded noise. Use when asked for generative or algorithmic art.",
                """
# Algorithmic art

`scripts/render_png.py out.png --seed 7` renders a flow field with Pillow and numpy;
`node scripts/sketch.mjs out.svg 7` writes the same idea as SVG.
""",
            ),
            False,
        ),
        "scripts/render_png.py": py(
            "Render a seeded flow field to a PNG.",
            "import numpy as np\nfrom PIL import Image",
            "'output'\n'--seed', type=int, default=1\n'--size', type=int, default=256",
            "rng = np.random.default_rng(args.seed)\ny, x = np.mgrid[0:args.size, 0:args.size] / args.size\n"
            "field = np.sin(x * rng.uniform(3, 9)) + np.cos(y * rng.uniform(3, 9))\n"
            "pixels = ((field - field.min()) / np.ptp(field) * 255).astype('uint8')\n"
            "Image.fromarray(pixels, 'L').save(args.output)",
        ),
        "scripts/sketch.mjs": (
            "#!/usr/bin/env node\n// Write a seeded set of circles as SVG.\n"
            'import { writeFileSync } from "node:fs";\n\nconst args = process.argv.slice(2);\n'
            'if (args.includes("--help") || args.length < 1) {\n'
            '  console.log("usage: sketch.mjs OUT.svg [SEED]");\n  process.exit(args.length < 1 ? 2 : 0);\n}\n'
            "let seed = Number(args[1] || 1);\n"
            "const random = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);\n"
            "const circles = Array.from({ length: 40 }, () =>\n"
            '  `<circle cx="${random() * 400}" cy="${random() * 400}" r="${random() * 30}" '
            'fill="none" stroke="black"/>`);\n'
            'const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="400" height="400">'
            '${circles.join("")}</svg>`;\n'
            "writeFileSync(args[0], svg);\n",
            True,
        ),
    }


def webapp_testing() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "webapp-testing",
                "Test local web apps with a headless browser. Use to check a local web app's pages.",
                """
# Web app testing

Needs Playwright for Python (`pip install playwright`).

Start the app with `scripts/with_server.py --port 5173 -- npm run dev`, then
`scripts/probe_page.py http://localhost:5173/` prints the title and console messages.
""",
            ),
            False,
        ),
        "scripts/with_server.py": py(
            "Start a server, wait for its port, run a command, stop the server.",
            "import socket\nimport subprocess\nimport time",
            "'--port', type=int, required=True\n'command', nargs='+'",
            "server = subprocess.Popen(args.command)\ntry:\n    for _ in range(60):\n        try:\n"
            "            socket.create_connection(('127.0.0.1', args.port), timeout=1).close()\n            break\n"
            "        except OSError:\n            time.sleep(0.5)\n    print('server ready on', args.port)\n"
            "finally:\n    server.terminate()",
        ),
        "scripts/probe_page.py": py(
            "Open a page headless and print its title and console messages.",
            "from playwright.sync_api import sync_playwright",
            "'url'",
            "with sync_playwright() as p:\n    browser = p.chromium.launch()\n    page = browser.new_page()\n"
            "    page.on('console', lambda m: print('console:', m.text))\n    page.goto(args.url)\n"
            "    print(page.title())\n    browser.close()",
        ),
    }


def md_yaml_convert() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "md-yaml-convert",
                "Convert between YAML data and Markdown documents. Use for front matter and tables.",
                """
# YAML and Markdown

- `scripts/yaml_to_md.py data.yaml` renders a list of records as a Markdown table.
- `scripts/md_to_html.py doc.md` renders Markdown to HTML.
- `scripts/frontmatter.py doc.md` prints a document's front matter as JSON.
""",
            ),
            False,
        ),
        "scripts/yaml_to_md.py": py(
            "Render a YAML list of records as a Markdown table.",
            "import yaml",
            "'data'",
            "rows = yaml.safe_load(open(args.data)) or []\nkeys = list(rows[0]) if rows else []\n"
            "print('| ' + ' | '.join(keys) + ' |')\nprint('|' + '---|' * len(keys))\n"
            "for row in rows:\n    print('| ' + ' | '.join(str(row.get(k, '')) for k in keys) + ' |')",
        ),
        "scripts/md_to_html.py": py(
            "Render Markdown to HTML.",
            "import markdown",
            "'document'",
            "print(markdown.markdown(open(args.document).read(), extensions=['tables']))",
        ),
        "scripts/frontmatter.py": py(
            "Print a Markdown document's YAML front matter as JSON.",
            "import json\n\nimport yaml",
            "'document'",
            "text = open(args.document).read()\nhead = text.split('---')[1] if text.startswith('---') else ''\n"
            "print(json.dumps(yaml.safe_load(head) or {}, indent=2, default=str))",
        ),
    }


def image_ocr() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "image-ocr",
                "Read text from images and scans. Use when text must be extracted from a picture.",
                """
# Image OCR

Requires the Tesseract OCR engine (`tesseract`) and `pip install pytesseract pillow`.

- `scripts/ocr_image.py scan.png` prints the text.
- `scripts/ocr_batch.sh folder` writes a .txt next to each image.
""",
            ),
            False,
        ),
        "scripts/ocr_image.py": py(
            "Print the text Tesseract reads in an image.",
            "import pytesseract\nfrom PIL import Image",
            "'image'\n'--lang', default='eng'",
            "print(pytesseract.image_to_string(Image.open(args.image), lang=args.lang))",
        ),
        "scripts/ocr_batch.sh": sh(
            "OCR every image of a folder into .txt files beside them.",
            ["tesseract"],
            "ocr_batch.sh FOLDER",
            'for image in "$1"/*.png "$1"/*.jpg; do\n  [ -e "$image" ] || continue\n'
            '  tesseract "$image" "${image%.*}"\ndone',
        ),
    }


def skill_creator() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "skill-creator",
                "Create, check and package new skills. Use when writing a new skill.",
                """
# Skill creator

1. `scripts/init_skill.py my-skill --path out/` makes the folder.
2. `scripts/quick_validate.py out/my-skill` checks SKILL.md.
3. `scripts/package_skill.py out/my-skill` writes my-skill.zip.
""",
            ),
            False,
        ),
        "scripts/init_skill.py": py(
            "Make a new skill folder with a SKILL.md template.",
            "from pathlib import Path",
            "'name'\n'--path', default='.'",
            "root = Path(args.path) / args.name\n(root / 'scripts').mkdir(parents=True, exist_ok=True)\n"
            "(root / 'SKILL.md').write_text(f'---\\nname: {args.name}\\ndescription: TODO\\n---\\n')\nprint(root)",
        ),
        "scripts/quick_validate.py": py(
            "Check a skill's SKILL.md front matter.",
            "import re\nimport sys\nfrom pathlib import Path\n\nimport yaml\n\n\n"
            "def problems(folder: str) -> list[str]:\n    text = (Path(folder) / 'SKILL.md').read_text()\n"
            "    match = re.match(r'^---\\n(.*?)\\n---', text, re.S)\n    if not match:\n"
            "        return ['no front matter']\n    meta = yaml.safe_load(match.group(1)) or {}\n"
            "    return [f'missing {key}' for key in ('name', 'description') if key not in meta]",
            "'folder'",
            "found = problems(args.folder)\nprint('\\n'.join(found) or 'valid')\nsys.exit(1 if found else 0)",
        ),
        "scripts/package_skill.py": py(
            "Validate a skill and write it as a zip.",
            "import zipfile\nfrom pathlib import Path\n\nfrom quick_validate import problems",
            "'folder'\n'--out', default='.'",
            "found = problems(args.folder)\nif found:\n    raise SystemExit('\\n'.join(found))\n"
            "root = Path(args.folder)\ntarget = Path(args.out) / f'{root.name}.zip'\n"
            "with zipfile.ZipFile(target, 'w') as archive:\n    for path in root.rglob('*'):\n"
            "        archive.write(path, path.relative_to(root.parent).as_posix())\nprint(target)",
        ),
    }


def pdf_shrink() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "pdf-shrink",
                "Make PDFs smaller and count their pages. Use before sending large PDFs.",
                """
# Shrink PDFs

`scripts/shrink.sh in.pdf out.pdf` recompresses and linearizes;
`scripts/page_count.sh in.pdf` prints the page count.
""",
            ),
            False,
        ),
        "scripts/shrink.sh": sh(
            "Recompress and linearize a PDF.",
            ["qpdf"],
            "shrink.sh IN.pdf OUT.pdf",
            'qpdf --linearize --object-streams=generate --recompress-flate "$1" "$2"\nls -l "$1" "$2"',
        ),
        "scripts/page_count.sh": sh(
            "Print a PDF's page count.",
            ["pdfinfo"],
            "page_count.sh IN.pdf",
            "pdfinfo \"$1\" | awk '/^Pages:/ {print $2}'",
        ),
    }


def pptx_html() -> Files:
    return {
        "SKILL.md": (
            skill_md(
                "pptx-html",
                "Turn simple HTML slides into a PowerPoint deck. Use when slides are drafted as HTML.",
                """
# HTML to slides

Install the library first: `npm install -g pptxgenjs`.

`node scripts/html2pptx.js slides.html deck.pptx` makes one slide per `<section>`, with its
`<h1>` as the title and its paragraphs as text.
""",
            ),
            False,
        ),
        "scripts/html2pptx.js": (
            "#!/usr/bin/env node\n// One slide per <section> of an HTML file.\n"
            'const fs = require("fs");\nconst PptxGenJS = require("pptxgenjs");\n'
            "const args = process.argv.slice(2);\n"
            'if (args.includes("--help") || args.length < 2) {\n'
            '  console.log("usage: html2pptx.js SLIDES.html OUT.pptx");\n'
            '  process.exit(args.includes("--help") ? 0 : 2);\n}\n'
            'const strip = (s) => s.replace(/<[^>]+>/g, "").trim();\nconst deck = new PptxGenJS();\n'
            'const html = fs.readFileSync(args[0], "utf8");\n'
            "for (const [, body] of html.matchAll(/<section>([\\s\\S]*?)<\\/section>/g)) {\n"
            "  const slide = deck.addSlide();\n  const title = /<h1>([\\s\\S]*?)<\\/h1>/.exec(body);\n"
            '  slide.addText(title ? strip(title[1]) : "", { x: 0.5, y: 0.3, fontSize: 28 });\n'
            '  const text = [...body.matchAll(/<p>([\\s\\S]*?)<\\/p>/g)].map((m) => strip(m[1])).join("\\n");\n'
            "  slide.addText(text, { x: 0.5, y: 1.3, fontSize: 16 });\n}\n"
            "deck.writeFile({ fileName: args[1] });\n",
            True,
        ),
    }


SKILLS = {
    "pdf": pdf,
    "docx": docx,
    "xlsx": xlsx,
    "pptx": pptx,
    "slack-gif-creator": slack_gif_creator,
    "mcp-builder": mcp_builder,
    "algorithmic-art": algorithmic_art,
    "webapp-testing": webapp_testing,
    "md-yaml-convert": md_yaml_convert,
    "image-ocr": image_ocr,
    "skill-creator": skill_creator,
    "pdf-shrink": pdf_shrink,
    "pptx-html": pptx_html,
}
