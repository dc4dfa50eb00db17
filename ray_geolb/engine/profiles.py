"""Calibrated performance profiles of one LLM serving replica (one GPU).

Each profile holds a :class:`~ray_geolb.engine.step_model.StepModel`: the GPU time of ONE
continuous-batching iteration (vLLM v1 / SGLang style, chunked prefill mixes prefill chunks and decodes
in the same forward pass) as a roofline with prefill attention (``engine/step_model.py`` has the form)::

    t = o + k_c * chunks + k_d * [B > 0] + g * max(k, P + B) + a * sum L
          + sum over chunks of max(q * P_i * (c_i + P_i/2), m * (c_i + P_i))

and ``ttft_overhead_s``: per-request fixed latency outside the step loop (API server, tokenisation,
scheduling, first detokenisation, network in the measurement). The engine model keeps a request
"pending" for this long before it can be scheduled, so at batch size 1:
TTFT(n) = ttft_overhead_s + t(one chunk of n tokens) (:meth:`EngineProfile.batch1_ttft`).

* ``llama3.1-8b-h100`` and ``llama3.1-8b-h200`` are MEASURED: their step models are fitted
  (``python -m ray_geolb.engine.step_fit``) to GPU step times of a Llama-3.1-8B-shaped model committed in
  ``ray_geolb/data/gpu_step_times/`` (three H100 SXM runs, two H200 runs: the first grids and the
  long-context rows); KV capacity from each card's memory.
* ``mistral-7b-a100`` and ``llama3.1-8b-l4`` are calibrated from the papers' single-engine figures
  (GORGO's TTFT line, SkyLB's 300 ms per 512 tokens), with the prefill-attention term ``q`` DERIVED, not
  measured: the attention throughput the H100 fit implies, as a fraction of the H100's bf16 peak, applied
  to each card's peak (:data:`ATTN_PEAK_FRACTION`).

Profiles are calibrated ONLY from single-engine measurements cited next to each profile, never from
routing results. KV capacity is computed from the architecture: Llama-3.1-8B and Mistral-7B both have
32 layers x 8 KV heads x 128 head dim x 2 (K, V) x 2 bytes (fp16/bf16) = 131,072 B = 128 KiB per token.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Iterable, Tuple

from .step_model import StepModel

__all__ = ["AdmissionParams", "EngineProfile", "PROFILES", "get_profile", "KV_BYTES_PER_TOKEN_8B", "ADMISSION_MODES",
           "ADMISSION_FIELDS", "check_admission", "FLOP_PER_ATTN_PAIR_8B", "ATTN_PEAK_FRACTION", "StepModel"]

# 32 layers * 8 KV heads * 128 head_dim * 2 (K and V) * 2 bytes (fp16/bf16)
KV_BYTES_PER_TOKEN_8B = 32 * 8 * 128 * 2 * 2  # = 131072 B = 128 KiB


@dataclass(frozen=True, kw_only=True)
class AdmissionParams:
    """The admission semantics an :class:`EngineProfile` and an ``EngineConfig`` share (keyword-only
    fields; ``EngineConfig.from_profile`` copies them): ``admission`` "vllm" (v1: no KV reserved for
    future output) or "sglang" (reserve KV for expected output, new-token-ratio schedule, retraction;
    engine/sglang.py). The sgl_* fields are SGLang's parameters (v0.4.6.post5 defaults), used only in
    "sglang" mode."""

    admission: str = "vllm"
    sgl_init_new_token_ratio: float = 0.7
    sgl_min_new_token_ratio_factor: float = 0.14
    sgl_new_token_ratio_decay_steps: int = 600
    sgl_schedule_conservativeness: float = 1.0
    sgl_clip_max_new_tokens: int = 4096
    sgl_retract_decode_steps: int = 20
    sgl_max_prefill_tokens: int = 16384


@dataclass(frozen=True)
class EngineProfile(AdmissionParams):
    name: str
    source: str  # citation of the measurements this profile is calibrated from
    step: StepModel  # the GPU time of one step (engine/step_model.py)
    # per-request fixed TTFT overhead (seconds)
    ttft_overhead_s: float
    # KV cache / scheduler limits
    num_gpu_blocks: int
    block_tokens: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 32768
    # informational (hardware / model), used only for documentation and sanity checks
    gpu: str = ""
    model: str = ""
    hbm_bytes: int = 0
    hbm_bandwidth_bytes_s: float = 0.0
    weight_bytes: int = 0
    kv_bytes_per_token: int = KV_BYTES_PER_TOKEN_8B

    def __post_init__(self) -> None:
        if not isinstance(self.step, StepModel):
            raise ValueError(f"profile {self.name!r}: step must be a StepModel, got {type(self.step).__name__}")
        if not self.ttft_overhead_s >= 0:
            raise ValueError(f"profile {self.name!r}: ttft_overhead_s must be >= 0")
        for f in ("num_gpu_blocks", "block_tokens", "max_num_seqs",
                  "max_num_batched_tokens", "max_model_len"):
            if getattr(self, f) < 1:
                raise ValueError(f"profile {self.name!r}: {f} must be >= 1")
        check_admission(self, f"profile {self.name!r}")

    def step_time(self, chunks: Iterable[Tuple[int, int]] = (), decode_contexts: Iterable[int] = ()) -> float:
        """Seconds of one iteration (``StepModel.time``): ``chunks`` = (new tokens, tokens computed before)
        per prefill chunk, ``decode_contexts`` = each decode's context; 0 if nothing is scheduled."""
        return self.step.time(chunks, decode_contexts)

    def batch1_ttft(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """TTFT of a lone request whose ``prompt_tokens - cached_tokens`` uncached tokens prefill in one
        step (no chunking): ``ttft_overhead_s`` + that step."""
        return self.ttft_overhead_s + self.step.prefill_time(prompt_tokens - cached_tokens, cached_tokens)

    def ttft_line(self, max_tokens: int = 2048) -> Tuple[float, float]:
        """``(base_s, slope_s_per_token)``: the least-squares line through :meth:`batch1_ttft` over prompts of
        16..``max_tokens`` tokens -- what a TTFT-vs-input-length regression on this engine measures
        (GORGO's Table 1 line; GORGO's constant ``t_p`` is its slope)."""
        xs = list(range(16, max_tokens + 1, 16))
        ys = [self.batch1_ttft(n) for n in xs]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        return my - slope * mx, slope

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_tokens


ADMISSION_MODES = ("vllm", "sglang")
#: the admission fields an EngineProfile and an EngineConfig share (copied by EngineConfig.from_profile)
ADMISSION_FIELDS = tuple(f.name for f in fields(AdmissionParams))


def check_admission(obj, what: str) -> None:
    """ValueError naming the field if ``obj``'s admission fields are out of range."""
    if obj.admission not in ADMISSION_MODES:
        raise ValueError(f"{what}: admission must be one of {ADMISSION_MODES}, got {obj.admission!r}")
    for f in ("sgl_init_new_token_ratio", "sgl_min_new_token_ratio_factor"):
        v = getattr(obj, f)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{what}: {f} must be in [0, 1], got {v!r}")
    if not obj.sgl_schedule_conservativeness >= 0.0:
        raise ValueError(f"{what}: sgl_schedule_conservativeness must be >= 0, "
                         f"got {obj.sgl_schedule_conservativeness!r}")
    for f in ("sgl_new_token_ratio_decay_steps", "sgl_clip_max_new_tokens", "sgl_retract_decode_steps",
              "sgl_max_prefill_tokens"):
        v = getattr(obj, f)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{what}: {f} must be an int >= 1, got {v!r}")


def _kv_blocks(hbm_bytes: float, weight_bytes: float, util: float = 0.9,
               kv_bytes_per_token: int = KV_BYTES_PER_TOKEN_8B, block_tokens: int = 16) -> int:
    """vLLM-style KV budget: hbm * gpu_memory_utilization - weights (activations ignored)."""
    return int((hbm_bytes * util - weight_bytes) // kv_bytes_per_token) // block_tokens


# ---------------------------------------------------------------------------------------
# The measured profiles: llama3.1-8b-h100, llama3.1-8b-h200
# Source: GPU step times of a Llama-3.1-8B-shaped forward pass (bf16, torch SDPA, CUDA graphs) on
# H100 80GB HBM3 SXMs (three machines: 44 + 44 rows on 2026-11-26, 23 long-context rows on 2026-11-28)
# and H200s (44 rows, then 23 long-context rows on another machine), committed in
# ray_geolb/data/gpu_step_times/llama3.1-8b_steps.json (source and license inside). The StepModels
# below are what `python -m ray_geolb.engine.step_fit` prints (5 significant digits; tests/engine/
# test_step_model_fits_gpu_measurements.py refits and compares). What the fit says (H100 / H200):
#  * floor of a step o + g*k: 7.2 / 5.8 ms (the weight read); knee k: 188 / 82 tokens;
#  * g: 24.2 / 22.2 us per token once the GEMMs are compute-bound (~660-720 TFLOP/s);
#  * a: 43.7 / 28.8 ns per decode context token (128 KiB of K/V: 3.0 / 4.6 TB/s), a lone decode included;
#  * q: 1.527 / 1.513 ns per prefill-attention pair (32 layers x 4 x 4096 FLOP = 0.52 MFLOP: ~340 TFLOP/s);
#  * m: 106 / 112 ns per context token: a prefill chunk's floor, one 64-query tile's pass over its
#    context (m / q = 69 / 74 tokens); it prices chunks only, never decodes;
#  * k_c 0.88 / 0.58 ms per prefill chunk, k_d 0.38 / 0.34 ms per decode batch (their own kernels).
# Not measured: the TTFT overhead outside the step loop (API server, tokenisation): 20 ms assumed, as
# before. vLLM's FlashAttention/FlashInfer kernels with fused norms are somewhat faster per step than
# torch SDPA (the data's README), so these profiles are conservative for vLLM.
#  * KV: the card's memory as torch reports it (85,017,493,504 B on the H100, 150,109,880,320 B on the
#    H200) * 0.9 - 16.06 GB of weights, at 128 KiB/token.
#  * limits: vLLM defaults on >= 70 GiB Hopper GPUs for the OpenAI server: max_num_seqs 1024,
#    max_num_batched_tokens 8192.
# ---------------------------------------------------------------------------------------
_LLAMA8B_W = 8_030_261_248 * 2
_H100_MEM = 85_017_493_504
_H200_MEM = 150_109_880_320
H100_STEP = StepModel(overhead_s=2.6916e-03, gemm_per_token_s=2.4189e-05, knee_tokens=188,
                      decode_attn_per_ctx_token_s=4.3712e-08, prefill_attn_per_pair_s=1.5274e-09,
                      lone_attn_per_ctx_token_s=1.0575e-07, chunk_overhead_s=8.8073e-04, decode_overhead_s=3.8233e-04)
H200_STEP = StepModel(overhead_s=3.9503e-03, gemm_per_token_s=2.2180e-05, knee_tokens=82,
                      decode_attn_per_ctx_token_s=2.8774e-08, prefill_attn_per_pair_s=1.5127e-09,
                      lone_attn_per_ctx_token_s=1.1163e-07, chunk_overhead_s=5.8254e-04, decode_overhead_s=3.4295e-04)
_MEASURED = ("MEASURED: step model fitted to GPU step times of a Llama-3.1-8B-shaped model on {gpu} "
             "(ray_geolb/data/gpu_step_times/llama3.1-8b_steps.json; python -m ray_geolb.engine.step_fit); "
             "KV from {mem:,} B * 0.9 - 16.06 GB weights; TTFT overhead 20 ms assumed (not measured)")
LLAMA31_8B_H100 = EngineProfile(
    name="llama3.1-8b-h100",
    source=_MEASURED.format(gpu="H100 80GB HBM3 SXMs (3 runs, 111 rows)", mem=_H100_MEM),
    step=H100_STEP,
    ttft_overhead_s=0.020,
    num_gpu_blocks=_kv_blocks(_H100_MEM, _LLAMA8B_W),  # 28,827
    block_tokens=16,
    max_num_seqs=1024,
    max_num_batched_tokens=8192,
    max_model_len=32768,
    gpu="NVIDIA H100 80GB HBM3 (SXM)",
    model="meta-llama/Llama-3.1-8B-Instruct",
    hbm_bytes=_H100_MEM,
    hbm_bandwidth_bytes_s=3.35e12,
    weight_bytes=_LLAMA8B_W,
)
LLAMA31_8B_H200 = replace(
    LLAMA31_8B_H100,
    name="llama3.1-8b-h200",
    source=_MEASURED.format(gpu="H200s (2 runs, 67 rows)", mem=_H200_MEM),
    step=H200_STEP,
    num_gpu_blocks=_kv_blocks(_H200_MEM, _LLAMA8B_W),  # 56,761
    gpu="NVIDIA H200",
    hbm_bytes=_H200_MEM,
    hbm_bandwidth_bytes_s=4.8e12,
)

# ---------------------------------------------------------------------------------------
# Prefill attention of the unmeasured cards: a DERIVATION, not a measurement.
# One (new token, attended token) pair costs QK^T + PV = 2 x 2 x 4096 FLOP per layer, x 32 layers =
# 524,288 FLOP (Llama-3.1-8B and Mistral-7B alike). The H100 fit on the first grids gave q = 1.547 ns per
# pair: 339 TFLOP/s, 34.3 % of the H100 SXM's 989 TFLOP/s dense bf16 peak. Assuming the same fraction of
# each card's own peak: A100 (312 TFLOP/s) q = 4.90 ns; L4 (121 TFLOP/s) q = 12.6 ns. That q is pinned
# here (_H100_Q_FIRST_GRIDS): the refit with the long-context rows moved the H100's q by 1.3 % (1.527 ns),
# far inside what this derivation can claim, and pinning it keeps the paper-anchored profiles where their
# anchors put them. A short chunk's floor m is taken as the decode rate (m = a, as before): their anchors
# say nothing about it, and their engines (SGLang / vLLM kernels) are not the measured torch SDPA.
# ---------------------------------------------------------------------------------------
FLOP_PER_ATTN_PAIR_8B = 2 * 2 * 4096 * 32
_H100_Q_FIRST_GRIDS = 1.547e-9  # the H100's q fitted on the first two 44-row grids (see above)
ATTN_PEAK_FRACTION = FLOP_PER_ATTN_PAIR_8B / _H100_Q_FIRST_GRIDS / 989e12  # ~0.343


def _derived_q(peak_bf16_flops: float) -> float:
    return FLOP_PER_ATTN_PAIR_8B / (ATTN_PEAK_FRACTION * peak_bf16_flops)


# ---------------------------------------------------------------------------------------
# mistral-7b-a100
# Source: GORGO, Table 1: SGLang serving Mistral-7B on one A100, TTFT measured over 87
# WildChat prompts, linear fit TTFT = 150.72 ms + 0.0938 ms/token (high R^2).
#  * decode step (batch 1): weights 7,241,732,096 params * 2 B = 14.48 GB; A100-80GB SXM
#    HBM2e 2.039 TB/s (NVIDIA A100 datasheet) -> 7.1 ms pure weight read; public vLLM /
#    SGLang batch-1 inter-token latencies for 7B fp16 on A100 are ~12-15 ms (bandwidth
#    utilisation ~50-60 %, plus launch overhead).  We take o = 12 ms (no knee: k = 0).
#  * a = m: reading one token's K/V, 131,072 B / 2.039e12 B/s = 64.3 ns.
#  * q = 4.90 ns per pair (derived above).
#  * g: a prefill of n tokens at batch 1 costs o + g*n + max(q*n^2/2, a*n). GORGO's line is linear over
#    its 87 WildChat prompts (lengths not given), so its 0.0938 ms/token slope absorbed the attention's
#    n^2 term. g is the minimax choice that keeps batch-1 TTFT closest to GORGO's line over 16..4,000-token
#    prompts: g = 86.57 us/token, within 2.0 % of the line there (+11 % at 8,000 tokens, where the n^2
#    term dominates and a line no longer describes the engine). 2 * 7.24e9 FLOP / 86.57 us = 167 TFLOP/s
#    = 54 % of the A100's 312 TFLOP/s bf16 peak.
#  * fixed overhead: 150.72 ms intercept - 12 ms = 138.72 ms per request.
#  * KV: 80 GiB * 0.9 - 14.48 GB = 62.83 GB / 128 KiB = 479,323 tokens = 29,957 blocks of 16 tokens.
#  * limits: max_num_seqs 256 (vLLM default); max_num_batched_tokens 8192 (SGLang's
#    default chunked_prefill_size on >= 80 GB GPUs), so prompts <= 8k prefill in one step.
# ---------------------------------------------------------------------------------------
_A100_HBM = 80 * 2**30
_MISTRAL_W = 7_241_732_096 * 2
_A100_BW = 2.039e12
_MISTRAL_ATTN = KV_BYTES_PER_TOKEN_8B / _A100_BW
MISTRAL_7B_A100 = EngineProfile(
    name="mistral-7b-a100",
    source=("GORGO Table 1 (SGLang, Mistral-7B, 1x A100): TTFT = 150.72 ms + 0.0938 ms/token "
            "(linear fit, 87 WildChat prompts); decode floor from A100 HBM 2.039 TB/s; prefill attention "
            "derived from the H100 fit's fraction of peak (not measured); "
            "KV from 128 KiB/token on 80 GiB * 0.9 - 14.48 GB weights"),
    step=StepModel(overhead_s=0.012, gemm_per_token_s=8.657e-5, knee_tokens=0,
                   decode_attn_per_ctx_token_s=_MISTRAL_ATTN, prefill_attn_per_pair_s=_derived_q(312e12),
                   lone_attn_per_ctx_token_s=_MISTRAL_ATTN),
    ttft_overhead_s=0.15072 - 0.012,
    num_gpu_blocks=_kv_blocks(_A100_HBM, _MISTRAL_W),  # 29,957
    block_tokens=16,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=32768,
    gpu="NVIDIA A100-SXM4-80GB",
    model="mistralai/Mistral-7B-Instruct",
    hbm_bytes=_A100_HBM,
    hbm_bandwidth_bytes_s=_A100_BW,
    weight_bytes=_MISTRAL_W,
)

# ---------------------------------------------------------------------------------------
# llama3.1-8b-l4
# Source: SkyLB §2.1: ~300 ms to prefill a 512-token prompt with Llama-3.1-8B-Instruct on
# one NVIDIA L4 (24 GB GDDR6, 300 GB/s); SkyLB observed 20-50 outstanding requests per
# L4 replica.  SkyLB gives one end-to-end figure, so we attribute all of it to the
# prefill step (ttft_overhead = 0) to avoid inventing a split:
#    TTFT(512) at batch 1 = o + 512 * g + max(q * 512^2 / 2, a * 512) = 300 ms.
#  * o: 8,030,261,248 params * 2 B = 16.06 GB / 300 GB/s = 53.5 ms (no knee: k = 0).
#  * a = m: 131,072 B / 300e9 B/s = 0.437 us per context token.
#  * q = 12.6 ns per pair (derived above): 1.65 ms for the 512-token prompt.
#  * g: (300 - 53.5 - 1.65) ms / 512 = 0.478 ms/token (2 * 8.03e9 FLOP / 0.478 ms = 34 TFLOP/s, 28 %
#    of the L4's 121 TFLOP/s dense bf16 peak; the 72 W L4 is power-limited, so plausible).
#  * KV: nvidia-smi reports 23,034 MiB on an L4: 23,034 MiB * 0.9 - 16.06 GB = 5.68 GB
#    / 128 KiB = 43,312 tokens = 2,707 blocks.
#  * limits: vLLM defaults on < 70 GiB GPUs for the OpenAI server: max_num_seqs 256,
#    max_num_batched_tokens 2048 (the 512-token prompt prefills in one step).
# ---------------------------------------------------------------------------------------
_L4_HBM = 23_034 * 2**20
_L4_BW = 300e9
_L4_BASE = _LLAMA8B_W / _L4_BW  # 53.5 ms
_L4_ATTN = KV_BYTES_PER_TOKEN_8B / _L4_BW
_L4_Q = _derived_q(121e12)
_L4_PAIRS_512 = max(_L4_Q * 512 * 256, _L4_ATTN * 512)
LLAMA31_8B_L4 = EngineProfile(
    name="llama3.1-8b-l4",
    source=("SkyLB §2.1: ~300 ms prefill of a 512-token prompt, Llama-3.1-8B-Instruct on 1x L4; "
            "decode floor 16.06 GB / 300 GB/s; prefill attention derived from the H100 fit's fraction of "
            "peak (not measured); KV from 128 KiB/token on 23,034 MiB * 0.9 - 16.06 GB"),
    step=StepModel(overhead_s=_L4_BASE, gemm_per_token_s=(0.300 - _L4_BASE - _L4_PAIRS_512) / 512, knee_tokens=0,
                   decode_attn_per_ctx_token_s=_L4_ATTN, prefill_attn_per_pair_s=_L4_Q,
                   lone_attn_per_ctx_token_s=_L4_ATTN),
    ttft_overhead_s=0.0,
    num_gpu_blocks=_kv_blocks(_L4_HBM, _LLAMA8B_W),  # 2,707
    block_tokens=16,
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    max_model_len=32768,
    gpu="NVIDIA L4",
    model="meta-llama/Llama-3.1-8B-Instruct",
    hbm_bytes=_L4_HBM,
    hbm_bandwidth_bytes_s=_L4_BW,
    weight_bytes=_LLAMA8B_W,
)

# ---------------------------------------------------------------------------------------
# llama3.1-8b-l4-sglang
# SkyLB ran Llama-3.1-8B-Instruct "via SGLang" on one L4 per replica (§5 "Experiment setup"), so its
# experiments use this profile: the same GPU and step-time model as llama3.1-8b-l4, with SGLang's
# admission semantics and defaults (v0.4.6.post5, engine/sglang.py):
#  * KV: mem_fraction_static 0.88 for tp=1 (srt/server_args.py:246-261): 23,034 MiB * 0.88
#    - 16.06 GB = 39,616 tokens = 2,476 blocks (SGLang sizes its pool from the memory left after
#    loading the weights; CUDA context and activations lower it somewhat on a real L4).
#  * max_running_requests = min(pool tokens // 2, req_to_token pool size) = 2,049 on an L4
#    (srt/managers/tp_worker.py:119-127, srt/model_executor/model_runner.py:845-853, 903-904):
#    KV binds first.
#  * chunked_prefill_size 2,048 on GPUs under 25,000 MiB (server_args.py:271-277), kept in
#    max_num_batched_tokens; max_prefill_tokens 16,384; new-token ratio 0.7 / 0.14 / 600 decode
#    steps; clip 4,096; retract_decode_steps 20 (the sgl_* field defaults).
# ---------------------------------------------------------------------------------------
LLAMA31_8B_L4_SGLANG = replace(
    LLAMA31_8B_L4,
    name="llama3.1-8b-l4-sglang",
    source=(LLAMA31_8B_L4.source + "; SGLang v0.4.6.post5 admission (SkyLB's engine): KV from "
            "23,034 MiB * 0.88 - 16.06 GB, max_running_requests 2,049, chunked prefill 2,048"),
    num_gpu_blocks=_kv_blocks(_L4_HBM, _LLAMA8B_W, util=0.88),  # 2,476
    max_num_seqs=2049,
    admission="sglang",
)

PROFILES: dict[str, EngineProfile] = {
    p.name: p for p in (MISTRAL_7B_A100, LLAMA31_8B_L4, LLAMA31_8B_L4_SGLANG, LLAMA31_8B_H100, LLAMA31_8B_H200)
}


def get_profile(name: str) -> EngineProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown engine profile {name!r}; known profiles: {', '.join(sorted(PROFILES))}"
        ) from None
