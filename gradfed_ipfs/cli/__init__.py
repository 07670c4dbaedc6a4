"""The ``gradfed-ipfs`` command line: entry point, subcommands and the demo.

Only this package prints or imports ``rich``; nothing in the library imports it.
"""

from __future__ import annotations

from .app import build_parser, main

__all__ = ["build_parser", "main"]
