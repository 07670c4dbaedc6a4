"""Per-peer transfer rates measured over rounds: the measured half of a fetch's deadline.

After a fetch from a peer ends while its blocks were arriving (complete, or cut off as too
slow), the round records bytes received over seconds taken. :class:`ThroughputMeter` smooths
these samples per peer over rounds (an EWMA), and the next round plans that peer's fetch with a
fraction of the estimate (:attr:`ThroughputMeter.safety`). The plan can only lengthen a
deadline, never shorten it: ``RoundConfig.fetch_deadline(nbytes, rate)`` keeps
``fetch_timeout + nbytes / min_throughput`` as the floor users configured and caps the
extension at ``max_fetch_deadline``. A longer deadline costs nothing while the peer is fast
(its fetch ends when its blocks are in) and stalls are still cut off after ``stall_timeout``.

The estimate moves down by at most a factor ``1 - alpha`` per sample (an EWMA's own bound),
and up by at most ``1 - alpha + alpha * max_jump``: with the defaults one fast outlier raises
it 1.6x, so the planned rate (half of it) stays below the previous estimate. Transfers under
``min_bytes`` are dominated by latency (a fetch starts with round trips), so they are ignored.
"""

from __future__ import annotations

import math

from ...errors import ConfigError

__all__ = ["ThroughputMeter"]


class ThroughputMeter:
    """Smoothed per-peer transfer rates (bytes/s), kept by a ``RoundRunner`` across rounds.

    Parameters
    ----------
    alpha
        Weight of a new sample in the EWMA, in (0, 1].
    max_jump
        A sample above ``max_jump`` times the current estimate counts as that much (≥ 1).
    min_bytes
        Transfers smaller than this many bytes are not samples (latency dominates them).
    safety
        Fraction of the estimate a deadline is planned with, in (0, 1].
    max_peers
        Most peers remembered; the one measured longest ago is forgotten first.
    """

    def __init__(
        self,
        *,
        alpha: float = 0.3,
        max_jump: float = 3.0,
        min_bytes: int = 262_144,
        safety: float = 0.5,
        max_peers: int = 4096,
    ) -> None:
        if not (0 < alpha <= 1 and max_jump >= 1 and 0 < safety <= 1):
            raise ConfigError("need 0 < alpha <= 1, max_jump >= 1 and 0 < safety <= 1")
        if min_bytes < 0 or max_peers < 1:
            raise ConfigError("need min_bytes >= 0 and max_peers >= 1")
        self.alpha = alpha
        self.max_jump = max_jump
        self.min_bytes = min_bytes
        self.safety = safety
        self.max_peers = max_peers
        self._rates: dict[str, float] = {}  # oldest measurement first

    def record(self, peer: str, nbytes: int, seconds: float) -> float | None:
        """Fold one transfer of ``nbytes`` in ``seconds`` into ``peer``'s estimate.

        Returns
        -------
        float or None
            The sample's rate in bytes/s, or ``None`` if it was not taken (under
            ``min_bytes``, or a duration that is not a positive finite number).
        """
        if nbytes < max(1, self.min_bytes) or not 0 < seconds < math.inf:
            return None
        sample = nbytes / seconds
        old = self._rates.pop(peer, None)
        if old is None:
            new = sample
        else:
            new = (1 - self.alpha) * old + self.alpha * min(sample, self.max_jump * old)
        self._rates[peer] = new
        if len(self._rates) > self.max_peers:
            del self._rates[next(iter(self._rates))]
        return sample

    def rate(self, peer: str) -> float | None:
        """Return ``peer``'s smoothed rate in bytes/s, or ``None`` if never measured."""
        return self._rates.get(peer)

    def planning_rate(self, peer: str) -> float | None:
        """Return the rate ``peer``'s next deadline is planned with: ``safety`` × :meth:`rate`."""
        rate = self._rates.get(peer)
        return None if rate is None else self.safety * rate

    def rates(self) -> dict[str, float]:
        """Return every remembered peer's smoothed rate in bytes/s, by peer ID."""
        return dict(sorted(self._rates.items()))
