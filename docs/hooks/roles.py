"""mkdocs hook: the docstrings use Sphinx roles (:class:`X`, :meth:`Y`); show them as plain code."""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|mod|attr|exc|data|obj):\s*(<code)")


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub(r"\1", html)
