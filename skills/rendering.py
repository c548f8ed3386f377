"""SKILL.md bodies to safe HTML: markdown-it-py without raw HTML, then nh3 sanitising.

Raw HTML is turned off in the parser (so `<script>` comes out as text) and the result is
still cleaned by nh3, so neither a parser bug nor a crafted link survives as markup.
"""

from __future__ import annotations

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

_markdown = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


def render_markdown(text: str) -> SafeString:
    html = _markdown.render(text)
    return mark_safe(nh3.clean(html, link_rel="noopener noreferrer nofollow"))  # noqa: S308  (sanitised just above)
