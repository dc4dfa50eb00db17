"""Calibrated performance profiles of one LLM serving replica (one GPU).

Step-time model of ONE continuous-batching iteration (vLLM v1 / SGLang style, chunked
prefill mixes prefill chunks and decodes in the same forward pass)::

    t_step = step_base_s
           + prefill_per_token_s * prefill_tokens        # tokens prefilled this step
           + decode_per_seq_s    * decode_seqs           # sequences decoding 1 token
           + attn_per_ctx_token_s * context_tokens       # sum over scheduled requests of
                                                         # (computed + new) tokens

* ``step_base_s``: reading all weights once (memory-bound floor of a forward pass) plus
  launch/scheduler overhead: the decode step time at batch size 1.
* ``prefill_per_token_s`` / ``decode_per_seq_s``: GEMM work per token (~2 * n_params FLOP).
  A decoded token costs the same GEMM FLOPs as a prefilled token, so both use the
  measured prefill slope (a linear model; it overestimates a little at very small decode
  batches, where the GEMMs hide under the weight read).
* ``attn_per_ctx_token_s``: reading one token's K and V of every layer from HBM
  (kv_bytes_per_token / HBM bandwidth): the part of a step that grows with context.
* ``ttft_overhead_s``: per-request fixed latency outside the step loop (API server,
  tokenisation, scheduling, first detokenisation, network in the measurement). The engine
  model keeps a request "pending" for this long before it can be scheduled, so at batch
  size 1: TTFT(n) = ttft_overhead_s + t_step(prefill n tokens).

Profiles are calibrated ONLY from single-engine measurements cited next to each profile,
never from routing results.  KV capacity is computed from the architecture:
Llama-3.1-8B and Mistral-7B both have 32 layers x 8 KV heads x 128 head dim x 2 (K, V)
x 2 bytes (fp16/bf16) = 131,072 B = 128 KiB per token.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

__all__ = ["AdmissionParams", "EngineProfile", "PROFILES", "get_profile", "KV_BYTES_PER_TOKEN_8B", "ADMISSION_MODES",
           "ADMISSION_FIELDS", "check_admission"]

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
    # step-time model (seconds)
    step_base_s: float
    prefill_per_token_s: float
    decode_per_seq_s: float
    attn_per_ctx_token_s: float
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
        for f in ("step_base_s", "prefill_per_token_s", "decode_per_seq_s",
                  "attn_per_ctx_token_s", "ttft_overhead_s"):
            if getattr(self, f) < 0:
                raise ValueError(f"profile {self.name!r}: {f} must be >= 0")
        for f in ("num_gpu_blocks", "block_tokens", "max_num_seqs",
                  "max_num_batched_tokens", "max_model_len"):
            if getattr(self, f) < 1:
                raise ValueError(f"profile {self.name!r}: {f} must be >= 1")
        check_admission(self, f"profile {self.name!r}")

    def step_time(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """Duration (s) of one iteration; 0 if nothing is scheduled."""
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        return (self.step_base_s + self.prefill_per_token_s * prefill_tokens
                + self.decode_per_seq_s * decode_seqs
                + self.attn_per_ctx_token_s * context_tokens)

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
# mistral-7b-a100
# Source: GORGO, Table 1: SGLang serving Mistral-7B on one A100, TTFT measured over 87
# WildChat prompts, linear fit TTFT = 150.72 ms + 0.0938 ms/token (high R^2).
#  * decode step (batch 1): weights 7,241,732,096 params * 2 B = 14.48 GB; A100-80GB SXM
#    HBM2e 2.039 TB/s (NVIDIA A100 datasheet) -> 7.1 ms pure weight read; public vLLM /
#    SGLang batch-1 inter-token latencies for 7B fp16 on A100 are ~12-15 ms (bandwidth
#    utilisation ~50-60 %, plus launch overhead).  We take step_base = 12 ms.
#  * attention per context token: 131,072 B / 2.039e12 B/s = 64.3 ns.
#  * prefill slope: the fitted 0.0938 ms/token covers GEMMs + attention of a prompt at
#    batch 1, so prefill_per_token = 0.0938 ms - 64.3 ns = 0.0937357 ms (the prefill
#    step of an n-token prompt attends over n context tokens).  Check: 2 * 7.24e9 FLOP
#    / 0.0937 ms = 155 TFLOP/s = 50 % of the A100's 312 TFLOP/s bf16 peak: plausible.
#  * fixed overhead: 150.72 ms intercept - 12 ms step base = 138.72 ms per request.
#    => TTFT(n) at batch 1 = 138.72 + 12 + 0.0938 n ms, exactly the GORGO fit.
#  * decode_per_seq: same GEMM cost per token as the prefill slope (see module doc).
#  * KV: 80 GiB * 0.9 - 14.48 GB = 62.83 GB / 128 KiB = 479,323 tokens = 29,957 blocks
#    of 16 tokens.
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
            "(linear fit, 87 WildChat prompts); decode floor from A100 HBM 2.039 TB/s; "
            "KV from 128 KiB/token on 80 GiB * 0.9 - 14.48 GB weights"),
    step_base_s=0.012,
    prefill_per_token_s=0.0938e-3 - _MISTRAL_ATTN,
    decode_per_seq_s=0.0938e-3 - _MISTRAL_ATTN,
    attn_per_ctx_token_s=_MISTRAL_ATTN,
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
#    TTFT(512) at batch 1 = step_base + 512 * (prefill_per_token + attn) = 300 ms.
#  * decode step floor: 8,030,261,248 params * 2 B = 16.06 GB / 300 GB/s = 53.5 ms.
#  * attention per context token: 131,072 B / 300e9 B/s = 0.437 us.
#  * prefill slope: (300 - 53.5) ms / 512 - 0.437 us = 0.4810 ms/token
#    (= 2 * 8.03e9 FLOP / 0.481 ms = 33 TFLOP/s, 27 % of the L4's 121 TFLOP/s dense
#    bf16 peak; the 72 W L4 is power-limited, so plausible).
#  * KV: nvidia-smi reports 23,034 MiB on an L4: 23,034 MiB * 0.9 - 16.06 GB = 5.68 GB
#    / 128 KiB = 43,312 tokens = 2,707 blocks.
#  * limits: vLLM defaults on < 70 GiB GPUs for the OpenAI server: max_num_seqs 256,
#    max_num_batched_tokens 2048 (the 512-token prompt prefills in one step).
# ---------------------------------------------------------------------------------------
_L4_HBM = 23_034 * 2**20
_L4_BW = 300e9
_LLAMA8B_W = 8_030_261_248 * 2
_L4_BASE = _LLAMA8B_W / _L4_BW  # 53.5 ms
_L4_ATTN = KV_BYTES_PER_TOKEN_8B / _L4_BW
_L4_PREFILL = (0.300 - _L4_BASE) / 512 - _L4_ATTN
LLAMA31_8B_L4 = EngineProfile(
    name="llama3.1-8b-l4",
    source=("SkyLB §2.1: ~300 ms prefill of a 512-token prompt, Llama-3.1-8B-Instruct on 1x L4; "
            "decode floor 16.06 GB / 300 GB/s; KV from 128 KiB/token on 23,034 MiB * 0.9 - 16.06 GB"),
    step_base_s=_L4_BASE,
    prefill_per_token_s=_L4_PREFILL,
    decode_per_seq_s=_L4_PREFILL,
    attn_per_ctx_token_s=_L4_ATTN,
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

# ---------------------------------------------------------------------------------------
# llama3.1-8b-h100  (DATASHEET-DERIVED ESTIMATE, not fitted to a TTFT measurement)
# Source: NVIDIA H100 SXM5 datasheet: 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense bf16.
#  * decode floor: 16.06 GB / 3.35 TB/s = 4.8 ms; with the same ~60 % achieved bandwidth
#    as on the A100 profile (7.1 ms ideal -> 12 ms): ~8 ms.
#  * prefill slope: 2 * 8.03e9 FLOP at 50 % MFU (the A100 profile's measured MFU)
#    = 16.06e9 / 494.5e12 = 32.5 us/token.
#  * fixed overhead: taken as 20 ms (no measurement; API server + tokenisation).
#  * KV: 80 GiB * 0.9 - 16.06 GB = 61.25 GB / 128 KiB = 467,291 tokens = 29,205 blocks.
#  * limits: vLLM defaults on >= 70 GiB Hopper GPUs for the OpenAI server:
#    max_num_seqs 1024, max_num_batched_tokens 8192.
# ---------------------------------------------------------------------------------------
_H100_HBM = 80 * 2**30
_H100_BW = 3.35e12
LLAMA31_8B_H100 = EngineProfile(
    name="llama3.1-8b-h100",
    source=("ESTIMATE from NVIDIA H100 SXM datasheet (3.35 TB/s, 989 TFLOP/s bf16) with the "
            "bandwidth/MFU efficiencies measured for mistral-7b-a100; not directly measured"),
    step_base_s=0.008,
    prefill_per_token_s=2 * 8_030_261_248 / (0.5 * 989e12),
    decode_per_seq_s=2 * 8_030_261_248 / (0.5 * 989e12),
    attn_per_ctx_token_s=KV_BYTES_PER_TOKEN_8B / _H100_BW,
    ttft_overhead_s=0.020,
    num_gpu_blocks=_kv_blocks(_H100_HBM, _LLAMA8B_W),  # 29,205
    block_tokens=16,
    max_num_seqs=1024,
    max_num_batched_tokens=8192,
    max_model_len=32768,
    gpu="NVIDIA H100-SXM5-80GB",
    model="meta-llama/Llama-3.1-8B-Instruct",
    hbm_bytes=_H100_HBM,
    hbm_bandwidth_bytes_s=_H100_BW,
    weight_bytes=_LLAMA8B_W,
)

PROFILES: dict[str, EngineProfile] = {
    p.name: p for p in (MISTRAL_7B_A100, LLAMA31_8B_L4, LLAMA31_8B_L4_SGLANG, LLAMA31_8B_H100)
}


def get_profile(name: str) -> EngineProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown engine profile {name!r}; known profiles: {', '.join(sorted(PROFILES))}"
        ) from None
