"""The subcommands of the ``gradfed-ipfs`` CLI (CLI code only; the library never imports it)."""

from __future__ import annotations

from .data import add_data_parsers
from .node import add_node_parser
from .records import add_record_parsers

__all__ = ["add_data_parsers", "add_node_parser", "add_record_parsers"]
