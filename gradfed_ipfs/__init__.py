"""gradfed-ipfs: federated learning whose rounds are agreed and content-addressed on IPFS.

What a user of :class:`Node` and the training API needs is here; everything else is in the
sub-package faces. Start with a :class:`Node` beside a Kubo daemon and an agreed session::

    async with Node("http://127.0.0.1:5001") as node:
        session = await node.session("demo", initial_model, AgreedConfig(members=peer_ids))
        result = await session.run_round(gradient, weight=num_samples)  # result.model: a CID

or train with :class:`Peer` (Flower's ClientApp and ServerApp in one object, no server).
:func:`verify` re-checks any round record from its CID.

The packages, from the bottom up (imports only point down):

- :mod:`gradfed_ipfs.errors`, :mod:`gradfed_ipfs.cid`, :mod:`gradfed_ipfs.block`: the one
  exception tree, CIDs, blocks;
- :mod:`gradfed_ipfs.tensor`: pure NumPy gradient types, codecs, aggregation rules;
- :mod:`gradfed_ipfs.formats`: bytes to objects and back, no I/O;
- :mod:`gradfed_ipfs.kubo` (daemons, pubsub) and :mod:`gradfed_ipfs.storage` (block stores,
  chunked gradient DAGs);
- :mod:`gradfed_ipfs.federated` (``agreed``, ``besteffort``, ``sliced``, ``regional``,
  ``accumulate``, ``exchange``, ``secagg_round``, ``privacy``, ``secagg``) and
  :mod:`gradfed_ipfs.provenance` (computation graph, checkpoints, best-effort round records);
- :mod:`gradfed_ipfs.node`, :mod:`gradfed_ipfs.training`, :mod:`gradfed_ipfs.verification`;
- :mod:`gradfed_ipfs.cli`.

The seed crate's API (``ipfrs-tensorlogic``'s ``gradient`` module, its names and aliases) is in
:mod:`gradfed_ipfs.seed`; nothing here imports it. Every name is listed once in ``__all__``.
"""

from __future__ import annotations

import contextlib as _contextlib

from .block import (
    Block,
)
from .cid import (
    make_cid,
    parse_cid,
    verify_cid,
)
from .errors import (
    BlockCorrupt,
    BlockNotFound,
    BlockStoreError,
    BlockTimeout,
    ChainDeadlineExceeded,
    ConfigError,
    DecodeError,
    FederatedError,
    GenesisMismatch,
    GradfedError,
    InvalidGradient,
    KuboError,
    NotARoundRecord,
    PrivacyBudgetExhausted,
    PubsubError,
    QuorumNotReached,
    RoundMismatch,
    RoundVerificationFailed,
    StoreUnavailable,
)
from .federated.agreed import (
    AgreedConfig,
    AgreedRoundResult,
    AgreedSession,
    ResyncResult,
    UpdateRule,
    verify_agreed_history,
)
from .federated.privacy import (
    DifferentialPrivacy,
    PrivacyBudget,
)
from .kubo import (
    KuboDaemon,
    KuboSwarm,
    MemoryPubsubBus,
)
from .node import (
    Node,
)
from .storage import (
    BlockStore,
    KuboBlockStore,
    MemoryBlockStore,
    Retention,
    RetentionKeeper,
    fetch_gradient,
    put_gradient,
)
from .tensor import (
    Bulyan,
    Krum,
    Median,
    MultiKrum,
    NormBounded,
    TrimmedMean,
)
from .training import (
    ArraysAdapter,
    Client,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FederationConfig,
    FedProx,
    FedYogi,
    History,
    LocalDP,
    ModelAdapter,
    Peer,
    QFedAvg,
    Robust,
    SecAgg,
    Strategy,
    VectorAdapter,
    run_simulation,
)
from .verification import (
    Verified,
    verify,
)

__version__ = "0.1.0"

__all__ = [
    "AgreedConfig",
    "AgreedRoundResult",
    "AgreedSession",
    "ArraysAdapter",
    "Block",
    "BlockCorrupt",
    "BlockNotFound",
    "BlockStore",
    "BlockStoreError",
    "BlockTimeout",
    "Bulyan",
    "ChainDeadlineExceeded",
    "Client",
    "ConfigError",
    "DecodeError",
    "DifferentialPrivacy",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FederatedError",
    "FederationConfig",
    "FedProx",
    "FedYogi",
    "fetch_gradient",
    "GenesisMismatch",
    "GradfedError",
    "History",
    "InvalidGradient",
    "Krum",
    "KuboBlockStore",
    "KuboDaemon",
    "KuboError",
    "KuboSwarm",
    "LocalDP",
    "make_cid",
    "Median",
    "MemoryBlockStore",
    "MemoryPubsubBus",
    "ModelAdapter",
    "MultiKrum",
    "Node",
    "NormBounded",
    "NotARoundRecord",
    "parse_cid",
    "Peer",
    "PrivacyBudget",
    "PrivacyBudgetExhausted",
    "PubsubError",
    "put_gradient",
    "QFedAvg",
    "QuorumNotReached",
    "ResyncResult",
    "Retention",
    "RetentionKeeper",
    "Robust",
    "RoundMismatch",
    "RoundVerificationFailed",
    "run_simulation",
    "SecAgg",
    "StoreUnavailable",
    "Strategy",
    "TrimmedMean",
    "UpdateRule",
    "VectorAdapter",
    "Verified",
    "verify",
    "verify_agreed_history",
    "verify_cid",
]

# Present every export as living in the top-level package (as httpx does), so reprs,
# tracebacks and docs show ``gradfed_ipfs.X`` rather than the internal module layout.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("gradfed_ipfs."):
        with _contextlib.suppress(AttributeError, TypeError):
            _obj.__module__ = "gradfed_ipfs"
del _name, _obj, _contextlib
