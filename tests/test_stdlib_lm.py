"""examples/stdlib_lm.py: a short DiLoCo run of the byte-level LM learns (the ``torch`` area)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tests.required import import_area

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

MARGIN = 0.6
"""The trained held-out loss must be below 0.6 · ln 256 ≈ 3.33 nats (untrained: ≈ 5.4)."""


def test_the_split_is_by_file_and_the_batches_are_seeded() -> None:
    import_area("torch", "torch")
    from stdlib_lm import LMConfig, batch_of, load_corpus, stdlib_files

    config = LMConfig(max_bytes_per_peer=200_000)
    corpus = load_corpus(3, config)
    files = stdlib_files()
    assert all("site-packages" not in p.parts and "test" not in p.parts for p in files)
    assert files == sorted(files)
    assert corpus.held_out_files == len(files) // 10
    assert all(150_000 < len(part) < 400_000 for part in corpus.parts)
    first = batch_of(corpus.parts[1], config, 1, 7)
    assert first.shape == (config.batch, config.context + 1)
    assert np.array_equal(first, batch_of(corpus.parts[1], config, 1, 7))
    assert not np.array_equal(first, batch_of(corpus.parts[1], config, 1, 8))


def test_a_short_diloco_run_beats_the_untrained_loss_and_ends_on_one_model() -> None:
    import_area("torch", "torch")
    from stdlib_lm import UNTRAINED_LOSS, LMConfig, diloco_strategy, final_loss, simulate

    # 2 peers x 4 rounds x H = 30 AdamW steps of 4 x 128 bytes: 240 inner steps in all
    histories = simulate(2, 4, 30, diloco_strategy, LMConfig(batch=4))
    initial, final = histories[0].initial_local_loss, final_loss(histories[0])
    assert initial is not None
    assert initial > 0.95 * UNTRAINED_LOSS
    assert final < MARGIN * UNTRAINED_LOSS, (initial, final)
    assert len({h.entries[-1].model for h in histories}) == 1
    assert "diloco" in histories[0].strategy
    assert all(e.results == 2 for e in histories[0].entries)
