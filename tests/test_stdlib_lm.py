"""examples/stdlib_lm.py: a short DiLoCo run of the byte-level LM learns (the ``torch`` area)."""

from __future__ import annotations

import sys
from dataclasses import replace
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


def test_round_r_trains_the_steps_the_every_step_reference_trains() -> None:
    import_area("torch", "torch")
    from stdlib_lm import LMConfig, initial_vector, load_corpus, make_client, train_synchronous

    config = LMConfig(batch=2, max_bytes_per_peer=100_000, total_steps=4)
    corpus = load_corpus(2, config)
    alone = replace(corpus, parts=corpus.parts[:1])  # one peer: averaging changes nothing
    client = make_client(alone, 0, config)
    vector = initial_vector(config)
    for server_round in (1, 2):  # 2 rounds of H = 2: global steps 0, 1, then 2, 3
        vector, samples, _ = client.train(vector, {"inner_steps": 2, "server_round": server_round})
        assert samples == 2 * config.batch
    reference = train_synchronous(alone, config, 4, eval_every=4)
    assert np.array_equal(vector, reference.vector)  # the same bytes, schedule and AdamW state
    assert not np.array_equal(vector, initial_vector(config))
    # after a warm start of 2 steps both continue at global step 2 from the same model
    later = replace(config, first_step=2)
    warm = train_synchronous(alone, config, 2, eval_every=2).vector
    continued, _, _ = make_client(alone, 0, later).train(
        warm, {"inner_steps": 2, "server_round": 1}
    )
    assert np.array_equal(continued, train_synchronous(alone, later, 2, initial=warm).vector)
    assert not np.array_equal(continued, train_synchronous(alone, config, 2, initial=warm).vector)
