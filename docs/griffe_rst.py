"""A griffe extension for the API reference: the library's reST-flavoured docstrings as Markdown.

The docstrings are written for ``help()`` and doctest: bare ``>>>`` examples and
Sphinx roles (``:meth:`x```). Markdown would read an example's output such as
``[20, 20]`` as a link (a broken reference under ``mkdocs build --strict``), so
each run of doctest lines becomes a fenced ``pycon`` block and a role becomes
plain code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:meth|func|class|attr|mod|data|exc|obj|py:\w+):`~?([^`]+)`")


def fence_doctests(text: str) -> str:
    """Wrap each run of ``>>>`` lines and their output in a ```` ```pycon ```` fence."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.lstrip().startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.append(f"{indent}```pycon")
        # An example runs to the next blank line, as doctest reads it.
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class ReSTDocstrings(griffe.Extension):
    """Rewrite each docstring once, when griffe has loaded its object."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = ROLE.sub(r"``\1``", obj.docstring.value)
            obj.docstring.value = fence_doctests(text)
