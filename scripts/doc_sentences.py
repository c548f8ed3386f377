"""Report the words and the median sentence length of the reader docs (README.md, docs/*.md).

Usage: python scripts/doc_sentences.py [FILE ...]

Prose only: fenced code blocks, table rows (reference rows, not sentences) and headings are
left out. A sentence ends at
".", "!" or "?" followed by a space or the end of a paragraph; a list item is a paragraph.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9`*\"(\[])")
INLINE_CODE = re.compile(r"`[^`]*`")
ABBREVIATION = re.compile(r"\b(?:e\.g|i\.e|cf|vs|etc)\.(?=\s+[a-z`(])")
LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a Markdown text (list items each a paragraph of their own)."""
    found: list[str] = []
    current: list[str] = []
    fenced = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            current = _flush(current, found)
            continue
        if fenced or not stripped or stripped.startswith(("|", "#")):
            current = _flush(current, found)
            continue
        if re.match(r"^([-*+]|\d+\.)\s", stripped):
            current = _flush(current, found)
            stripped = re.sub(r"^([-*+]|\d+\.)\s+", "", stripped)
        current.append(stripped)
    _flush(current, found)
    return found


def _flush(current: list[str], found: list[str]) -> list[str]:
    if current:
        found.append(" ".join(current))
    return []


def sentence_lengths(text: str) -> list[int]:
    """Words per sentence of the prose of a Markdown text."""
    lengths = []
    for paragraph in paragraphs(text):
        plain = LINK.sub(r"\1", INLINE_CODE.sub(lambda m: m.group(0).replace(" ", "_"), paragraph))
        plain = ABBREVIATION.sub(lambda m: m.group(0).replace(".", ""), plain)
        for sentence in SENTENCE_END.split(plain):
            words = len(sentence.split())
            if words:
                lengths.append(words)
    return lengths


def reader_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] or reader_docs()
    every: list[int] = []
    total_words = 0
    for path in files:
        text = path.read_text()
        lengths = sentence_lengths(text)
        every += lengths
        words = len(text.split())
        total_words += words
        median = statistics.median(lengths) if lengths else 0
        name = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        print(f"{name!s:28} {words:6} words {len(lengths):5} sentences  median {median:4.1f} words")
    median_all = statistics.median(every) if every else 0
    print(f"{'total':28} {total_words:6} words {len(every):5} sentences  median {median_all:4.1f} words")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
