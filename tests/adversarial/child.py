"""Measure what a decode really allocates: a fresh Python with ``RLIMIT_AS`` set.

``tracemalloc`` cannot see pyarrow's memory pool (issue 15), so an attack runs in a child
process whose address space is capped at its size after ``setup`` plus ``budget_mb``; the child
reports the outcome, pyarrow's pool peak (``max_memory()``) and its peak RSS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]

_TEMPLATE = """
import json, resource, sys
import pyarrow as pa
{setup}

def _vm_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")

_hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + {budget}, _hard))
outcome = "ok"
try:
{attack}
except BaseException as exc:  # report every outcome, whatever it is
    outcome = type(exc).__name__ + ": " + str(exc)[:300]
resource.setrlimit(resource.RLIMIT_AS, (_hard, _hard))
print(json.dumps({{
    "outcome": outcome,
    "pa_peak": pa.default_memory_pool().max_memory(),
    "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}}))
"""


@dataclass(frozen=True)
class ChildResult:
    """What the child reported."""

    outcome: str
    pa_peak: int
    rss_peak: int

    @property
    def error(self) -> str:
        """The exception class name, or ``"ok"``."""
        return self.outcome.split(":", 1)[0]


def run_limited(setup: str, attack: str, *, budget_mb: int, timeout: float = 120.0) -> ChildResult:
    """Run ``setup`` then ``attack`` (Python source) in a child capped at setup + ``budget_mb``."""
    source = _TEMPLATE.format(
        setup=textwrap.dedent(setup),
        attack=textwrap.indent(textwrap.dedent(attack), "    "),
        budget=budget_mb * 2**20,
    )
    env = dict(os.environ, MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1", PYTHONPATH=str(_ROOT))
    done = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=_ROOT,
        env=env,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(f"child failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(lines[-1])
    return ChildResult(report["outcome"], report["pa_peak"], report["rss_peak"])
