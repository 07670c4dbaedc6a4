"""Start, stop and clean up local CometBFT validators and their ABCI apps on loopback.

A :class:`Validator` is one member's pair of processes: its ABCI app
(``python -m gradfed_ipfs.cometbft.abci`` on a Unix socket in the validator's home) and its
``cometbft node``. A :class:`CometNetwork` makes ``n`` of them with one genesis naming all ``n``
as validators, each dialling only the others (``persistent_peers``; PEX off, no seeds), P2P and
RPC on free 127.0.0.1 ports. Readiness is an answer to ``/status``, polled against a deadline.
Processes are stopped by their own PID, temporary homes are removed, and an ``atexit`` hook
stops whatever a crashed caller left running (:func:`live_validator_pids` lists them).
:meth:`CometNetwork.add_node` starts a joining member's full node on the same chain (it
block-syncs, then becomes a validator through the app's validator update).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Self

from .. import _reaper
from .._ports import free_port
from ..errors import CometRpcError, CometStartError
from .binary import find_cometbft_binary
from .config import (
    DEFAULT_TIMING,
    BlockTiming,
    GenesisValidator,
    edit_config,
    loopback_settings,
    write_genesis,
)
from .rpc import comet_call

__all__ = ["CometNetwork", "Validator", "live_validator_pids"]

logger = logging.getLogger("gradfed_ipfs.cometbft")

_STOP_GRACE: Final = 10.0
_live: dict[int, subprocess.Popen[bytes]] = {}
_live_lock = threading.Lock()


def live_validator_pids() -> list[int]:
    """Return the PIDs of validator nodes and ABCI apps this process started and has not stopped."""
    with _live_lock:
        return [pid for pid, process in _live.items() if process.poll() is None]


@atexit.register
def _kill_all_at_exit() -> None:  # pragma: no cover - safety net for crashed callers
    with _live_lock:
        processes = list(_live.values())
    for process in processes:
        with contextlib.suppress(Exception):
            process.kill()
            process.wait(timeout=5)


def _poll(ready: Callable[[], str | None], deadline: float, what: str) -> None:
    """Call ``ready`` (``None`` when ready, else why not) until it is or ``deadline`` passes."""
    delay, why = 0.02, "not tried"
    while time.monotonic() < deadline:
        reason = ready()
        if reason is None:
            return
        why = reason
        # Readiness is an event we cannot subscribe to: poll with a short, growing interval.
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
    raise CometStartError(f"{what} not ready in time ({why})")


class _Process:
    """One child process (node or app): started in its own session, logged, stopped by PID."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.argv = argv
        # The home is the working directory: ``python -m`` puts it first on sys.path, and the
        # caller's directory (a source checkout of another version, say) must not shadow the
        # installed package.
        self.cwd = log_path.parent
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.cwd,
            start_new_session=True,
        )
        with _live_lock:
            _live[self.popen.pid] = self.popen
        _reaper.watch(self.popen.pid)

    def exited(self) -> str | None:
        """Why the process is gone (with its log's tail), or ``None`` while it runs."""
        if self.popen is None or self.popen.poll() is None:
            return None
        return f"exited with code {self.popen.returncode}\n{self.tail()}"

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return f"--- {self.log_path.name} (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self, *, kill: bool = False) -> None:
        process = self.popen
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                process.wait(timeout=_STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=_STOP_GRACE)
        if process is not None:
            with _live_lock:
                _live.pop(process.pid, None)
            _reaper.forget(process.pid)
        self.popen = None
        if self._log is not None:
            self._log.close()
            self._log = None


class Validator:
    """One member's CometBFT node and ABCI app, with their home directory.

    Made by :class:`CometNetwork` (which writes the shared genesis and the peer list); use
    :meth:`start`, :meth:`stop`, :meth:`kill` and :meth:`restart` for one member's faults.

    Parameters
    ----------
    home
        The validator's home (``cometbft init`` runs there if it has no config yet).
    binary
        The CometBFT binary.
    moniker
        Its name in logs and ``/status``.
    start_timeout
        Seconds to wait for the app's socket and then for the node's ``/status``.
    """

    def __init__(
        self, home: Path, *, binary: Path, moniker: str, start_timeout: float = 60.0
    ) -> None:
        self.home = home
        self.binary = binary
        self.moniker = moniker
        self.start_timeout = start_timeout
        self.p2p_port = free_port()
        self.rpc_port = free_port()
        self.node_id = ""
        self._app = _Process(
            [sys.executable, "-m", "gradfed_ipfs.cometbft.abci", "--socket", str(self.socket_path)],
            home / "app.log",
        )
        self._node = _Process(
            [str(binary), "node", "--home", str(home)],
            home / "node.log",
        )

    # ------------------------------------------------------------------ identity and set-up

    @property
    def socket_path(self) -> Path:
        """The ABCI app's Unix socket."""
        return self.home / "app.sock"

    @property
    def rpc_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the node's RPC."""
        return f"http://127.0.0.1:{self.rpc_port}"

    @property
    def p2p_address(self) -> str:
        """``node_id@127.0.0.1:port``, as other validators name it in ``persistent_peers``."""
        return f"{self.node_id}@127.0.0.1:{self.p2p_port}"

    @property
    def pid(self) -> int | None:
        """The node's process ID while it runs."""
        return self._node.popen.pid if self._node.running() and self._node.popen else None

    @property
    def app_pid(self) -> int | None:
        """The ABCI app's process ID while it runs."""
        return self._app.popen.pid if self._app.running() and self._app.popen else None

    def init(self) -> GenesisValidator:
        """Run ``cometbft init`` (keys, default config); return this validator's genesis entry."""
        self.home.mkdir(parents=True, exist_ok=True)
        if not (self.home / "config" / "config.toml").exists():
            self._cometbft("init")
        self.node_id = self._cometbft("show-node-id").strip()
        return GenesisValidator.of_home(self.home, name=self.moniker)

    def configure(self, peers: list[str], timing: BlockTiming) -> None:
        """Write this validator's ``config.toml``: loopback ports, ``peers`` only, ``timing``."""
        entries = loopback_settings(
            moniker=self.moniker,
            proxy_app=f"unix://{self.socket_path}",
            p2p_port=self.p2p_port,
            rpc_port=self.rpc_port,
            persistent_peers=peers,
        )
        edit_config(self.home / "config" / "config.toml", {**entries, **timing.settings()})

    # ------------------------------------------------------------------ lifecycle

    def is_running(self) -> bool:
        """Whether the node process is alive."""
        return self._node.running()

    def start(self) -> Self:
        """Start the app (unless running) and the node, and wait until ``/status`` answers.

        Raises
        ------
        CometStartError
            If the app's socket or the node's RPC is not up within ``start_timeout`` seconds,
            or either exits meanwhile; the message ends with its log's tail.
        """
        deadline = time.monotonic() + self.start_timeout
        try:
            if not self._app.running():
                with contextlib.suppress(FileNotFoundError):
                    self.socket_path.unlink()
                self._app.start()
                _poll(self._app_ready, deadline, f"ABCI app of {self.moniker}")
            if not self._node.running():
                self._node.start()
                _poll(self._node_ready, deadline, f"CometBFT node {self.moniker}")
        except BaseException:
            self.stop(remove_home=False)
            raise
        logger.info(
            "validator %s pid=%s app=%s rpc=%s", self.moniker, self.pid, self.app_pid, self.rpc_url
        )
        return self

    def stop(self, *, remove_home: bool = False) -> None:
        """Stop the node, then its app, by PID (SIGTERM, SIGKILL after 10 s)."""
        self._node.stop()
        self._app.stop()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        if remove_home:
            shutil.rmtree(self.home, ignore_errors=True)

    def kill(self, *, app: bool = True) -> None:
        """SIGKILL the node (and, with ``app``, its app): a crash; the home stays for restart."""
        self._node.stop(kill=True)
        if app:
            self._app.stop(kill=True)

    def restart(self) -> Self:
        """Stop (keeping the home) and start again; a fresh app is replayed from the blocks."""
        self.stop()
        return self.start()

    # ------------------------------------------------------------------ RPC

    def rpc(self, method: str, timeout: float = 10.0, **params: Any) -> Any:
        """One blocking JSON-RPC call to this node (see :func:`comet_call`)."""
        return comet_call(self.rpc_url, method, params, timeout=timeout)

    def latest(self) -> tuple[int, str]:
        """``(latest block height, its app hash in upper-case hex)`` from ``/status``."""
        sync = (self.rpc("status", timeout=5.0) or {}).get("sync_info") or {}
        return int(sync.get("latest_block_height", 0)), str(sync.get("latest_app_hash", ""))

    # ------------------------------------------------------------------ internals

    def _cometbft(self, *args: str) -> str:
        result = subprocess.run(
            [str(self.binary), *args, "--home", str(self.home)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if result.returncode != 0:
            raise CometStartError(
                f"cometbft {' '.join(args)} failed (exit {result.returncode}): "
                f"{result.stderr.strip()[-2000:]}"
            )
        return result.stdout

    def _app_ready(self) -> str | None:
        exited = self._app.exited()
        if exited is not None:
            raise CometStartError(f"ABCI app of {self.moniker} {exited}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket_path))
            except OSError as exc:
                return str(exc)
        return None

    def _node_ready(self) -> str | None:
        exited = self._node.exited()
        if exited is not None:
            raise CometStartError(f"CometBFT node {self.moniker} {exited}")
        try:
            self.rpc("status", timeout=2.0)
        except CometRpcError as exc:
            return str(exc)
        return None


class CometNetwork:
    """``n`` validators on loopback with one genesis, each peered with all others only.

    Parameters
    ----------
    n
        Number of validators (≥ 1; 3f + 1 tolerates f faults).
    binary
        The CometBFT binary; found (or built) by :func:`find_cometbft_binary` when ``None``.
    timing
        Block timing (see :class:`BlockTiming` for the default and why).
    chain_id
        The chain's name; a random ``gradfed-…`` one when ``None``.
    start_timeout
        Seconds each validator gets to become ready.
    app_state
        The genesis ``app_state`` (JSON): which state machine the apps run and its settings
        (:meth:`~gradfed_ipfs.cometbft.abci.RoundsGenesis.to_dict`); none: a statement log.
    """

    def __init__(
        self,
        n: int,
        *,
        binary: str | Path | None = None,
        timing: BlockTiming = DEFAULT_TIMING,
        chain_id: str | None = None,
        start_timeout: float = 60.0,
        app_state: Mapping[str, Any] | None = None,
    ) -> None:
        if n < 1:
            raise ValueError(f"a network needs at least one validator, got {n}")
        self.n = n
        self.binary = Path(binary) if binary is not None else find_cometbft_binary()
        self.timing = timing
        self.chain_id = chain_id or f"gradfed-{secrets.token_hex(4)}"
        self.start_timeout = start_timeout
        self.app_state = app_state
        self.root: Path | None = None
        self.validators: list[Validator] = []
        self._entries: list[GenesisValidator] = []

    def start(self) -> Self:
        """Initialise every home, write the genesis and configs, start all; all or nothing."""
        self.prepare()
        return self.launch()

    def prepare(self) -> list[GenesisValidator]:
        """Initialise every home (keys included); return the validators' genesis entries.

        Between :meth:`prepare` and :meth:`launch` the members can sign statements that bind
        these keys to their identities (:func:`~gradfed_ipfs.cometbft.abci.validator_binding`, at
        round 0)
        and put them into the genesis ``app_state``.
        """
        self.root = Path(tempfile.mkdtemp(prefix="gradfed-comet-"))
        self.validators = [
            Validator(
                self.root / f"v{i}",
                binary=self.binary,
                moniker=f"validator-{i}",
                start_timeout=self.start_timeout,
            )
            for i in range(self.n)
        ]
        try:
            self._entries = [v.init() for v in self.validators]
        except BaseException:
            self.stop()
            raise
        return list(self._entries)

    def launch(self, app_state: Mapping[str, Any] | None = None) -> Self:
        """Write the genesis (``app_state``, default the constructor's) and configs; start all.

        After :meth:`prepare`; all or nothing (every home is removed on failure).
        """
        try:
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            homes = [v.home for v in self.validators]
            state = self.app_state if app_state is None else app_state
            write_genesis(
                homes, self._entries, chain_id=self.chain_id, genesis_time=now, app_state=state
            )
            for v in self.validators:
                v.configure([o.p2p_address for o in self.validators if o is not v], self.timing)
            with ThreadPoolExecutor(max_workers=min(self.n, 8)) as pool:
                list(pool.map(Validator.start, self.validators))
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, moniker: str | None = None) -> Validator:
        """Start a full node of this chain (a joining member's): not a validator until updated.

        Its home gets the chain's genesis and dials the running validators only (loopback, PEX
        off, no seeds); it block-syncs from them, and becomes a validator once the app's
        validator update (its member's admission, key bound by a signed ``comet/validator``
        statement) takes effect. Stopped with the network.

        Raises
        ------
        CometStartError
            If the network has not been launched, or the node does not start.
        """
        if self.root is None or not self.validators:
            raise CometStartError("add_node needs a launched network")
        index = len(self.validators)
        node = Validator(
            self.root / f"v{index}",
            binary=self.binary,
            moniker=moniker or f"node-{index}",
            start_timeout=self.start_timeout,
        )
        node.init()
        genesis = self.validators[0].home / "config" / "genesis.json"
        shutil.copyfile(genesis, node.home / "config" / "genesis.json")
        node.configure([v.p2p_address for v in self.validators if v.is_running()], self.timing)
        self.validators.append(node)
        return node.start()

    def stop(self) -> None:
        """Stop every validator and remove all homes."""
        for validator in self.validators:
            validator.stop()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def wait_for_height(
        self, height: int, *, timeout: float = 30.0, among: list[Validator] | None = None
    ) -> None:
        """Wait until every validator of ``among`` (default: the running ones) is at ``height``.

        Raises
        ------
        CometStartError
            If one is still below after ``timeout`` seconds.
        """
        group = among if among is not None else [v for v in self.validators if v.is_running()]

        def reached() -> str | None:
            for validator in group:
                try:
                    at, _ = validator.latest()
                except CometRpcError as exc:
                    return f"{validator.moniker}: {exc}"
                if at < height:
                    return f"{validator.moniker} at height {at}"
            return None

        _poll(reached, time.monotonic() + timeout, f"height {height}")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __iter__(self) -> Iterator[Validator]:
        return iter(self.validators)

    def __len__(self) -> int:
        return len(self.validators)

    def __getitem__(self, index: int) -> Validator:
        return self.validators[index]
