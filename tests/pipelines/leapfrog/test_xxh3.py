"""The batch xxh3 (`pipelines.leapfrog.xxh3`) gives the `xxhash` binding's values to the bit: Leap Frog's states
keep these hashes across runs, so any other value would make a stored state wrong."""

from __future__ import annotations

import numpy as np
import xxhash

from pipelines.leapfrog.xxh3 import BLOCK, MAX_LENGTH, hashes


def _binding(data: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    return np.array(
        [xxhash.xxh3_64_intdigest(data[s:e].tobytes()) for s, e in zip(start, end, strict=True)], np.uint64
    )


def test_every_length_class_gives_the_bindings_hash():
    rng = np.random.default_rng(42)
    # every length through both of XXH3's paths (short inputs here, long ones by the binding), then random ones
    lengths = np.concatenate([np.arange(0, MAX_LENGTH + 40), rng.integers(0, 2 * MAX_LENGTH, 3 * BLOCK)])
    rng.shuffle(lengths)
    gaps = rng.integers(0, 9, len(lengths))  # slices at every alignment, some apart, some touching
    start = np.cumsum(gaps) + np.concatenate([[0], np.cumsum(lengths)[:-1]])
    end = start + lengths
    data = rng.integers(0, 256, int(end[-1]), dtype=np.uint8)  # the last slice ends where the buffer does
    got = hashes(data, start, end)
    want = _binding(data, start, end)
    wrong = np.flatnonzero(got != want)
    assert len(wrong) == 0, f"lengths {sorted(set(lengths[wrong].tolist()))[:20]} hash differently"


def test_tiny_buffers_and_no_slices():
    for size in range(0, 20):
        data = np.arange(size, dtype=np.uint8)
        start = np.zeros(size + 1, np.int64)
        end = np.arange(size + 1, dtype=np.int64)
        assert (hashes(data, start, end) == _binding(data, start, end)).all(), size
    assert len(hashes(np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64))) == 0
