"""Fast, deterministic synthetic text (no per-character random calls, no global RNG state).

Text is built from a fixed 256-word vocabulary: a seeded ``numpy.random.Generator`` draws word
indices in bulk, the words are joined with spaces and the result is cut to the exact length.
At about 5.5 characters per word (incl. the space) a token is taken to be ~4 characters.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

CHARS_PER_TOKEN = 4

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her all she there would their we him been has when who will more no if out "
    "so said what up its about into than them can only other new some could time these two may then do "
    "first any my now such like our over man me even most made after also did many before must through "
    "back years where much your way well down should because each just those people how too little state "
    "good very make world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go came right used take "
    "three system model token cache prefix region replica router request stream batch query answer value "
    "number table graph river stone cloud light sound water field paper plant green blue red yellow music "
    "story house street city market price trade bank money power energy engine signal network server data "
    "memory vector matrix tensor kernel queue thread socket packet frame layer weight bias loss step epoch "
    "train test valid score rank order merge split sort search index scan build parse print write read "
    "open close start stop begin end early late fast slow high low near far deep wide small large "
    "north south east west winter summer spring autumn morning evening garden window bridge"
).split()
_VOCAB = np.array(_WORDS, dtype=object)
assert len(_WORDS) >= 256


def rng_for(*key: int | str) -> np.random.Generator:
    """A numpy Generator seeded from a tuple of ints/strings (strings hashed with sha256, never hash())."""
    ints: list[int] = []
    for k in key:
        if isinstance(k, str):
            ints.append(int.from_bytes(hashlib.sha256(k.encode("utf-8")).digest()[:8], "little"))
        else:
            if k < 0:
                raise ValueError(f"rng_for key must be non-negative, got {k}")
            ints.append(int(k))
    return np.random.default_rng(ints)


def stable_int(s: str) -> int:
    """A stable 64-bit integer from a string (sha256), for seeding and bucketing."""
    return int.from_bytes(hashlib.sha256(s.encode("utf-8")).digest()[:8], "little")


def words(n_chars: int, rng: np.random.Generator) -> str:
    """Exactly ``n_chars`` characters of space-separated vocabulary words."""
    if n_chars <= 0:
        return ""
    parts: list[str] = []
    have = 0
    while have < n_chars:
        n_words = max(8, (n_chars - have) // 4 + 8)  # words average > 4 chars incl. space
        idx = rng.integers(0, len(_VOCAB), size=n_words)
        chunk = " ".join(_VOCAB[idx].tolist()) + " "
        parts.append(chunk)
        have += len(chunk)
    return "".join(parts)[:n_chars]


@lru_cache(maxsize=65536)
def block_text(block_id: int, n_chars: int, seed: int = 0) -> str:
    """Deterministic text block for a trace ``hash_id`` (same id + seed -> same text)."""
    return words(n_chars, rng_for(seed, 7919, block_id))
