"""``gradfed-ipfs demo``: the quick start's multi-peer session over Kubo.

:mod:`.run` starts the daemons and one peer process each (:mod:`.peer`, launched as
``python -m gradfed_ipfs.cli.demo.peer``); :mod:`.besteffort` is ``demo --best-effort``. Nothing is
imported here, so ``gradfed-ipfs --help`` does not pay for the demo's imports.
"""
