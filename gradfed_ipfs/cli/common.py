"""What every CLI subcommand shares: consoles, daemon selection, option grammars, file I/O.

CLI code only: nothing in the library imports this package.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from .._types import FloatArray
from ..adapters.numpy import as_float32
from ..errors import (
    BlockNotFound,
    BlockTimeout,
    DecodeError,
    GradfedError,
    InvalidGradient,
    KuboRpcError,
)
from ..formats.arrow import decode_gradient, store_gradient_as_arrow
from ..kubo.rpc import KuboRpc
from ..tensor.aggregation import (
    AggregationStrategy,
    Krum,
    Mean,
    Median,
    MultiKrum,
    SampleWeightedMean,
    Sum,
    TrimmedMean,
)
from ..tensor.codecs import Codec, Int4, Int8, TopK, TopKInt8
from .managed import running_node_api

__all__ = [
    "API_ENV",
    "HOME_ENV",
    "UsageError",
    "api_of",
    "async_handler",
    "console",
    "default_node_dir",
    "err_console",
    "explain_missing_block",
    "human_bytes",
    "parse_codec",
    "parse_method",
    "progress_bar",
    "read_gradient_file",
    "resolve_api",
    "run",
    "shape_text",
    "waiting",
    "write_gradient_file",
]

API_ENV: Final = "GRADFED_IPFS_API"
"""Environment variable naming the Kubo RPC URL of an external daemon."""
HOME_ENV: Final = "GRADFED_IPFS_HOME"
"""Environment variable overriding the managed node's directory."""

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False)

T = TypeVar("T")
NPY_MAGIC: Final = b"\x93NUMPY"
"""The first bytes of every ``.npy`` file."""


class UsageError(GradfedError):
    """A command-line mistake the user can fix (bad option value, missing file); exit 1."""


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine to completion (every subcommand is one ``asyncio.run``)."""
    return asyncio.run(coroutine)


def positive_float(text: str) -> float:
    """``argparse`` type: a number > 0 (seconds, rates)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def api_of(args: argparse.Namespace) -> str:
    """Return the RPC URL the parsed global options select (see :func:`resolve_api`)."""
    return resolve_api(args.api, Path(args.node_dir) if args.node_dir else default_node_dir())


def async_handler(
    command: Callable[[argparse.Namespace, str], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    """Wrap ``command(args, api_url)`` as a synchronous subcommand handler."""

    def handle(args: argparse.Namespace) -> int:
        return run(command(args, api_of(args)))

    return handle


# --------------------------------------------------------------------------- daemon selection


def default_node_dir() -> Path:
    """``$GRADFED_IPFS_HOME``, else ``$XDG_DATA_HOME/gradfed-ipfs/node`` (~/.local/share)."""
    override = os.environ.get(HOME_ENV)
    if override:
        return Path(override)
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "gradfed-ipfs" / "node"


def resolve_api(api: str | None, node_dir: Path) -> str:
    """Return the RPC URL: ``--api``, else ``$GRADFED_IPFS_API``, else the managed node's.

    Raises
    ------
    UsageError
        If none is given and no managed node runs.
    """
    if api:
        return _check_url(api)
    env = os.environ.get(API_ENV)
    if env:
        return _check_url(env)
    found = running_node_api(node_dir)
    if found is None:
        raise UsageError(
            f"no Kubo daemon selected: pass --api URL, set {API_ENV}, or run "
            "`gradfed-ipfs node start`"
        )
    return found


def _check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--api must be an http(s) URL like http://127.0.0.1:5001, got {url!r}")
    return url.rstrip("/")


async def explain_missing_block(rpc: KuboRpc, exc: BlockNotFound | BlockTimeout) -> None:
    """Add a hint to ``exc`` when the daemon has no swarm peers to fetch the block from.

    Without peers, Kubo only says "context deadline exceeded"; the usual cause is a node that
    was never connected to the one holding the block.
    """
    try:
        answer = await rpc.post_json("swarm/peers", deadline=5.0)
    except KuboRpcError:
        return
    if not (answer or {}).get("Peers"):
        message = exc.args[0] if exc.args else "block not found"
        exc.args = (
            f"{message}; this node has 0 peers; connect it with `gradfed-ipfs node connect "
            "<multiaddr|api-url>`",
        )


# --------------------------------------------------------------------------- option grammars


def parse_method(text: str) -> AggregationStrategy:
    """``fedavg``, ``mean``, ``sum``, ``median``, ``trimmed:B``, ``krum:F``, ``multikrum:F:M``."""
    name, _, arg = text.strip().lower().partition(":")
    simple: dict[str, Callable[[], AggregationStrategy]] = {
        "fedavg": SampleWeightedMean,
        "mean": Mean,
        "sum": Sum,
        "median": Median,
    }
    try:
        if name in simple and not arg:
            return simple[name]()
        if name == "trimmed":
            return TrimmedMean(beta=float(arg) if arg else 0.1)
        if name == "krum":
            return Krum(f=int(arg) if arg else 1)
        if name == "multikrum":
            f_text, _, m_text = arg.partition(":")
            return MultiKrum(f=int(f_text or 1), m=int(m_text or 1))
    except ValueError as exc:
        raise UsageError(f"bad --method {text!r}: {exc}") from None
    raise UsageError(
        f"unknown --method {text!r}; use fedavg, mean, sum, median, trimmed:BETA, krum:F "
        "or multikrum:F:M"
    )


def parse_codec(text: str | None) -> Codec | None:
    """``topk:RATIO``, ``int8``, ``int4`` or ``topk:RATIO,int8``; ``None`` for none."""
    if not text:
        return None
    ratio: float | None = None
    bits: int | None = None
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        name, _, arg = part.partition(":")
        if name == "topk":
            try:
                ratio = float(arg) if arg else 0.01
            except ValueError:
                raise UsageError(f"bad top-k ratio in --compress {text!r}") from None
        elif name in ("int8", "int4") and not arg:
            bits = 8 if name == "int8" else 4
        else:
            raise UsageError(f"unknown codec {part!r} in --compress; use topk:R, int8, int4")
    try:
        if ratio is not None:
            if bits == 4:
                raise UsageError("--compress topk:R,int4 is not supported; use topk:R,int8")
            return TopKInt8(ratio=ratio) if bits == 8 else TopK(ratio=ratio)
    except InvalidGradient as exc:
        raise UsageError(f"bad --compress {text!r}: {exc}") from None
    return Int8() if bits == 8 else Int4()


# --------------------------------------------------------------------------- files


def read_gradient_file(path: Path) -> FloatArray:
    """Read a ``.npy`` (never unpickled) or ``.arrow`` gradient as float32 in its shape.

    Raises
    ------
    UsageError
        If the file cannot be read or has another extension.
    DecodeError
        If its contents are not a numeric array / gradient block.
    """
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".arrow"):
        raise UsageError(f"{path}: expected a .npy or .arrow file")
    try:
        if suffix == ".arrow":
            return decode_gradient(path.read_bytes()).tensor()
        with path.open("rb") as handle:
            # np.load takes anything without the magic for a pickle and talks about allow_pickle
            if handle.read(len(NPY_MAGIC)) != NPY_MAGIC:
                raise DecodeError(f"{path} is not a NumPy .npy file (no \\x93NUMPY header)")
        array = np.load(path, allow_pickle=False)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # truncated, or an object array (needs pickle)
        raise DecodeError(f"{path} is not a valid .npy array: {exc}") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
        raise DecodeError(f"{path}: expected a numeric array, got dtype {array.dtype}")
    values = as_float32(array, path.name)  # refuses values too large for float32
    if array.dtype != np.float32:
        rounded = int(np.count_nonzero(values != array))
        detail = f", {rounded:,} values rounded" if rounded else ", exactly"
        err_console.print(f"note: {path.name} is {array.dtype}; converted to float32{detail}")
    if not np.isfinite(values).all():
        raise InvalidGradient(f"{path}: the array has NaN or Inf values")
    return values


def write_gradient_file(path: Path, values: FloatArray) -> None:
    """Write float32 ``values`` as ``.npy`` (``allow_pickle=False``) or a dense ``.arrow``."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            with path.open("wb") as handle:
                np.save(handle, np.asarray(values, dtype=np.float32), allow_pickle=False)
        elif suffix == ".arrow":
            path.write_bytes(store_gradient_as_arrow(values, shape=tuple(values.shape)))
        else:
            raise UsageError(f"{path}: the output must end in .npy or .arrow")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


@contextmanager
def progress_bar(description: str, *, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """Yield a ``progress(done_bytes, total_bytes)`` callback drawing a rich bar on stderr."""
    if not enabled:
        yield lambda done, total: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err_console, transient=True) as progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=max(total, 1))

        yield update


@contextmanager
def waiting(description: str, enabled: bool = True, *, after: float = 2.0) -> Iterator[None]:
    """Show a spinner on a terminal while a wait runs; elsewhere one line if it lasts ``after`` s.

    Call inside a running event loop (the notice is scheduled on it). A quick wait prints
    nothing off a terminal, so one-line error output stays one line.
    """
    if not enabled:
        yield
        return
    if err_console.is_terminal:
        with err_console.status(f"{description}…"):
            yield
        return
    notice = asyncio.get_running_loop().call_later(
        after, lambda: err_console.print(f"still {description}…", soft_wrap=True)
    )
    try:
        yield
    finally:
        notice.cancel()


def human_bytes(count: float) -> str:
    """``1536`` → ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"  # pragma: no cover


def shape_text(shape: tuple[int, ...]) -> str:
    """``(3, 4)`` → ``3x4 (12 values)``; ``()`` → ``scalar (1 value)``."""
    count = math.prod(shape)
    dims = "x".join(str(d) for d in shape) if shape else "scalar"
    return f"{dims} ({count:,} value{'' if count == 1 else 's'})"
