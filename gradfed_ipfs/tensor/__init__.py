"""Gradient tensors: types, compression, aggregation and verification (pure NumPy, no I/O)."""
