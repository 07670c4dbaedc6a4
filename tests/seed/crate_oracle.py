"""Build and run the crate oracle (``tests/seed/oracle``) and compare its answers with ours.

The oracle is a small Rust program that links the real crate ``ipfrs-tensorlogic`` 0.2.0 and
answers check cases read as JSON on stdin. Floats cross the pipe as IEEE bit patterns (f32 as
u32, f64 as u64), so NaN, infinities, -0.0 and every last bit survive; bytes cross as hex.

Our side of a check is written in a *typed* form that doubles as the schema for decoding the
crate's answer: a float32 NumPy array or ``np.float32`` means "f32 bits here", ``np.float64``
means "f64 bits here", :class:`Ok`/:class:`Err` mean ``{"ok": …}``/``{"err": …}``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-seed-oracle"
BUILD_TIMEOUT_S = float(os.environ.get("GRADFED_SEED_ORACLE_BUILD_TIMEOUT", 15 * 60))


class OracleUnavailable(Exception):
    """The oracle cannot be built or run here; the message says why (the tests skip)."""


def build_oracle() -> Path:
    """Build the oracle with ``scripts/build-seed-oracle`` (a no-op once built); return its path.

    The first build downloads the crate and its dependencies from crates.io and compiles them:
    about 3.5 minutes on two idle cores, several times that on a loaded machine. A build that
    takes longer than ``GRADFED_SEED_ORACLE_BUILD_TIMEOUT`` seconds (default 15 minutes) is
    stopped; cargo keeps what it compiled, so the next run continues from there (or run the
    script by hand).

    Raises
    ------
    OracleUnavailable
        If ``GRADFED_SEED_ORACLE=skip``, cargo is missing, or the build fails or times out (for
        example without access to crates.io).
    """
    if os.environ.get("GRADFED_SEED_ORACLE", "") == "skip":
        raise OracleUnavailable("GRADFED_SEED_ORACLE=skip")
    with subprocess.Popen(
        [str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so a timeout stops rustc too
    ) as build:
        try:
            out, err = build.communicate(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(build.pid, signal.SIGTERM)
            build.communicate()
            raise OracleUnavailable(
                f"building the crate oracle took over {BUILD_TIMEOUT_S:.0f} s; run "
                "scripts/build-seed-oracle once (cargo resumes where it stopped)"
            ) from None
    binary = Path(out.strip().splitlines()[-1]) if out.strip() else None
    if build.returncode != 0 or binary is None or not binary.exists():
        tail = "\n".join(err.strip().splitlines()[-8:])
        raise OracleUnavailable(f"the crate oracle could not be built:\n{tail}")
    return binary


def run_oracle(binary: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send ``cases`` (``{"id", "fn", "args"}``, already encoded) and return the answers."""
    done = subprocess.run(
        [str(binary)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"crate oracle exited {done.returncode}: {done.stderr[-2000:]}")
    answers: list[dict[str, Any]] = json.loads(done.stdout)
    return answers


# --------------------------------------------------------------------------- encoding


def f32_bits(value: float) -> int:
    """The u32 bit pattern of ``value`` rounded to float32."""
    return int(np.float32(value).view(np.uint32))


def f64_bits(value: float) -> int:
    """The u64 bit pattern of ``value`` as float64."""
    return int(np.float64(value).view(np.uint64))


def from_f32_bits(bits: int) -> float:
    """The float32 value with bit pattern ``bits``, as a Python float."""
    return float(np.uint32(bits).view(np.float32))


def from_f64_bits(bits: int) -> float:
    """The float64 value with bit pattern ``bits``."""
    return float(np.uint64(bits).view(np.float64))


def encode(value: Any) -> Any:
    """Encode native arguments for the oracle: float32 arrays and scalars as bits, bytes as hex.

    A plain Python float is refused: say which precision it travels in.
    """
    if isinstance(value, np.ndarray):
        if value.dtype == np.float32:
            return value.reshape(-1).view(np.uint32).tolist()
        if value.dtype == np.float64:
            return value.reshape(-1).view(np.uint64).tolist()
        return value.tolist()
    if isinstance(value, np.float32):
        return f32_bits(value)
    if isinstance(value, np.float64):
        return f64_bits(value)
    if isinstance(value, float):
        raise TypeError(f"say np.float32 or np.float64 for {value!r}")
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, Mapping):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    return value


# --------------------------------------------------------------------------- our answers


@dataclass(frozen=True)
class Ok:
    """Our call returned ``value``."""

    value: Any = None


@dataclass(frozen=True)
class Err:
    """Our call raised an exception of class ``kind`` with message ``msg``."""

    kind: str
    msg: str


def attempt(call: Callable[[], Any]) -> Ok | Err:
    """Run ``call`` and wrap its value or the exception it raised."""
    try:
        return Ok(call())
    except Exception as exc:
        return Err(type(exc).__name__, str(exc))


# The crate's error variant → the class name we raise for it.
CRATE_TO_OURS = {
    "ShapeMismatch": "ShapeMismatch",
    "ChecksumFailed": "ChecksumFailed",
    "InvalidCompressionRatio": "InvalidCompressionRatio",
    "EmptyGradientSet": "EmptyGradientSet",
    "IncompatibleDtype": "IncompatibleDtype",
    "OutlierDetected": "OutlierDetected",
    "InvalidGradient": "InvalidGradient",
    "EmptyGradients": "EmptyGradients",
    "DimensionMismatch": "DimensionMismatch",
    "NodeNotFound": "NodeNotFound",
    "PeerNotFound": "PeerNotFound",
    "NoContributions": "NoContributions",
    "FederatedDimensionMismatch": "FederatedDimensionMismatch",
    "ClientNotFound": "ClientNotFound",
    "NotStarted": "NotStarted",
    "PassNotFound": "PassNotFound",
    "PassAlreadyTerminal": "PassAlreadyTerminal",
    "EmptyInput": "EmptyInput",
    "ArrowBlockShapeMismatch": "ArrowBlockShapeMismatch",
    "InvalidMagic": "InvalidMagic",
    "TruncatedData": "TruncatedData",
    "anyhow": "MalformedArrow",  # arrow_ipc's anyhow errors; their text is arrow-rs's
}


# --------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Tol:
    """Float tolerance: ``|ours - crate| <= atol + rtol * max(|ours|, |crate|)``.

    ``Tol()`` (both zero) means bit-exact, except that any NaN equals any NaN.
    """

    rtol: float = 0.0
    atol: float = 0.0


EXACT = Tol()


def _float_problem(ours: float, crate: float, tol: Tol, path: str, exact_bits: bool) -> str | None:
    if math.isnan(ours) and math.isnan(crate):
        return None
    if exact_bits and tol == EXACT:
        same = ours == crate and math.copysign(1.0, ours) == math.copysign(1.0, crate)
    elif math.isinf(ours) or math.isinf(crate):
        same = ours == crate
    else:
        same = abs(ours - crate) <= tol.atol + tol.rtol * max(abs(ours), abs(crate))
    return None if same else f"{path}: ours {ours!r}, crate {crate!r}"


def _same_message(ours: str, crate: str) -> bool:
    """Whether our message is the crate's, or the crate's followed by ``": "`` and detail.

    Our seed-compatible errors keep the crate's text and may add detail after it (for example
    the lengths behind a ``DimensionMismatch``); see the ``errors`` module docstring.
    """
    return ours == crate or ours.startswith(crate + ": ")


def compare(ours: Any, crate: Any, tol: Tol = EXACT, path: str = "$") -> list[str]:
    """Return the differences between our typed answer and the crate's encoded one."""
    if isinstance(ours, Ok | Err):
        if not isinstance(crate, Mapping) or not ({"ok", "err"} & set(crate)):
            return [f"{path}: crate answered {crate!r:.200}"]
        if isinstance(ours, Ok):
            if "ok" not in crate:
                err = crate["err"]
                return [f"{path}: ours ok {ours.value!r:.120}, crate {err['type']}: {err['msg']}"]
            return compare(ours.value, crate["ok"], tol, path)
        if "err" not in crate:
            return [f"{path}: ours {ours.kind}: {ours.msg}, crate ok {crate['ok']!r:.120}"]
        err = crate["err"]
        problems = []
        expected_kind = CRATE_TO_OURS.get(err["type"], err["type"])
        if ours.kind != expected_kind:
            problems.append(f"{path}: ours raised {ours.kind}, crate {err['type']}")
        if err["type"] != "anyhow" and not _same_message(ours.msg, err["msg"]):
            problems.append(f"{path}: message ours {ours.msg!r}, crate {err['msg']!r}")
        return problems
    if isinstance(ours, np.ndarray):
        if not isinstance(crate, list):
            return [f"{path}: crate answered {crate!r:.120}, ours an array"]
        mine = ours.reshape(-1)
        if mine.size != len(crate):
            return [f"{path}: length ours {mine.size}, crate {len(crate)}"]
        decode = from_f64_bits if mine.dtype == np.float64 else from_f32_bits
        problems = []
        for i, (a, b) in enumerate(zip(mine.tolist(), crate, strict=True)):
            problem = _float_problem(a, decode(b), tol, f"{path}[{i}]", exact_bits=True)
            if problem:
                problems.append(problem)
        return problems[:5]
    if isinstance(ours, np.float32 | np.float64):
        decode = from_f64_bits if isinstance(ours, np.float64) else from_f32_bits
        if not isinstance(crate, int) or isinstance(crate, bool):
            return [f"{path}: crate answered {crate!r:.120}, ours a float"]
        problem = _float_problem(float(ours), decode(crate), tol, path, exact_bits=True)
        return [problem] if problem else []
    if isinstance(ours, Mapping):
        if not isinstance(crate, Mapping) or set(ours) != set(crate):
            return [f"{path}: keys ours {sorted(ours)}, crate {crate!r:.200}"]
        return [p for k in ours for p in compare(ours[k], crate[k], tol, f"{path}.{k}")]
    if isinstance(ours, list | tuple):
        if not isinstance(crate, list) or len(ours) != len(crate):
            return [f"{path}: ours {list(ours)!r:.200}, crate {crate!r:.200}"]
        return [
            p
            for i, (a, b) in enumerate(zip(ours, crate, strict=True))
            for p in compare(a, b, tol, f"{path}[{i}]")
        ]
    if type(ours) is not type(crate) or ours != crate:
        return [f"{path}: ours {ours!r:.200}, crate {crate!r:.200}"]
    return []


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    """One check: a crate call, our answer in typed form, and how to compare them.

    Attributes
    ----------
    family
        Group name used to report and parametrize (e.g. ``"top_k"``).
    fn, args
        The oracle function and its native arguments (encoded by :func:`encode`).
    ours
        Computes our typed answer, given the crate's raw answer (most cases ignore it; the
        interop cases decode what the crate produced).
    tol
        Float tolerance.
    deliberate
        When set, a *documented* deliberate difference: the check must disagree, and the text
        says where it is documented. A deliberate case that agrees fails, so the list stays true.
    """

    family: str
    fn: str
    args: dict[str, Any]
    ours: Callable[[Any], Any]
    tol: Tol = EXACT
    deliberate: str | None = None
    label: str = ""
    id: str = field(default="")


@dataclass
class Outcome:
    """The result of one check."""

    case: Case
    problems: list[str]

    @property
    def agrees(self) -> bool:
        return not self.problems


def evaluate(cases: list[Case], answers: list[dict[str, Any]]) -> list[Outcome]:
    """Compare every case with the crate's answer of the same id."""
    by_id = {a["id"]: a for a in answers}
    outcomes = []
    for case in cases:
        answer = by_id.get(case.id)
        if answer is None or "panic" in answer:
            detail = "no answer" if answer is None else f"crate panicked: {answer['panic']}"
            outcomes.append(Outcome(case, [detail]))
            continue
        raw = answer.get("ok") if "ok" in answer else None
        ours = attempt(lambda case=case, raw=raw: case.ours(raw))
        if isinstance(ours, Ok) and isinstance(ours.value, Ok | Err):
            ours = ours.value
        outcomes.append(Outcome(case, compare(ours, answer, case.tol)))
    return outcomes
