"""The exception hierarchy of gradfed-ipfs.

Every error the library raises on purpose derives from :class:`GradfedError`, so one
``except GradfedError`` serves users and the CLI. Each family carries an ``exit_code`` that the
CLI exits with. The tree::

    GradfedError                       root; exit_code 1
    ├── ConfigError                    a bad setting (config field, constructor argument); exit 11
    │   ├── SecAggSettingError         a SecAgg encoding or timeout (also SecureAggregationError)
    │   └── FederationFileError        a federation file that is missing or invalid
    ├── GradientError                  the seed's ``GradientError`` enum (seed-api §3); exit 3
    │   ├── ShapeMismatch              lengths or shapes disagree: the ONE "lengths differ" base
    │   │   └── DimensionMismatch      the backward-pass spelling of the same condition
    │   ├── ChecksumFailed             a GradientDelta's checksum does not match its content
    │   ├── InvalidCompressionRatio    k / keep-ratio outside (0, 1]
    │   ├── EmptyGradientSet           an aggregation was given no gradients (also EmptyError)
    │   │   └── EmptyGradients         the backward-pass spelling of the same condition
    │   ├── IncompatibleDtype          a tensor of an unsupported dtype
    │   ├── OutlierDetected            a z-score above the threshold
    │   ├── InvalidGradient            catch-all for gradient values: NaN/Inf, bad sizes
    │   ├── NodeNotFound               a backward-pass step id is unknown
    │   └── PeerNotFound               a peer is not registered in a step
    ├── DecodeError                    untrusted bytes that do not decode; exit 4
    │   ├── MalformedArrow             not a gradient Arrow IPC file
    │   ├── MalformedManifest          not a chunk manifest / IPLD record we understand
    │   ├── MalformedPacked            not a packed (compressed) chunk of the session's encoding
    │   ├── MalformedAnnouncement      a pubsub announcement that does not parse
    │   ├── NotARoundRecord            a CID given as a round record names another block
    │   ├── BadSignature               a signed statement whose signature or author fails
    │   └── ArrowBlockError            the seed's GARW block errors (§8.6)
    │       ├── EmptyInput             zero bytes / no blocks (also EmptyError)
    │       ├── ArrowBlockShapeMismatch shape and values disagree (also ShapeMismatch)
    │       ├── InvalidMagic           the first four bytes are not ``GARW``
    │       └── TruncatedData          fewer bytes than the header promises
    ├── BlockStoreError                storage failures; exit 5
    │   ├── BlockNotFound              no block with that CID (Kubo: not in the local repo)
    │   ├── BlockTimeout               a block did not arrive in time: slow or missing
    │   ├── BlockCorrupt               bytes whose hash is not their CID
    │   ├── BlockTooLarge              a block over the store's size limit, refused before sending
    │   ├── StoreUnavailable           the daemon cannot be reached (after retries)
    │   │   └── StoreTimeout           an answer not complete within the call's deadline
    │   └── StoreRequestError          the daemon answered with an error
    │       └── StoreResponseTooLarge  an answer over its endpoint's size cap
    ├── KuboError                      managing Kubo daemons; exit 6
    │   ├── KuboNotInstalled           no Kubo binary and it could not be built
    │   ├── KuboStartError             a daemon failed to start (message has its log tail)
    │   └── KuboRpcError               a control-plane RPC call (id, swarm/*) failed
    ├── CometError                     managing CometBFT validators; exit 12
    │   ├── CometNotInstalled          no CometBFT binary and it could not be built
    │   ├── CometStartError            a validator (or its ABCI app) failed to start
    │   ├── CometRpcError              a CometBFT RPC call (status, broadcast_tx_*) failed
    │   └── FinalityNotProven          a commit bundle does not prove a record final
    │       ├── BadCommitSignature     a precommit signature does not verify
    │       ├── InsufficientVotingPower the valid precommits hold at most 2/3 of the power
    │       ├── AppHashMismatch        the state summary is not the header's app hash
    │       └── NotFinal               the app hash does not commit that record as final
    ├── FederatedError                 the seed's ``FederatedError`` (seed-api §6.1); exit 7
    │   ├── NoContributions            a round has nothing to aggregate (also EmptyError)
    │   ├── FederatedDimensionMismatch contributions of different lengths (also ShapeMismatch)
    │   ├── ClientNotFound             a contribution from a client not in the round
    │   ├── NotStarted                 operating on a round that was not started
    │   ├── PrivacyBudgetExhausted     a DP operation would exceed the (ε, δ) budget
    │   ├── InsufficientPeers          a round's deadline passed with fewer than min_peers in
    │   │   └── QuorumNotReached       an agreed round adopted no roster of min_peers in time
    │   ├── RoundMismatch              peers announced a different result CID for a round
    │   ├── GenesisMismatch            a model or record of another session's genesis
    │   ├── RoundVerificationFailed    an agreed round record does not re-verify
    │   │   └── NoVerifiableHead       no announced head could be adopted (resync)
    │   ├── ChainDeadlineExceeded      a record chain's walk (or re-check) passed its deadline
    │   └── SecureAggregationError     the masked-sum protocol cannot proceed
    │       ├── SecAggPeerRejected     one party's SecAgg message is unusable (names the party)
    │       └── UnmaskRefused          an honest client refuses an unmasking request
    ├── CoordinationError              the seed's ``CoordinationError`` (§8.4); exit 8
    │   ├── PassNotFound               unknown backward pass id
    │   └── PassAlreadyTerminal        the pass is Complete or Failed
    ├── ComputationGraphError          the seed's ``ComputationGraphError`` (§7.2); exit 9
    │   ├── GraphNodeNotFound          no node with that id
    │   ├── CircularDependency         the graph has a cycle
    │   ├── GraphSerializationError    a node or graph does not (de)serialize
    │   └── GraphIoError               reading or writing a graph/checkpoint failed
    ├── PubsubError                    IPFS pubsub (announcements); exit 10
    │   ├── PubsubUnavailable          the daemon's pubsub API cannot be reached
    │   │   └── PubsubTimeout          an answer not complete within the call's deadline
    │   └── PubsubRequestError         the daemon refused a pubsub call (e.g. pubsub disabled)
    │       └── PubsubResponseTooLarge an answer over its endpoint's size cap
    └── EmptyError                     mixin: "there is nothing" (exit code from the other base)
        (EmptyGradientSet, EmptyGradients, EmptyInput, NoContributions)

Mixins cut across the families: every ``*Timeout`` is an :class:`RpcTimeout` (and a
``TimeoutError``), every ``*ResponseTooLarge`` a :class:`ResponseTooLarge`. A class that names
two bases (``FederatedDimensionMismatch(FederatedError, ShapeMismatch)``) takes its exit code
from the first, its family; ``except ShapeMismatch`` catches every "lengths differ" and
``except EmptyError`` every "nothing there". ``ConfigError``, ``ShapeMismatch``, ``EmptyError``
and ``DecodeError`` subclass ``ValueError``, so generic handlers still work.

Store errors carry context as attributes (``api_url``, ``endpoint``, ``cid``), set by the one
boundary that talks to Kubo, so a message always names the CID and the daemon.

The seed's variants (``GradientError``, ``FederatedError``, ``CoordinationError``,
``ArrowBlockError`` families) keep the crate's ``Display`` text, floats printed the Rust way
(``NaN``, ``10``, ``1.3333334``; see :mod:`gradfed_ipfs._fmt`). Some add detail after it,
separated by ``": "`` (the lengths behind a ``DimensionMismatch``, the offsets behind a
``TruncatedData``); ``tests/seed/test_crate_oracle.py`` holds them to that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ._fmt import rust_display

__all__ = [
    "AppHashMismatch",
    "ArrowBlockError",
    "ArrowBlockShapeMismatch",
    "BadCommitSignature",
    "BadSignature",
    "BlockCorrupt",
    "BlockNotFound",
    "BlockStoreError",
    "BlockTimeout",
    "BlockTooLarge",
    "ChainDeadlineExceeded",
    "ChecksumFailed",
    "CircularDependency",
    "ClientNotFound",
    "CometError",
    "CometNotInstalled",
    "CometRpcError",
    "CometStartError",
    "ComputationGraphError",
    "ConfigError",
    "CoordinationError",
    "DecodeError",
    "DimensionMismatch",
    "EmptyError",
    "EmptyGradientSet",
    "EmptyGradients",
    "EmptyInput",
    "FederatedDimensionMismatch",
    "FederatedError",
    "FederationFileError",
    "FinalityNotProven",
    "GenesisMismatch",
    "GradfedError",
    "GradientError",
    "GraphIoError",
    "GraphNodeNotFound",
    "GraphSerializationError",
    "IncompatibleDtype",
    "InsufficientPeers",
    "InsufficientVotingPower",
    "InvalidCompressionRatio",
    "InvalidGradient",
    "InvalidMagic",
    "KuboError",
    "KuboNotInstalled",
    "KuboRpcError",
    "KuboStartError",
    "MalformedAnnouncement",
    "MalformedArrow",
    "MalformedManifest",
    "MalformedPacked",
    "NoContributions",
    "NoVerifiableHead",
    "NodeNotFound",
    "NotARoundRecord",
    "NotFinal",
    "NotStarted",
    "OutlierDetected",
    "PassAlreadyTerminal",
    "PassNotFound",
    "PeerNotFound",
    "PrivacyBudgetExhausted",
    "PubsubError",
    "PubsubRequestError",
    "PubsubResponseTooLarge",
    "PubsubTimeout",
    "PubsubUnavailable",
    "QuorumNotReached",
    "ResponseTooLarge",
    "RoundMismatch",
    "RoundVerificationFailed",
    "RpcTimeout",
    "SecAggPeerRejected",
    "SecAggSettingError",
    "SecureAggregationError",
    "ShapeMismatch",
    "StoreRequestError",
    "StoreResponseTooLarge",
    "StoreTimeout",
    "StoreUnavailable",
    "TruncatedData",
    "UnmaskRefused",
]


class GradfedError(Exception):
    """Root of every error gradfed-ipfs raises on purpose."""

    exit_code: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every family must say how the CLI exits; inheriting one is fine, zero is not.
        if not isinstance(cls.__dict__.get("exit_code", cls.exit_code), int) or cls.exit_code == 0:
            raise TypeError(f"{cls.__name__} needs a non-zero integer exit_code")


# --------------------------------------------------------------------------- settings and mixins


class ConfigError(GradfedError, ValueError):
    """A setting is invalid (``min_peers must be >= 0``); raised where it is given."""

    exit_code: ClassVar[int] = 11

    def __init__(self, message: str) -> None:
        self.reason = message
        super().__init__(f"Invalid setting: {message}")


class FederationFileError(ConfigError):
    """A federation file that cannot be read, is not TOML, or has an invalid field."""


class EmptyError(GradfedError, ValueError):
    """Mixin base of every "there is nothing" error; each subclass's family sets the exit code."""


# --------------------------------------------------------------------------- gradient (seed §3)


class GradientError(GradfedError):
    """An error from gradient math: the seed's ``GradientError`` enum."""

    exit_code: ClassVar[int] = 3


class ShapeMismatch(GradientError, ValueError):
    """Two gradients, or a gradient and its declared shape, disagree.

    Parameters
    ----------
    expected, actual
        The shapes (or ``[length]``) that were compared.
    """

    def __init__(self, expected: Sequence[int], actual: Sequence[int]) -> None:
        self.expected = list(expected)
        self.actual = list(actual)
        super().__init__(f"Shape mismatch: expected {self.expected}, got {self.actual}")


class DimensionMismatch(ShapeMismatch):
    """Gradients from different peers have different lengths (backward-pass spelling)."""

    def __init__(
        self, expected: Sequence[int] | None = None, actual: Sequence[int] | None = None
    ) -> None:
        ShapeMismatch.__init__(self, expected or [], actual or [])
        detail = f": expected {self.expected}, got {self.actual}" if expected is not None else ""
        self.args = (f"Gradient dimension mismatch between peers{detail}",)


class ChecksumFailed(GradientError, ValueError):
    """A ``GradientDelta``'s stored checksum does not match its content."""

    def __init__(self, message: str = "Checksum verification failed") -> None:
        super().__init__(message)


class InvalidCompressionRatio(GradientError, ValueError):
    """A compression ratio (k/n or keep ratio) outside ``(0, 1]``; the seed holds it as ``f32``."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        super().__init__(f"Invalid compression ratio: {rust_display(ratio, 32)}")


class EmptyGradientSet(GradientError, EmptyError):
    """An aggregation was given no gradients."""

    def __init__(self, message: str = "Empty gradient set") -> None:
        super().__init__(message)


class EmptyGradients(EmptyGradientSet):
    """No gradients were provided (backward-pass spelling of :class:`EmptyGradientSet`)."""

    def __init__(self, message: str = "Empty gradients provided") -> None:
        super().__init__(message)


class IncompatibleDtype(GradientError, TypeError):
    """A tensor has a dtype this operation does not support."""

    def __init__(self, dtype: object) -> None:
        self.dtype = dtype
        super().__init__(f"Incompatible dtype: {dtype}")


class OutlierDetected(GradientError, ValueError):
    """A value's z-score exceeds the threshold (the first such index and its ``f32`` value)."""

    def __init__(self, index: int, value: float) -> None:
        self.index = index
        self.value = value
        super().__init__(f"Outlier detected at index {index}: value {rust_display(value, 32)}")


class InvalidGradient(GradientError, ValueError):
    """A gradient or a parameter is invalid (NaN/Inf, bad size, bad argument)."""

    def __init__(self, message: str) -> None:
        self.reason = message
        super().__init__(f"Invalid gradient: {message}")


class NodeNotFound(GradientError, KeyError):
    """A node id is not in the backward-pass schedule."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        super().__init__(f"Node not found in backward pass schedule: {node_id}")

    def __str__(self) -> str:
        return str(self.args[0])


class PeerNotFound(GradientError, KeyError):
    """A peer is not registered in a backward-pass step."""

    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        super().__init__(f"Peer not found in step: {peer_id}")

    def __str__(self) -> str:
        return str(self.args[0])


# --------------------------------------------------------------------------- untrusted bytes


class DecodeError(GradfedError, ValueError):
    """Untrusted bytes (a block, a record, a message) that do not decode."""

    exit_code: ClassVar[int] = 4


class MalformedArrow(DecodeError):
    """Bytes that are not a gradient Arrow IPC file of a layout we understand."""


class MalformedManifest(DecodeError):
    """A dag-cbor record (chunk manifest, round record, graph node) of the wrong form."""


class MalformedPacked(DecodeError):
    """A packed contribution chunk (:mod:`~gradfed_ipfs.formats.packed`) that does not decode."""


class MalformedAnnouncement(DecodeError):
    """A pubsub announcement that is not valid for this session (see its message)."""


class NotARoundRecord(DecodeError):
    """A CID given as a round record names something else (a gradient, a roster, ...)."""


class BadSignature(DecodeError):
    """A signed statement whose signature or author (not an Ed25519 peer ID) fails its check."""


# --------------------------------------------------------------------------- RPC limits


class RpcTimeout(TimeoutError):
    """Mixin: an RPC answer did not complete within the call's total deadline.

    Attributes
    ----------
    received
        Bytes of the answer that had arrived when the deadline passed.
    deadline
        The call's total deadline, in seconds.
    """

    received: int = 0
    deadline: float = 0.0


class ResponseTooLarge(ValueError):
    """Mixin: an RPC answer exceeded its endpoint's size cap (nothing beyond it was kept).

    Attributes
    ----------
    rpc_endpoint
        The endpoint whose answer was too large, e.g. ``block/get``.
    cap
        The endpoint's cap, in bytes.
    """

    rpc_endpoint: str = ""
    cap: int = 0


# --------------------------------------------------------------------------- block stores


class BlockStoreError(GradfedError):
    """A block store failed. ``api_url``, ``endpoint`` and ``cid`` say where, when known."""

    exit_code: ClassVar[int] = 5

    def __init__(
        self,
        message: str,
        *,
        cid: object | None = None,
        api_url: str | None = None,
        endpoint: str | None = None,
    ) -> None:
        self.cid = cid
        self.api_url = api_url
        self.endpoint = endpoint
        super().__init__(message)

    def __str__(self) -> str:
        message = str(self.args[0]) if self.args else ""
        where = []
        if self.cid is not None and str(self.cid) not in message:
            where.append(f"cid={self.cid}")
        if self.endpoint:
            where.append(f"endpoint={self.endpoint}")
        if self.api_url:
            where.append(f"api={self.api_url}")
        return f"{message} ({', '.join(where)})" if where else message


class BlockNotFound(BlockStoreError, KeyError):
    """No block with this CID could be found (locally, or via the network within the timeout)."""


class BlockTimeout(BlockStoreError, RpcTimeout):
    """A block did not arrive within its timeout: still on its way, or nowhere.

    Kubo cannot tell a slow block from a missing one (both end in "context deadline
    exceeded"), so this is never :class:`BlockNotFound`: a fetch retries it while other blocks
    of the same gradient keep arriving (slow is not missing).

    Attributes
    ----------
    received
        Bytes of the gradient (its other blocks) that had arrived by then.
    deadline
        The block's timeout, in seconds.
    peer
        The peer whose gradient it belongs to, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        cid: object | None = None,
        received: int = 0,
        deadline: float = 0.0,
        peer: str | None = None,
    ) -> None:
        super().__init__(message, cid=cid)
        self.received = received
        self.deadline = deadline
        self.peer = peer


class BlockCorrupt(BlockStoreError, ValueError):
    """The bytes returned for a CID do not hash to that CID."""


class BlockTooLarge(BlockStoreError, ValueError):
    """A block exceeds the store's size limit; it was refused before anything was sent."""


class StoreUnavailable(BlockStoreError, ConnectionError):
    """The store (a Kubo daemon) cannot be reached, after bounded retries."""


class StoreRequestError(BlockStoreError):
    """The daemon answered a request with an error (status or an NDJSON error line)."""


class StoreTimeout(StoreUnavailable, RpcTimeout):
    """The daemon's answer did not complete within the call's total deadline."""


class StoreResponseTooLarge(StoreRequestError, ResponseTooLarge):
    """The daemon's answer exceeded the endpoint's size cap; reading stopped there."""


# --------------------------------------------------------------------------- Kubo daemons


class KuboError(GradfedError):
    """Managing a local Kubo daemon failed."""

    exit_code: ClassVar[int] = 6


class KuboNotInstalled(KuboError, FileNotFoundError):
    """No Kubo binary was found and ``scripts/install-kubo`` could not build one."""


class KuboStartError(KuboError, RuntimeError):
    """A Kubo daemon did not become ready; the message ends with the tail of its log."""


class KuboRpcError(KuboError):
    """A control-plane RPC call (``id``, ``swarm/connect``, ``swarm/peers``) failed.

    Parameters
    ----------
    message
        What failed.
    api_url
        The daemon's RPC URL, when known.
    """

    def __init__(self, message: str, *, api_url: str | None = None) -> None:
        self.api_url = api_url
        super().__init__(message)


# --------------------------------------------------------------------------- CometBFT validators


class CometError(GradfedError):
    """Managing local CometBFT validators (or their ABCI applications) failed."""

    exit_code: ClassVar[int] = 12


class CometNotInstalled(CometError, FileNotFoundError):
    """No CometBFT binary was found and ``scripts/install-cometbft`` could not build one."""


class CometStartError(CometError, RuntimeError):
    """A validator or its ABCI app did not become ready; the message ends with its log tail."""


class CometRpcError(CometError):
    """A CometBFT RPC call failed: unreachable, refused, too large, or an error answer.

    Parameters
    ----------
    message
        What failed.
    rpc_url
        The validator's RPC URL, when known.
    """

    def __init__(self, message: str, *, rpc_url: str | None = None) -> None:
        self.rpc_url = rpc_url
        super().__init__(message)


class FinalityNotProven(CometError):
    """A commit bundle does not prove a record final: malformed, another chain or validator set.

    The subclasses name the step that failed; every one means "not proven", never "proven
    false".
    """


class BadCommitSignature(FinalityNotProven):
    """A commit's precommit signature does not verify under its validator's key."""


class InsufficientVotingPower(FinalityNotProven):
    """The commit's valid precommits for the block hold at most 2/3 of the voting power."""


class AppHashMismatch(FinalityNotProven):
    """The bundle's state summary does not hash to the signed header's app hash."""


class NotFinal(FinalityNotProven):
    """The signed app hash does not commit this record (of this round) as final."""


# --------------------------------------------------------------------------- federated (seed §6)


class FederatedError(GradfedError):
    """An error of the federated protocol: the seed's ``FederatedError``."""

    exit_code: ClassVar[int] = 7


class NoContributions(FederatedError, EmptyError):
    """A round has no contributions to aggregate."""

    def __init__(self, message: str = "No contributions available to aggregate") -> None:
        super().__init__(message)


class FederatedDimensionMismatch(FederatedError, ShapeMismatch):
    """Contributions of different lengths (the seed's ``FederatedError::DimensionMismatch``).

    ``expected`` and ``actual`` are ``[length]`` as for every :class:`ShapeMismatch`.
    """

    def __init__(self, expected: int, actual: int) -> None:
        ShapeMismatch.__init__(self, [expected], [actual])
        self.args = (
            f"Dimension mismatch between client gradients: expected {expected}, got {actual}",
        )


class ClientNotFound(FederatedError, KeyError):
    """A client id is not part of the round."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        super().__init__(f"Client not found: {client_id}")

    def __str__(self) -> str:
        return str(self.args[0])


class NotStarted(FederatedError, RuntimeError):
    """An operation needs a round that has been started."""

    def __init__(self, message: str = "Round not started") -> None:
        super().__init__(message)


class PrivacyBudgetExhausted(FederatedError, ValueError):
    """A differential-privacy step would exceed the (ε, δ) budget; nothing was changed."""


class InsufficientPeers(FederatedError):
    """A round's deadline passed with fewer than ``min_peers`` peer contributions in.

    Attributes
    ----------
    round_id
        The round.
    needed, got
        ``min_peers`` and the number of peer contributions taken in.
    absent
        Expected peers (sorted) that never announced, or whose contribution never arrived.
    failures
        Peer ID → why its contribution was not taken in.
    """

    def __init__(
        self,
        round_id: int,
        needed: int,
        got: int,
        absent: Sequence[str] = (),
        failures: dict[str, str] | None = None,
    ) -> None:
        self.round_id = round_id
        self.needed = needed
        self.got = got
        self.absent = sorted(absent)
        self.failures = dict(failures or {})
        super().__init__(
            f"round {round_id}: {got} of min_peers={needed} peer contributions by the deadline"
            + (f"; absent: {', '.join(self.absent)}" if self.absent else "")
        )


class QuorumNotReached(InsufficientPeers):
    """An agreed round adopted no roster of at least ``need`` contributions by its deadline.

    ``have`` counts the verified contributions (this peer's included) it held then; a caller
    that counts something else (a regional round: region records with enough votes) says what
    in ``detail``.
    """

    def __init__(
        self, round_number: int, have: int, need: int, *, detail: str | None = None
    ) -> None:
        super().__init__(round_number, need, have)
        self.round = round_number
        self.have = have
        self.need = need
        what = detail or (
            f"no roster with >= {need} contributions before the deadline (this peer saw {have})"
        )
        self.args = (f"round {round_number}: {what}",)


class RoundMismatch(FederatedError):
    """Peers announced a different result for the same round: call ``resync()``.

    ``theirs`` maps each disagreeing peer to the round-record CID it announced.
    """

    def __init__(self, round_number: int, ours: str, theirs: dict[str, str]) -> None:
        self.round = round_number
        self.ours = ours
        self.theirs = dict(theirs)
        super().__init__(
            f"round {round_number}: our record {ours} differs from {sorted(theirs)}'s; resync"
        )


class GenesisMismatch(FederatedError, ValueError):
    """A model, record or peer belongs to a session with another genesis model CID."""


class NotAdmitted(FederatedError):
    """A peer is not a member of the round (its join was not admitted, or it left)."""


class RoundVerificationFailed(FederatedError):
    """An agreed round record, its roster or its result does not re-verify."""


class NoVerifiableHead(RoundVerificationFailed):
    """No announced agreed head could be adopted, though one had its roster's majority.

    ``refused`` maps each member whose head was refused to why.
    """

    def __init__(self, refused: dict[str, str]) -> None:
        self.refused = dict(refused)
        reasons = "; ".join(f"{peer}: {why}" for peer, why in sorted(self.refused.items()))
        super().__init__(f"no announced head verifies ({reasons})")


class ChainDeadlineExceeded(FederatedError, TimeoutError):
    """A walk of a record chain (or its re-check) did not end within its deadline.

    Nothing was verified: the chain is neither accepted nor proven forged. The message says
    how far the walk got.

    Attributes
    ----------
    deadline
        The deadline, in seconds.
    records
        How many records were read (or re-checked) before it passed.
    """

    def __init__(self, message: str, *, deadline: float, records: int) -> None:
        self.deadline = deadline
        self.records = records
        super().__init__(message)


class SecureAggregationError(FederatedError):
    """The secure-aggregation protocol cannot proceed (too few participants, bad shares...)."""


class SecAggSettingError(ConfigError, SecureAggregationError):
    """A SecAgg setting is invalid (``ring_bits must be 32 or 64``); raised where it is given.

    Both a :class:`ConfigError` (a bad setting, raised where it is given) and a
    :class:`SecureAggregationError` (the protocol cannot proceed with it), so handlers of
    either keep catching it.
    """


class SecAggPeerRejected(SecureAggregationError):
    """One party's SecAgg message is malformed, undecryptable or misaddressed; ``peer`` names it.

    The round goes on without that party where the protocol allows.
    """

    def __init__(self, peer: str, reason: str) -> None:
        self.peer = peer
        self.reason = reason
        super().__init__(f"SecAgg message from {peer} rejected: {reason}")


class UnmaskRefused(SecureAggregationError):
    """An honest client refuses to unmask (both secrets of one peer, or inconsistent views).

    The request asked for the self-mask share and the mask-key share of the same peer, or the
    server showed different survivor sets to different clients.
    """


# --------------------------------------------------------------------------- coordination (§8)


class CoordinationError(GradfedError):
    """An error of the pass-level coordinator: the seed's ``CoordinationError``."""

    exit_code: ClassVar[int] = 8


class PassNotFound(CoordinationError, KeyError):
    """No backward pass with this id."""

    def __init__(self, pass_id: object) -> None:
        self.pass_id = pass_id
        super().__init__(f"Pass not found: {pass_id}")

    def __str__(self) -> str:
        return str(self.args[0])


class PassAlreadyTerminal(CoordinationError):
    """The pass is already Complete or Failed."""

    def __init__(self, pass_id: object) -> None:
        self.pass_id = pass_id
        super().__init__(f"Pass already in terminal state: {pass_id}")


class ArrowBlockError(DecodeError):
    """An error decoding the seed's ``GARW`` gradient block (§8.6)."""


class EmptyInput(ArrowBlockError, EmptyError):
    """Zero input bytes, or no blocks."""


class ArrowBlockShapeMismatch(ArrowBlockError, ShapeMismatch):
    """The declared shape's element count differs from the number of values.

    Parameters
    ----------
    message
        The seed's message (``"Shape mismatch: ..."``).
    expected, actual
        The shapes compared, when known (else empty).
    """

    def __init__(
        self, message: str, expected: Sequence[int] = (), actual: Sequence[int] = ()
    ) -> None:
        ShapeMismatch.__init__(self, expected, actual)
        self.args = (message,)


class InvalidMagic(ArrowBlockError):
    """The first four bytes are not ``GARW``."""


class TruncatedData(ArrowBlockError):
    """The input ends before the header says it should."""


# --------------------------------------------------------------------------- graph (§7)


class ComputationGraphError(GradfedError):
    """An error of the computation graph store: the seed's ``ComputationGraphError``."""

    exit_code: ClassVar[int] = 9


class GraphNodeNotFound(ComputationGraphError, KeyError):
    """No node with this id in the graph."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        super().__init__(f"Node not found: {node_id}")

    def __str__(self) -> str:
        return str(self.args[0])


class CircularDependency(ComputationGraphError):
    """The graph has a cycle, so it has no topological order."""


class GraphSerializationError(ComputationGraphError, ValueError):
    """A node, graph or checkpoint does not serialize or deserialize."""


class GraphIoError(ComputationGraphError, OSError):
    """Reading or writing a graph or checkpoint file failed."""


# --------------------------------------------------------------------------- pubsub


class PubsubError(GradfedError):
    """Kubo pubsub failed. ``api_url`` and ``topic`` say where, when known."""

    exit_code: ClassVar[int] = 10

    def __init__(
        self, message: str, *, api_url: str | None = None, topic: str | None = None
    ) -> None:
        self.api_url = api_url
        self.topic = topic
        super().__init__(message)


class PubsubUnavailable(PubsubError, ConnectionError):
    """The daemon's pubsub API cannot be reached (connection refused, timeout, stream broke)."""


class PubsubRequestError(PubsubError):
    """The daemon answered a pubsub call with an error (e.g. pubsub is not enabled)."""


class PubsubTimeout(PubsubUnavailable, RpcTimeout):
    """A pubsub call's answer did not complete within the call's total deadline."""


class PubsubResponseTooLarge(PubsubRequestError, ResponseTooLarge):
    """A pubsub call's answer exceeded the endpoint's size cap; reading stopped there."""
