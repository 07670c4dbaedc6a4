"""Required test areas: how their tests skip, and the ``CI=true`` rule that they must not.

A test of a required area skips only through :func:`skip_area` or :func:`import_area`, which
tag the reason with the area (``[torch] torch is not installed: …``). With ``CI=true`` such a
skip fails the session (exit 1; one line per area, naming the reason) unless the area is listed
in ``GRADFED_ALLOW_SKIP`` (comma-separated, e.g. ``docker,torch``), which the run then prints.
Without ``CI=true`` the summary only lists the required areas that skipped.

The areas and what they need (``scripts/test`` sets each up on a fresh Debian machine, as root):

``docker``        a Docker engine and the local Kubo image (``scripts/docker-setup.sh``)
``crate-oracle``  cargo and crates.io, to build ``tests/seed/oracle`` (scripts/build-seed-oracle)
``ipfs-cluster``  Go and the Go module proxy, to build IPFS Cluster (scripts/install-ipfs-cluster)
``torch``         PyTorch (the ``test`` extra)
``sklearn``       scikit-learn and matplotlib, for the digits examples (the ``test`` extra)
``netns``         root and iproute2, iptables, gcc, curl, jq: hosts as network namespaces
                  (``scripts/wan/setup.sh --no-kubo``), for the federation tests
``cometbft``      Go and the Go module proxy, to build CometBFT (scripts/install-cometbft)

Every other skip is not a required area: the WAN profile (``GRADFED_WAN=1``, root namespaces),
``--kubo=external`` or ``--kubo=docker`` leaving out tests that need several daemons or a local
binary.
"""

from __future__ import annotations

import importlib
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final, NoReturn

import pytest

AREAS: Final = ("docker", "crate-oracle", "ipfs-cluster", "torch", "sklearn", "netns", "cometbft")
ALLOW_ENV: Final = "GRADFED_ALLOW_SKIP"
_TAG: Final = re.compile(r"\[(?P<area>[a-z-]+)\] (?P<reason>.*)", re.DOTALL)


def skip_area(area: str, reason: str) -> NoReturn:
    """Skip the current test (or module) because ``area`` cannot run here, saying why."""
    if area not in AREAS:
        raise ValueError(f"unknown test area {area!r} (areas: {', '.join(AREAS)})")
    pytest.skip(f"[{area}] {reason}", allow_module_level=True)


def import_area(area: str, module: str) -> ModuleType:
    """Import ``module``, or skip as ``area`` (like :func:`pytest.importorskip`)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        skip_area(area, f"{module} is not installed ({exc}); pip install -e '.[test]'")


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def area_of(report: pytest.CollectReport | pytest.TestReport) -> tuple[str, str] | None:
    """``(area, reason)`` of a skip made by :func:`skip_area`, else ``None``."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    match = _TAG.fullmatch(_skip_reason(report))
    if match is None or match["area"] not in AREAS:
        return None
    return match["area"], match["reason"]


def untagged(reason: str) -> str:
    """A skip reason without its ``[area]`` tag."""
    match = _TAG.fullmatch(reason)
    return match["reason"] if match and match["area"] in AREAS else reason


def _allowed_areas() -> list[str]:
    names = [n.strip() for n in os.environ.get(ALLOW_ENV, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in AREAS]
    if unknown:
        raise pytest.UsageError(
            f"{ALLOW_ENV} names unknown area(s) {', '.join(unknown)} (areas: {', '.join(AREAS)})"
        )
    return [a for a in AREAS if a in names]


@dataclass(eq=False)  # a plugin object must stay hashable
class RequiredAreas:
    """The plugin: notes every area-tagged skip and, with ``CI=true``, fails the session."""

    ci: bool
    allowed: list[str]
    skips: dict[str, Counter[str]] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)

    def _note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        tagged = area_of(report)
        if tagged is not None:
            area, reason = tagged
            self.skips.setdefault(area, Counter())[reason] += 1
            self.where.setdefault(area, report.nodeid)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    def failing(self) -> list[str]:
        """Required areas that skipped and are not allowed to (only with ``CI=true``)."""
        if not self.ci:
            return []
        return [a for a in AREAS if a in self.skips and a not in self.allowed]

    def pytest_report_header(self) -> list[str]:
        if not self.ci:
            return []
        return [f"CI opt-out: {area} tests may skip ({ALLOW_ENV})" for area in self.allowed]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.failing() and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _line(self, area: str) -> str:
        reasons = self.skips[area]
        (reason, _), *others = reasons.most_common()
        count = sum(reasons.values())
        what = f"{count} skip{'s' if count != 1 else ''}"
        more = (
            f" (and {len(others)} other reason{'s' if len(others) > 1 else ''})" if others else ""
        )
        said = " / ".join(line.strip() for line in reason.splitlines() if line.strip())
        said = said if len(said) <= 400 else said[:399] + "…"
        return f"{area} ({what}, e.g. {self.where[area]}): {said or 'no reason given'}{more}"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for area in self.allowed if self.ci else []:
            state = "skipped: " + self._line(area) if area in self.skips else "none skipped"
            terminalreporter.write_line(f"CI opt-out: {area} tests may skip ({ALLOW_ENV}); {state}")
        for area in self.failing():
            terminalreporter.write_line(
                f"CI=true: required area {self._line(area)} -- set it up, "
                f"or allow it with {ALLOW_ENV}={area}",
                red=True,
                bold=True,
            )
        if not self.ci and self.skips:
            skipped = ", ".join(f"{a} ({sum(self.skips[a].values())})" for a in self.skips)
            terminalreporter.write_line(
                f"required areas skipped (CI=true fails on them): {skipped}"
            )


def register(config: pytest.Config) -> None:
    """Install the plugin for this session (called from ``tests/conftest.py``)."""
    ci = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")
    allowed = _allowed_areas()  # checked even without CI=true, so a typo shows at once
    config.pluginmanager.register(RequiredAreas(ci, allowed), "gradfed-required-areas")
