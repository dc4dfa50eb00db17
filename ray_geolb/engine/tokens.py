"""Cheap, deterministic "tokenisation" and prefix-block hashing.

The emulated engines never see real tokens.  A prompt of ``len(text)`` characters is
assumed to be ``ceil(len(text) / chars_per_token)`` tokens (the usual ~4 chars/token
rule of thumb for English BPE vocabularies), and it is cut into KV-cache blocks of
``block_tokens`` tokens = ``block_tokens * chars_per_token`` characters, exactly like
vLLM's paged KV cache cuts a token sequence into blocks of ``block_size`` tokens.

Only FULL blocks get a hash (vLLM only caches full blocks).  Hashes are *chained*: the
hash of block ``i`` depends on all text up to the end of block ``i``, so two prompts
share block ``i`` iff they share all text up to the end of block ``i``.

Hashes must be identical across processes, machines and runs (Python's ``hash()`` of a
``str`` is salted per process, so it is NOT used).  We use the running CRC-32 of the
UTF-8 bytes (``zlib.crc32(chunk, crc_of_everything_before)``, C code, naturally chained)
and pack it with the block index into one 64-bit int: ``(crc << 32) | index``.  Two
different prefixes therefore collide only if they end at the same block index AND their
CRC-32 collide (~2**-32 per pair), which is negligible at simulator cache sizes.
Cost: one C call per block, ~0.15-0.3 us/block, i.e. ~75-150 us for a 32 k-char
(500-block) prompt on a slow 2-core VM.
"""

from __future__ import annotations

import math
import zlib
from typing import Iterable

__all__ = ["prompt_blocks", "blocks_from_hash_ids", "num_prompt_tokens"]

_crc32 = zlib.crc32
_MASK64 = (1 << 64) - 1


def num_prompt_tokens(text: str, chars_per_token: float = 4.0) -> int:
    """``max(1, ceil(len(text) / chars_per_token))``."""
    if chars_per_token <= 0:
        raise ValueError(f"chars_per_token must be > 0, got {chars_per_token!r}")
    return max(1, math.ceil(len(text) / chars_per_token))


def prompt_blocks(
    text: str, chars_per_token: float = 4.0, block_tokens: int = 16
) -> tuple[int, list[int]]:
    """Return ``(num_prompt_tokens, chained hashes of each FULL block)``.

    Block ``i`` covers characters ``[floor(i*bc), floor((i+1)*bc))`` with
    ``bc = block_tokens * chars_per_token``; the number of full blocks is
    ``floor(len(text) / bc)``.  Each hash is a non-negative int < 2**64, stable across
    processes and Python versions.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens!r}")
    n_tokens = num_prompt_tokens(text, chars_per_token)
    block_chars = block_tokens * chars_per_token
    n_blocks = int(len(text) // block_chars)
    if n_blocks == 0:
        return n_tokens, []

    if text.isascii():
        data = text.encode("ascii")
        slice_bytes = True
    else:  # char offsets != byte offsets: encode each block's slice separately
        data = None
        slice_bytes = False

    hashes: list[int] = []
    append = hashes.append
    crc = 0
    if slice_bytes and float(block_chars).is_integer():
        bc = int(block_chars)
        mv = memoryview(data)
        i = 0
        for start in range(0, n_blocks * bc, bc):
            crc = _crc32(mv[start : start + bc], crc)
            append((crc << 32) | i)
            i += 1
        return n_tokens, hashes

    start = 0
    for i in range(n_blocks):
        end = int((i + 1) * block_chars)
        chunk = data[start:end] if slice_bytes else text[start:end].encode("utf-8")
        crc = _crc32(chunk, crc)
        append((crc << 32) | i)
        start = end
    return n_tokens, hashes


def blocks_from_hash_ids(hash_ids: Iterable[int]) -> list[int]:
    """Chain per-block ids given by a trace (e.g. Mooncake ``hash_ids``) into prefix hashes.

    Output ``i`` depends on ``hash_ids[0..i]`` (in order), so two requests share chained
    block ``i`` iff their id lists agree on positions ``0..i``.  Deterministic 64-bit
    mixing (SplitMix64 finaliser), no Python ``hash()``.
    """
    out: list[int] = []
    h = 0x9E3779B97F4A7C15
    for x in hash_ids:
        z = (h ^ ((int(x) & _MASK64) * 0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
        out.append(h)
    return out
