"""The GPU time of one continuous-batching step: a roofline with prefill attention.

One step (vLLM v1 / SGLang style) runs the GEMMs of every scheduled token -- the new tokens of each
prefill chunk and one token per decoding sequence -- and the attention of each of them::

    t = o + k_c * chunks + k_d * [B > 0]                      launches: per step, per chunk, per decode batch
          + g * max(k, P + B)                                 GEMMs: the weight read floors a small batch
          + a * sum(L)                                        decode attention: reading each context's K/V
          + sum over chunks i of max(q * P_i * (c_i + P_i/2), m * (c_i + P_i))
                                                              prefill attention: the pairs a chunk's new
                                                              tokens attend to, or one query tile's pass
                                                              over its context

* ``P`` = new tokens over all prefill chunks, ``B`` = decoding sequences, ``L`` = a decode's context
  (its tokens including the new one), ``P_i`` / ``c_i`` = a chunk's new tokens / tokens already cached or
  computed before it.
* ``g * max(k, T)``: below ``k`` tokens a step costs the read of the weights, not tokens x GEMM time
  (the knee; about 190 tokens on an H100, 80 on an H200).
* ``a``: a decode reads its K/V (128 KiB per context token for Llama-3.1-8B) at the card's bandwidth.
  All decodes of a step run in one attention call, and the kernel splits a long context over the SMs, so
  a lone decode streams at the same rate as a batch: measured, one sequence over 16k-131k tokens costs
  41-42 ns per context token on an H100 against a = 44 ns fitted on the batches (27 ns against 29 on an
  H200). There is no separate lone-decode rate.
* ``q``: one (new token, attended token) pair of prefill attention. A chunk of ``P`` tokens after ``c``
  cached ones attends to ``P * (c + P/2)`` pairs (causal): R uncached tokens after a hit of c cost more
  than R tokens from zero. ``q`` is compute (32 layers x 4 x 4096 FLOP per pair: ~340 TFLOP/s).
* ``m``: a short chunk's pass over its context. Each chunk runs its own attention call (one sequence,
  alone), and the kernel works on tiles of queries: a chunk with fewer new tokens than a tile still runs
  one whole tile over its ``c + P`` keys. Measured on both cards, 8, 16, 32 and 64 new tokens over the
  same context cost the same (about 100 ns per context token on the H100 *and* the H200, although the
  H200 reads memory 1.5x faster), 128 tokens cost twice that: compute at tile granularity, not memory
  bandwidth. The fit gives ``m / q`` = 69 / 74 tokens (H100 / H200), the size of the 64-query tile. It
  is 2.4x / 3.9x the decode rate ``a``, which is why one constant for both reads missed lone decodes by
  up to +53 % and short chunks over long contexts by up to -28 %. (The field keeps its name,
  ``lone_attn_per_ctx_token_s``: the chunk's attention runs lone, one sequence per call, while every
  decode of the step shares one call.)
* ``k_c``, ``k_d``: each prefill chunk and the decode batch add their own kernels in every layer.

Why this form, and what it leaves (the rows are in the fixture; ``python -m ray_geolb.engine.step_fit``):

* The form before it priced a short chunk's pass and a lone decode's read with one constant ``m``
  (``max(a * sum L, m * max L)`` for decodes). Fitted on three short single-decode rows per run, ``m``
  was 93 / 49 ns: lone decodes over 65k-131k tokens came out +34 % / +53 % on the H100, and 16 new tokens
  over 65,536 cached -28 % on the H200. Split into ``a`` for every decode and ``m`` for chunks, every row
  is within 8.8 % (H100) and 13.8 % (H200).
* ``m`` tied to the tile (``m = q * T``, ``T`` fitted) fits the rows as well (RMS 3.30 % against 3.29 %
  on the H100). ``m`` is kept free so that it is read off the short-chunk rows, and ``m / q`` ~ 64 is then
  a check of the tile reading, not an assumption.
* A chunk's own K/V read at the decode rate (``a * (c + P)``) never binds: ``m`` > ``a`` on both cards.
* What one ``q`` per card leaves: the kernel is ~10 % more efficient per pair for 1k-4k-token chunks
  (about 1.40 ns per pair over 65k cached tokens) than for 64-256-token ones (1.55-1.57 ns), so the
  longest chunks come out +6 % to +8 %. On the H200 the GEMMs step between 64, 128 and 256 tokens (tile
  quantization), which a single knee smooths over: a 256-token prefill is +13.8 %.

How the terms compose for a step the fit never saw: GEMM time is paid once on all tokens; decode reads
add up; each chunk adds its own attention (pairs or one tile's pass, whichever is larger) and its own
launches. The fit (:mod:`.step_fit`) sees only steps with at most one chunk; the measured steps with
several chunks check this composition (they were seen while the form was chosen: design checks, not
held-out data).

Profiles (:mod:`.profiles`) hold one :class:`StepModel` each. The constants of the measured profiles
come from :mod:`.step_fit` (``python -m ray_geolb.engine.step_fit``), which fits them to the committed
GPU step times. The simulator and the wall-clock emulated engine both price steps with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Tuple

__all__ = ["StepModel"]


@dataclass(frozen=True)
class StepModel:
    """Constants of the step-time roofline (seconds; module docstring)."""

    overhead_s: float  # o
    gemm_per_token_s: float  # g
    knee_tokens: float  # k: below it the weight read sets the GEMM time
    decode_attn_per_ctx_token_s: float  # a
    prefill_attn_per_pair_s: float  # q
    lone_attn_per_ctx_token_s: float  # m: a prefill chunk's floor per context token (one query tile's pass)
    chunk_overhead_s: float = 0.0  # k_c
    decode_overhead_s: float = 0.0  # k_d

    def __post_init__(self) -> None:
        for name in ("overhead_s", "gemm_per_token_s", "knee_tokens", "decode_attn_per_ctx_token_s",
                     "prefill_attn_per_pair_s", "lone_attn_per_ctx_token_s", "chunk_overhead_s",
                     "decode_overhead_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0.0 and v != float("inf")):
                raise ValueError(f"StepModel.{name} must be a finite number >= 0, got {v!r}")

    def time(self, chunks: Iterable[Tuple[int, int]] = (), decode_contexts: Iterable[int] = ()) -> float:
        """Seconds of one step: ``chunks`` = (new tokens, tokens before them) per prefill chunk,
        ``decode_contexts`` = context tokens of each decoding sequence. 0 when nothing is scheduled."""
        n_tok = 0
        n_chunks = 0
        attn = 0.0
        q = self.prefill_attn_per_pair_s
        m = self.lone_attn_per_ctx_token_s
        for p, c in chunks:
            n_tok += p
            n_chunks += 1
            pairs = q * p * (c + 0.5 * p)
            tile = m * (c + p)
            attn += pairs if pairs > tile else tile
        b = 0
        ctx = 0
        for L in decode_contexts:
            b += 1
            ctx += L
        if n_chunks == 0 and b == 0:
            return 0.0
        return self.time_of(n_tok + b, n_chunks, b, ctx, 0, attn)

    def time_of(self, tokens: int, n_chunks: int, decodes: int, decode_ctx: int, max_decode_ctx: int,
                chunk_attn_s: float) -> float:
        """The same from a step's totals (the engines' hot path): ``tokens`` = P + B, ``chunk_attn_s`` =
        the summed prefill-attention terms of the chunks (:meth:`chunk_attn`). ``max_decode_ctx`` is
        accepted for the engines' call and not used: a decode's read does not depend on the longest
        context of its batch (module docstring, ``a``)."""
        k = self.knee_tokens
        t = self.overhead_s + self.gemm_per_token_s * (tokens if tokens > k else k) + chunk_attn_s
        if n_chunks:
            t += self.chunk_overhead_s * n_chunks
        if decodes:
            t += self.decode_overhead_s + self.decode_attn_per_ctx_token_s * decode_ctx
        return t

    def chunk_attn(self, p: int, c: int) -> float:
        """Attention seconds of one prefill chunk of ``p`` new tokens after ``c`` computed ones."""
        pairs = self.prefill_attn_per_pair_s * p * (c + 0.5 * p)
        tile = self.lone_attn_per_ctx_token_s * (c + p)
        return pairs if pairs > tile else tile

    def prefill_time(self, uncached: int, cached: int = 0) -> float:
        """One step prefilling ``uncached`` tokens after ``cached`` ones, nothing else in the batch."""
        if uncached <= 0:
            return 0.0
        return self.time(((uncached, cached),))
