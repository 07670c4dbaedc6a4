"""gradfed-ipfs."""
