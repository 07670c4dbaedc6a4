"""Agreed-round statements and records: rosters, records, membership changes, equivocation proofs.

:mod:`~.roster` (messages, rosters and the per-round record), :mod:`~.membership` (join, leave
and member-set records) and :mod:`~.evidence` (two conflicting signed statements as a proof).
"""
