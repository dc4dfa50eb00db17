"""The GPU time of one continuous-batching step: a roofline with prefill attention.

One step (vLLM v1 / SGLang style) runs the GEMMs of every scheduled token -- the new tokens of each
prefill chunk and one token per decoding sequence -- and the attention of each of them::

    t = o + k_c * chunks + k_d * [B > 0]                      launches: per step, per chunk, per decode batch
          + g * max(k, P + B)                                 GEMMs: the weight read floors a small batch
          + max(a * sum(L), m * max(L))                       decode attention: reading each context's K/V
          + sum over chunks i of max(q * P_i * (c_i + P_i/2), m * (c_i + P_i))
                                                              prefill attention: the pairs a chunk's new
                                                              tokens attend to, or reading its K/V

* ``P`` = new tokens over all prefill chunks, ``B`` = decoding sequences, ``L`` = a decode's context
  (its tokens including the new one), ``P_i`` / ``c_i`` = a chunk's new tokens / tokens already cached or
  computed before it.
* ``g * max(k, T)``: below ``k`` tokens a step costs the read of the weights, not tokens x GEMM time
  (the knee; about 180 tokens on an H100).
* ``q``: one (new token, attended token) pair of prefill attention. A chunk of ``P`` tokens after ``c``
  cached ones attends to ``P * (c + P/2)`` pairs (causal): R uncached tokens after a hit of c cost more
  than R tokens from zero. The linear form this replaces priced a chunk's attention like a decode's
  K/V read and missed long contexts by up to 51 % (2,048 tokens after 24,576: 127 ms measured on an
  H100, 62 ms predicted).
* ``m``: a lone sequence reading its K/V. A short chunk over a long context is memory-bound like a
  decode, but it runs as one sequence and cannot spread over the GPU as a batch of decodes does
  (``a``), so it streams slower: ``m >= a``. The same bound holds for a decode batch of one.
* ``k_c``, ``k_d``: each prefill chunk and the decode batch add their own kernels in every layer.

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
    lone_attn_per_ctx_token_s: float  # m (>= a)
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
            read = m * (c + p)
            attn += pairs if pairs > read else read
        b = 0
        ctx = 0
        lmax = 0
        for L in decode_contexts:
            b += 1
            ctx += L
            if L > lmax:
                lmax = L
        if n_chunks == 0 and b == 0:
            return 0.0
        return self.time_of(n_tok + b, n_chunks, b, ctx, lmax, attn)

    def time_of(self, tokens: int, n_chunks: int, decodes: int, decode_ctx: int, max_decode_ctx: int,
                chunk_attn_s: float) -> float:
        """The same from a step's totals (the engines' hot path): ``tokens`` = P + B, ``chunk_attn_s`` =
        the summed prefill-attention terms of the chunks (:meth:`chunk_attn`)."""
        k = self.knee_tokens
        t = self.overhead_s + self.gemm_per_token_s * (tokens if tokens > k else k) + chunk_attn_s
        if n_chunks:
            t += self.chunk_overhead_s * n_chunks
        if decodes:
            bw = self.decode_attn_per_ctx_token_s * decode_ctx
            lone = self.lone_attn_per_ctx_token_s * max_decode_ctx
            t += self.decode_overhead_s + (bw if bw > lone else lone)
        return t

    def chunk_attn(self, p: int, c: int) -> float:
        """Attention seconds of one prefill chunk of ``p`` new tokens after ``c`` computed ones."""
        pairs = self.prefill_attn_per_pair_s * p * (c + 0.5 * p)
        read = self.lone_attn_per_ctx_token_s * (c + p)
        return pairs if pairs > read else read

    def prefill_time(self, uncached: int, cached: int = 0) -> float:
        """One step prefilling ``uncached`` tokens after ``cached`` ones, nothing else in the batch."""
        if uncached <= 0:
            return 0.0
        return self.time(((uncached, cached),))
