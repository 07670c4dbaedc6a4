"""Counts for the reliability campaign: a fast CI profile and the full one.

``GRADFED_RELIABILITY=full`` selects the full profile (issue 8's counts); anything else (the
default) the CI profile, which keeps every reliability test together under three minutes on a
2-core machine. ``GRADFED_FUZZ_EXAMPLES`` overrides the examples per fuzzed decoder.

=========================  ==========  ===========
What                       CI profile  full profile
=========================  ==========  ===========
fuzz examples per decoder  500         10,000
corruptions at rest        100         1,000
pubsub flood messages      1,000       10,000
SIGKILL/restart cycles     2           10
=========================  ==========  ===========
"""

from __future__ import annotations

import os

FULL = os.environ.get("GRADFED_RELIABILITY", "ci").strip().lower() == "full"

FUZZ_EXAMPLES = int(os.environ.get("GRADFED_FUZZ_EXAMPLES", "10000" if FULL else "500"))
CORRUPTIONS = 1000 if FULL else 100
FLOOD_MESSAGES = 10_000 if FULL else 1000
CRASH_CYCLES = 10 if FULL else 2
