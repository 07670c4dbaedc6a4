"""The CLI's book of sample counts: CID → the ``num_samples`` announced or committed with it.

``commit --samples K`` and every announcement ``watch`` or ``round`` accepts write here, so
``aggregate`` can weight FedAvg by the counts that were published instead of equal weights. The
book is a small JSON file beside the managed node (``<node dir>/samples.json``), written
atomically and capped at :data:`MAX_ENTRIES` (oldest dropped). Announced counts are a peer's
claim: they are read back as non-negative integers or ignored.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from .common import default_node_dir

__all__ = ["MAX_ENTRIES", "book_path", "load_samples", "record_samples"]

MAX_ENTRIES: Final = 10_000
"""Most CIDs the book remembers."""


def book_path(args: argparse.Namespace) -> Path:
    """Return ``<node dir>/samples.json`` for the parsed global options."""
    node_dir = Path(args.node_dir) if getattr(args, "node_dir", None) else default_node_dir()
    return node_dir / "samples.json"


def load_samples(path: Path) -> dict[str, int]:
    """Return the book (empty when missing or unreadable; bad entries skipped)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(cid): count
        for cid, count in data.items()
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0
    }


def record_samples(path: Path, counts: Mapping[str, int | None]) -> None:
    """Add ``cid → count`` entries (``None`` counts skipped); best effort, never raises."""
    new = {cid: count for cid, count in counts.items() if count is not None}
    if not new:
        return
    book = load_samples(path)
    for cid in new:
        book.pop(cid, None)  # re-inserted last: the newest survive the cap
    book.update(new)
    kept = dict(list(book.items())[-MAX_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(kept))
        temporary.replace(path)
    except OSError:
        return
