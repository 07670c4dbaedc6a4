"""One agreed round's steps: what was heard, which contributions are ready, the roster, the model.

:class:`~.coordinator.RoundBoard` (the messages heard; the coordinator schedule:
:func:`~.coordinator.coordinator_ranking`),
:class:`~.readiness.ReadyTracker` (contributions fetched and verified),
:class:`~.roster.RosterPhase` (from contributions to one adopted roster) and
:class:`~.aggregate.AggregateStep` (the adopted roster's model, all-to-all or sliced).
"""
