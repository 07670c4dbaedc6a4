"""The update rule of a training session: sampling, strategy and metric summary in one step.

:class:`TrainingRule` is the :class:`~gradfed_ipfs.federated.agreed.config.UpdateRule`
every peer of a training session applies to the agreed roster. It recomputes the round's
sample from the round seed, keeps the contributions of sampled peers that trained (and whose
weight equals their declared sample count), hands them to the :class:`Strategy`, and writes the
round's summary into the model's metric tail (:mod:`gradfed_ipfs.training.metrics`). The label
it writes into each round record names the strategy, the sampling and the CID of the round's
client config, so the config is content-addressed in the round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

import numpy as np
from multiformats import CID

from .._types import FloatArray
from ..block import Block
from ..formats.agreed.roster import Roster
from ..formats.records import encode_record
from .metrics import PeerTail, VectorLayout
from .sampling import round_seed, sample_peers, sample_size
from .strategy import ConfigValue, FitResult, Strategy

__all__ = ["CONFIG_RECORD", "TrainingRule", "config_block"]

CONFIG_RECORD: Final = "gradfed.fit-config"
"""``type`` of a round's client-config record."""


def config_block(server_round: int, config: Mapping[str, ConfigValue]) -> Block:
    """Return the dag-cbor block of a round's client config (same bytes on every peer)."""
    return encode_record(
        {"type": CONFIG_RECORD, "version": 1, "round": server_round, "config": dict(config)}
    )


class TrainingRule:
    """The rule a training session's agreed rounds apply (see the module docstring).

    Parameters
    ----------
    strategy
        How fit results move the params.
    layout
        The session's vector layout.
    members
        The session's (round 0's) peer IDs; a round whose members changed samples from its
        own (its roster's ``expected``).
    fraction, min_fit
        Sampling: ``max(min_fit, ceil(fraction · N))`` members train per round.
    fit_rounds
        Rounds ``0 .. fit_rounds-1`` train; later rounds only evaluate (nobody is sampled).
    config
        ``server_round -> config dict`` (must be the same function on every peer).
    """

    def __init__(
        self,
        strategy: Strategy,
        layout: VectorLayout,
        members: Sequence[str],
        *,
        fraction: float,
        min_fit: int,
        fit_rounds: int,
        config: Callable[[int], Mapping[str, ConfigValue]],
    ) -> None:
        sample_size(len(members), fraction, min_fit)  # checks the settings
        self.strategy = strategy
        self.layout = layout
        self.members = tuple(members)
        self.fraction = float(fraction)
        self.min_fit = int(min_fit)
        self.fit_rounds = int(fit_rounds)
        self._config = config
        self._blocks: dict[int, Block] = {}

    def config(self, round_number: int) -> dict[str, ConfigValue]:
        """Return the client config of agreed round ``round_number`` (server round r + 1)."""
        server_round = round_number + 1
        return {"server_round": server_round, **self._config(server_round)}

    def config_block(self, round_number: int) -> Block:
        """Return (and cache) the config block of a round."""
        block = self._blocks.get(round_number)
        if block is None:
            block = config_block(round_number + 1, self.config(round_number))
            self._blocks = {round_number: block}  # only the current round's is kept
        return block

    def sampled(
        self,
        session: str,
        genesis: CID,
        round_number: int,
        base: CID,
        members: Sequence[str] | None = None,
    ) -> tuple[str, ...]:
        """Return the members that train in this round (none in evaluation rounds).

        ``members``: the round's member set (default: :attr:`members`).
        """
        if round_number >= self.fit_rounds:
            return ()
        seed = round_seed(session, genesis, round_number, base)
        chosen = self.members if members is None else tuple(members)
        return sample_peers(seed, chosen, self.fraction, self.min_fit)

    def label(self, round_number: int) -> str:
        """Return ``<strategy> fraction=… min_fit=… rounds=… config=<CID>``."""
        cid = self.config_block(round_number).cid
        return (
            f"{self.strategy.name} fraction={self.fraction:g} min_fit={self.min_fit} "
            f"rounds={self.fit_rounds} config={cid}"
        )

    def split_roster(
        self, roster: Roster, gradients: Sequence[FloatArray]
    ) -> tuple[list[FitResult], list[PeerTail], list[PeerTail]]:
        """Return the round's fit results, their tails, and every usable evaluation tail."""
        sample = set(
            self.sampled(roster.session, roster.genesis, roster.round, roster.base, roster.expected)
        )
        fits: list[FitResult] = []
        fit_tails: list[PeerTail] = []
        evaluations: list[PeerTail] = []
        for entry, vector in zip(roster.entries, gradients, strict=True):
            update, raw_tail = self.layout.split(vector)
            tail = self.layout.read_tail(raw_tail)
            if tail.eval_samples > 0:
                evaluations.append(tail)
            if (
                tail.fit
                and entry.peer in sample
                and entry.weight == tail.fit_samples
                and bool(np.isfinite(update).all())
            ):
                loss = tail.eval_loss if tail.eval_samples > 0 else None
                fits.append(FitResult(entry.peer, update, entry.weight, loss))
                fit_tails.append(tail)
        return fits, fit_tails, evaluations

    def apply(
        self,
        model: FloatArray,
        roster: Roster,
        gradients: Sequence[FloatArray],
        learning_rate: float,
        state: FloatArray | None,
    ) -> tuple[FloatArray, FloatArray | None]:
        """Return the next global vector (params moved by the strategy, the round's summary)."""
        params, _ = self.layout.split(model)
        fits, fit_tails, evaluations = self.split_roster(roster, gradients)
        new_params, new_state = params, state
        if fits:
            new_params, new_state = self.strategy.aggregate(params, fits, learning_rate, state)
        tail = self.layout.summarize(fit_tails, evaluations)
        return np.concatenate([np.asarray(new_params, np.float32), tail]), new_state
