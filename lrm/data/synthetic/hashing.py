"""Everything random in the synthetic world, from the seed: an id's attributes are hashes of
the id (splitmix64's finalizer, salted per attribute), and every other draw comes from a
generator seeded by (seed, stream, ...) so that no stream's draws move another's."""

from __future__ import annotations

import zlib
from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    """The seed-sequence streams: `seeded_rng(seed, Stream.X, ...)` (a day's draws:
    `seeded_rng(seed, day, Stream.X, ...)`)."""

    WORLD, SESSIONS, HISTORY, IMPRESSIONS, LABELS, POOL, DRIFT, VERTICAL = range(8)


U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on a uint64 array (wraps modulo 2**64)."""
    x = x ^ (x >> U64(30))
    x *= U64(0xBF58476D1CE4E5B9)
    x ^= x >> U64(27)
    x *= U64(0x94D049BB133111EB)
    return x ^ (x >> U64(31))


def salt_of(seed: int, name: str) -> np.uint64:
    key = np.array([(seed * 1_000_003 + zlib.crc32(name.encode())) % 2**64], dtype=np.uint64)
    return U64(mix(key * GOLDEN)[0])


def hash_ids(x: np.ndarray, salt: np.uint64) -> np.ndarray:
    """A 64-bit hash per element of a non-negative integer array."""
    return mix(np.atleast_1d(np.asarray(x)).astype(np.uint64) * GOLDEN + salt)


def to_unit(h: np.ndarray) -> np.ndarray:
    """Hash -> float64 uniform in [0, 1)."""
    return (h >> U64(11)).astype(np.float64) * 2.0**-53


def bucket(h: np.ndarray, n: int) -> np.ndarray:
    return (h % U64(n)).astype(np.int64)


def categorical(h: np.ndarray, probs: tuple[float, ...]) -> np.ndarray:
    cdf = np.cumsum(probs)
    return np.minimum(np.searchsorted(cdf / cdf[-1], to_unit(h), side="right"), len(probs) - 1)


def seeded_rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % 2**64, *key])))


def unit_rows(a: np.ndarray) -> np.ndarray:
    return a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))
