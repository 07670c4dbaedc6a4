"""Griffe extension for the docs build: render Sphinx roles in docstrings as inline code.

The docstrings use Sphinx roles (:class:`~gradfed_ipfs.storage.BlockStore`); mkdocstrings does
not read them, so each role becomes inline code, ``~`` keeping only the last dotted name, as
Sphinx shows it. Nothing is linked, so an unrendered target cannot break the strict build.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def _render(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    name = target.rsplit(".", 1)[-1] if tilde else target.lstrip(".")
    return f"`{name}`"


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every loaded docstring."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the roles in ``obj``'s docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_render, obj.docstring.value)
