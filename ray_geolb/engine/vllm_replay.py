"""Cross-check of :class:`~ray_geolb.engine.engine.EngineModel` against vLLM's real v1 scheduler.

One trace (requests with an arrival *step index*, prompt token ids and max output tokens) is replayed
through (a) vLLM's own ``vllm.v1.core.sched.scheduler.Scheduler`` + ``KVCacheManager`` (prefix caching,
block size 16, chunked prefill; no forward pass: one sampled token is fed back per request whose
prefill is complete) and (b) the project's ``EngineModel`` with the same limits, in lockstep: at step
``i`` both get the requests arriving at ``i``, then each runs one step.  Every step of both is priced
with the same :class:`~ray_geolb.engine.step_model.StepModel` from what was scheduled (prefill chunks
(new tokens, computed before) and decode contexts), and the steps are compared: scheduled requests,
tokens per request, prefix-cache hit tokens of requests admitted from the waiting queue, preemptions.

Block counts: vLLM's block pool keeps one block as its null block, so ``num_blocks`` vLLM blocks hold
``num_blocks - 1`` usable blocks; the engine model gets ``num_blocks - 1``.

vLLM is imported lazily (inside functions): ``import ray_geolb.engine`` never needs it.  Building the
scheduler on CPU takes an offline hub (``HF_HUB_OFFLINE=1``), the model-class inspection run in-process
instead of in a subprocess, a hand-written Llama-3.1-8B ``config.json`` (``ray_geolb/data/vllm_llama8b/``)
and no weights; ``device_config`` cpu and the KV cache config set by hand (see :class:`VllmSchedulerSide`).
Callers run the project's torch-extras guard (``ray_geolb.serve.llm_server.guard_broken_torch_extras()``)
before the first call: this package does not import ``ray_geolb.serve``.
"""

from __future__ import annotations

import os
import time
import zlib
from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .engine import EngineConfig, EngineModel, EngineRequest
from .profiles import get_profile
from .step_model import StepModel
from .tokens import blocks_from_hash_ids

__all__ = ["TraceRequest", "StepRecord", "Divergence", "CrosscheckResult", "replay", "time_steps",
           "default_step_model", "token_block_hashes", "VllmSchedulerSide", "EngineModelSide",
           "LLAMA8B_CONFIG_DIR"]

#: the hand-written Llama-3.1-8B config.json (no weights, no tokenizer)
LLAMA8B_CONFIG_DIR = Path(__file__).resolve().parent.parent / "data" / "vllm_llama8b"
BLOCK = 16
_PROFILE = "llama3.1-8b-h100"


@dataclass(frozen=True)
class TraceRequest:
    arrival_step: int
    prompt_token_ids: Tuple[int, ...]
    max_tokens: int
    request_id: str = ""
    #: the tokens vLLM "samples" (fed back in order; empty: synthetic ones). A multi-turn trace passes
    #: the answer here so that vLLM's cached output blocks can hit in the next turn's prompt
    output_token_ids: Tuple[int, ...] = ()


@dataclass
class StepRecord:
    """What one side scheduled in one step."""

    #: rid -> (tokens scheduled, tokens computed before them)
    sched: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    #: rid -> prefix-cache hit tokens, for requests admitted from the waiting queue this step
    #: (new or resumed after a preemption)
    admitted: Dict[str, int] = field(default_factory=dict)
    resumed: frozenset = frozenset()  # admitted rids that had been preempted before
    preempted: frozenset = frozenset()
    finished: frozenset = frozenset()
    chunks: List[Tuple[int, int]] = field(default_factory=list)
    decode_contexts: List[int] = field(default_factory=list)
    time_s: float = 0.0


@dataclass(frozen=True)
class Divergence:
    step: int
    kind: str  # "scheduled" | "tokens" | "hits" | "preempted"
    detail: str


@dataclass
class CrosscheckResult:
    steps: int  # lockstep steps where either side scheduled something
    agree_scheduled: float  # fraction of those steps with the same set of scheduled requests
    agree_tokens: float  # ... with the same tokens for every request
    agree_hits: float  # of steps where either side admitted: same admitted set and same hit tokens
    agree_preempted: float  # of steps where either side preempted: the same preempted set
    first_divergence_step: Optional[int]
    divergences: List[Divergence]
    hit_tokens: Tuple[int, int]  # (vllm, engine): hits of first admissions
    resume_hit_tokens: Tuple[int, int]  # (vllm, engine): hits of re-admissions after a preemption
    preemptions: Tuple[int, int]
    busy_steps: Tuple[int, int]  # non-empty steps of each side
    sim_time_s: Tuple[float, float]  # summed StepModel times
    finish_step_agree: float  # fraction of requests that finished in the same step on both sides
    first_hit_agree: float  # fraction of requests whose first-admission hit is the same on both sides
    unfinished: Tuple[int, int]
    records: Optional[List[Tuple[StepRecord, StepRecord]]] = None

    def table(self) -> str:
        v, e = "vLLM", "EngineModel"
        rows = [
            ("lockstep steps with work", self.steps, ""),
            ("same scheduled set", f"{self.agree_scheduled:.1%}", ""),
            ("same tokens per request", f"{self.agree_tokens:.1%}", ""),
            ("same admissions + hit tokens", f"{self.agree_hits:.1%}", ""),
            ("same preempted set", f"{self.agree_preempted:.1%}", ""),
            ("first divergence at step", self.first_divergence_step, ""),
            ("requests finishing in the same step", f"{self.finish_step_agree:.1%}", ""),
            ("requests with the same first hit", f"{self.first_hit_agree:.1%}", ""),
            (f"hit tokens, first admissions ({v} / {e})", *self.hit_tokens),
            (f"hit tokens, resumes ({v} / {e})", *self.resume_hit_tokens),
            (f"preemptions ({v} / {e})", *self.preemptions),
            (f"busy steps ({v} / {e})", *self.busy_steps),
            (f"simulated GPU time s ({v} / {e})", f"{self.sim_time_s[0]:.3f}", f"{self.sim_time_s[1]:.3f}"),
        ]
        return "\n".join(f"  {a:<44} {str(b):>12} {str(c):>12}" for a, b, c in rows)


# ---------------------------------------------------------------------------------------------- helpers
def default_step_model() -> StepModel:
    """The H100 profile's StepModel once profiles carry one (``profile.step``), else the same constants."""
    step = getattr(get_profile(_PROFILE), "step", None)
    if isinstance(step, StepModel):
        return step
    return StepModel(overhead_s=2.7e-3, gemm_per_token_s=24.4e-6, knee_tokens=190,
                     decode_attn_per_ctx_token_s=43.8e-9, prefill_attn_per_pair_s=1.547e-12,
                     lone_attn_per_ctx_token_s=105e-9, chunk_overhead_s=0.73e-3, decode_overhead_s=0.3e-3)


def token_block_hashes(token_ids: Sequence[int], block: int = BLOCK) -> List[int]:
    """Chained hashes of the full blocks of ``token_ids`` (equal prefixes -> equal leading hashes)."""
    n = len(token_ids) // block
    ids = [zlib.crc32(array("q", token_ids[i * block:(i + 1) * block]).tobytes()) for i in range(n)]
    return blocks_from_hash_ids(ids)


def _rid(i: int, r: TraceRequest) -> str:
    return r.request_id or f"r{i}"


def _note_admissions(rec: StepRecord, before, admitted_once: set) -> None:
    """Requests ``rec`` scheduled that were not running ``before`` the step: admitted (with the tokens
    computed before them: their hit), and resumed if admitted once before (both sides alike)."""
    resumed = set()
    for rid, (_n, c) in rec.sched.items():
        if rid not in before:
            rec.admitted[rid] = c
            if rid in admitted_once:
                resumed.add(rid)
            admitted_once.add(rid)
    rec.resumed = frozenset(resumed)


def _split(rec: StepRecord, rid: str, n: int, c: int, has_output: bool, total: int) -> None:
    rec.sched[rid] = (n, c)
    if n == 1 and has_output and c + 1 == total:
        rec.decode_contexts.append(c + 1)
    else:
        rec.chunks.append((n, c))


# ---------------------------------------------------------------------------------------------- vLLM
def _import_vllm():
    """Import vLLM's model registry with the model-class inspection run in-process. The CALLER must have
    run ``ray_geolb.serve.llm_server.guard_broken_torch_extras()`` first where this venv's torchvision /
    torchaudio do not match its torch (this package imports nothing from ``ray_geolb.serve``:
    tests/engine/test_engine_imports_neither_sim_nor_serve.py)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import vllm.model_executor.models.registry as registry
    except Exception as e:  # pragma: no cover - environment problem
        raise ImportError(f"importing vLLM failed ({e!r}); call ray_geolb.serve.llm_server."
                          "guard_broken_torch_extras() before the vLLM cross-check") from e

    registry._run_in_subprocess = lambda fn: fn()  # inspect the model class in-process (the note)


class VllmSchedulerSide:
    """vLLM 0.29's real Scheduler on CPU, stepped with fed-back tokens."""

    def __init__(self, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int = 8192, step_model: Optional[StepModel] = None,
                 reserve_full_isl: bool = True) -> None:
        _import_vllm()
        import torch
        from vllm import SamplingParams
        from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager

        d = str(LLAMA8B_CONFIG_DIR)
        mc = ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True, dtype="bfloat16",
                         max_model_len=max_model_len)
        sc = SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=False,
                             max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                             enable_chunked_prefill=True, async_scheduling=False,
                             scheduler_reserve_full_isl=reserve_full_isl)
        cc = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
        vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                        device_config=DeviceConfig(device="cpu"))
        vc.cache_config.num_gpu_blocks = num_blocks
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
        kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn"
                                                               for i in range(32)], spec)])
        init_none_hash(sha256)
        self.sched = Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=BLOCK, log_stats=True)
        self._hasher = get_request_block_hasher(BLOCK, sha256)
        self._Request, self._SP, self._MRO = Request, SamplingParams, ModelRunnerOutput
        self.step_model = step_model or default_step_model()
        self._admitted_once: set = set()
        self._outputs: Dict[str, Sequence[int]] = {}

    def add(self, rid: str, token_ids: Sequence[int], max_tokens: int, output_token_ids=()) -> None:
        sp = self._SP(max_tokens=max_tokens, ignore_eos=True)
        if output_token_ids:
            self._outputs[rid] = output_token_ids
        self.sched.add_request(self._Request(rid, list(token_ids), sp, None, block_hasher=self._hasher))

    def has_work(self) -> bool:
        return bool(self.sched.requests)

    def schedule(self):
        return self.sched.schedule()

    def model_output(self, so):
        reqs = self.sched.requests
        ids = list(so.num_scheduled_tokens)
        toks = []
        for rid in ids:
            r = reqs[rid]
            if r.num_computed_tokens < r.num_tokens:
                toks.append([])
                continue
            given = self._outputs.get(rid)
            k = r.num_output_tokens
            # the trace's answer, else a deterministic "sampled" token per (request, position)
            toks.append([given[k] if given and k < len(given) else
                         (zlib.crc32(rid.encode()) + r.num_tokens) % 128000])
        return self._MRO(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                         sampled_token_ids=toks)

    def step(self) -> StepRecord:
        s = self.sched
        before = {r.request_id for r in s.running}
        so = s.schedule()
        rec = StepRecord(preempted=frozenset(so.preempted_req_ids or ()))
        reqs = s.requests
        for rid, n in so.num_scheduled_tokens.items():
            r = reqs[rid]
            c = r.num_computed_tokens - n  # schedule() already advanced it
            _split(rec, rid, n, c, r.num_output_tokens > 0, r.num_tokens)
        _note_admissions(rec, before, self._admitted_once)
        s.update_from_output(so, self.model_output(so))
        rec.finished = frozenset(rid for rid in so.num_scheduled_tokens if rid not in reqs)
        for rid in rec.finished:
            self._outputs.pop(rid, None)
        rec.time_s = self.step_model.time(rec.chunks, rec.decode_contexts)
        return rec


# ---------------------------------------------------------------------------------------------- engine
class EngineModelSide:
    """The project's EngineModel with the same limits, recording what each step scheduled."""

    def __init__(self, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int = 8192, step_model: Optional[StepModel] = None,
                 record: bool = True, reserve_full_prompt: bool = True) -> None:
        prof = replace(get_profile(_PROFILE), ttft_overhead_s=0.0)
        cfg = EngineConfig.from_profile(prof, num_gpu_blocks=num_blocks - 1, max_num_seqs=max_num_seqs,
                                        max_num_batched_tokens=max_num_batched_tokens,
                                        max_model_len=max_model_len, block_tokens=BLOCK,
                                        ttft_overhead_s=0.0, enable_prefix_caching=True,
                                        enable_chunked_prefill=True, reserve_full_prompt=reserve_full_prompt)
        self.eng = EngineModel(prof, cfg)
        self.step_model = step_model or default_step_model()
        self._now = 0.0
        self._admitted_once: set = set()
        self._cur: Optional[StepRecord] = None
        if record:
            eng = self.eng
            eng.decode_fast_path = False  # one path, so _apply sees every scheduled request
            orig = eng._apply

            def _apply(running, scheduled, preempted):
                rec = self._cur
                for q in scheduled:
                    _split(rec, q.id, q.sched, q.num_computed, q.num_output > 0, q.num_tokens)
                return orig(running, scheduled, preempted)

            eng._apply = _apply

    def add(self, rid: str, token_ids: Sequence[int], max_tokens: int, output_ids: Sequence[int] = ()) -> None:
        # the answer's blocks too, when the trace knows it (vLLM caches full output blocks; the engine model
        # caches those it is given hashes for)
        ids = tuple(token_ids) + tuple(output_ids[:max_tokens])
        self.eng.add_request(EngineRequest(rid, len(token_ids), max_tokens, token_block_hashes(ids)), self._now)

    def has_work(self) -> bool:
        return self.eng.has_work()

    def step(self) -> StepRecord:
        eng = self.eng
        before = {q.id for q in eng._running}
        rec = self._cur = StepRecord()
        out = eng.step(self._now)
        self._now += max(out.duration, 1e-3)
        rec.preempted = frozenset(out.preempted)
        rec.finished = frozenset(out.finished)
        _note_admissions(rec, before, self._admitted_once)
        rec.time_s = self.step_model.time(rec.chunks, rec.decode_contexts)
        return rec


# ---------------------------------------------------------------------------------------------- replay
def _fmt(d: dict, keys) -> str:
    return ", ".join(f"{k}:{d.get(k)}" for k in sorted(keys)[:6]) + (" ..." if len(keys) > 6 else "")


def _compare(i: int, v: StepRecord, e: StepRecord, out: List[Divergence]) -> Tuple[bool, bool, bool, bool]:
    vs, es = set(v.sched), set(e.sched)
    same_set = vs == es
    same_tok = v.sched == e.sched
    same_hits = v.admitted == e.admitted
    same_pre = v.preempted == e.preempted
    if not same_set:
        out.append(Divergence(i, "scheduled", f"only vLLM: {sorted(vs - es)[:6]}; only engine: "
                              f"{sorted(es - vs)[:6]}"))
    elif not same_tok:
        diff = {k for k in vs if v.sched[k] != e.sched[k]}
        out.append(Divergence(i, "tokens", f"(new, computed) vLLM {_fmt(v.sched, diff)} | engine "
                              f"{_fmt(e.sched, diff)}"))
    if not same_hits:
        keys = set(v.admitted) | set(e.admitted)
        out.append(Divergence(i, "hits", f"admitted hit tokens vLLM {_fmt(v.admitted, keys)} | engine "
                              f"{_fmt(e.admitted, keys)}"))
    if not same_pre:
        out.append(Divergence(i, "preempted", f"vLLM {sorted(v.preempted)} | engine {sorted(e.preempted)}"))
    return same_set, same_tok, same_hits, same_pre


def replay(trace: Sequence[TraceRequest], num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int,
           *, max_model_len: int = 8192, step_model: Optional[StepModel] = None, max_steps: int = 200_000,
           max_divergences: int = 20, keep_records: bool = False,
           reserve_full_isl: bool = True) -> CrosscheckResult:
    """Replay ``trace`` through vLLM's scheduler and the EngineModel in lockstep (module docstring).
    ``reserve_full_isl``: vLLM's ``scheduler_reserve_full_isl`` (its default True: admit a waiting request
    only if its whole prompt fits in the free blocks), and the engine model's ``reserve_full_prompt``: both
    sides follow the same rule."""
    sm = step_model or default_step_model()
    vl = VllmSchedulerSide(num_blocks, max_num_seqs, max_num_batched_tokens, max_model_len, sm,
                           reserve_full_isl)
    en = EngineModelSide(num_blocks, max_num_seqs, max_num_batched_tokens, max_model_len, sm,
                         reserve_full_prompt=reserve_full_isl)
    by_step: Dict[int, List[Tuple[str, TraceRequest]]] = {}
    for i, r in enumerate(trace):
        by_step.setdefault(r.arrival_step, []).append((_rid(i, r), r))
    last_arrival = max(by_step) if by_step else 0
    n_steps = n_set = n_tok = 0
    n_adm = n_hit = n_pre_steps = n_pre = 0
    divs: List[Divergence] = []
    first_div = None
    hits = [0, 0]
    rhits = [0, 0]
    pre = [0, 0]
    busy = [0, 0]
    tsum = [0.0, 0.0]
    first_hit: List[Dict[str, int]] = [{}, {}]
    fin_step: List[Dict[str, int]] = [{}, {}]
    records = [] if keep_records else None
    step = 0
    while step < max_steps:
        for rid, r in by_step.get(step, ()):
            vl.add(rid, r.prompt_token_ids, r.max_tokens, r.output_token_ids)
            en.add(rid, r.prompt_token_ids, r.max_tokens, r.output_token_ids)
        if step > last_arrival and not vl.has_work() and not en.has_work():
            break
        recs = (vl.step(), en.step())
        for k, rec in enumerate(recs):
            busy[k] += bool(rec.sched)
            tsum[k] += rec.time_s
            pre[k] += len(rec.preempted)
            for rid, c in rec.admitted.items():
                if rid in rec.resumed:
                    rhits[k] += c
                else:
                    hits[k] += c
                    first_hit[k][rid] = c
            for rid in rec.finished:
                fin_step[k][rid] = step
        v, e = recs
        if v.sched or e.sched or v.preempted or e.preempted:
            n_steps += 1
            nd = len(divs)
            ss, st, sh, sp = _compare(step, v, e, divs if len(divs) < max_divergences else [])
            n_set += ss
            n_tok += st
            if v.admitted or e.admitted:
                n_adm += 1
                n_hit += sh
            if v.preempted or e.preempted:
                n_pre_steps += 1
                n_pre += sp
            if first_div is None and not (ss and st and sh and sp):
                first_div = step
            del divs[max(nd, max_divergences):]
        if records is not None:
            records.append(recs)
        step += 1
    rids = [_rid(i, r) for i, r in enumerate(trace)]
    fin_same = sum(1 for r in rids if r in fin_step[0] and fin_step[0].get(r) == fin_step[1].get(r))
    hit_same = sum(1 for r in rids if r in first_hit[0] and first_hit[0].get(r) == first_hit[1].get(r))
    frac = lambda a, b: a / b if b else 1.0  # noqa: E731
    return CrosscheckResult(
        steps=n_steps, agree_scheduled=frac(n_set, n_steps), agree_tokens=frac(n_tok, n_steps),
        agree_hits=frac(n_hit, n_adm), agree_preempted=frac(n_pre, n_pre_steps),
        first_divergence_step=first_div, divergences=divs, hit_tokens=tuple(hits),
        resume_hit_tokens=tuple(rhits), preemptions=tuple(pre), busy_steps=tuple(busy),
        sim_time_s=tuple(tsum), finish_step_agree=frac(fin_same, len(rids)),
        first_hit_agree=frac(hit_same, len(rids)),
        unfinished=(len(vl.sched.requests), en.eng.num_unfinished), records=records)


# ---------------------------------------------------------------------------------------------- CPU cost
def time_steps(trace: Sequence[TraceRequest], num_blocks: int, max_num_seqs: int,
               max_num_batched_tokens: int, *, max_model_len: int = 8192, step_model: Optional[StepModel] = None,
               max_steps: int = 200_000) -> Dict[str, List[Tuple[int, float, float]]]:
    """CPU seconds of each non-empty step of each scheduler run alone (no recording hooks; the engine
    model's decode fast path on): ``{"vllm": [(batch size, cpu s, StepModel s), ...], "engine": [...]}``.
    vLLM's step is ``schedule()`` + ``update_from_output()`` (building the fake model output and pricing
    the step are not counted). Batch size = requests scheduled in the step (engine: running after the
    step + finished in it). ``StepModel s`` is the GPU time the emulator would sleep for that step
    (vLLM side only; 0.0 for the engine)."""
    sm = step_model or default_step_model()
    by_step: Dict[int, List[Tuple[str, TraceRequest]]] = {}
    for i, r in enumerate(trace):
        by_step.setdefault(r.arrival_step, []).append((_rid(i, r), r))
    last = max(by_step) if by_step else 0
    pc = time.perf_counter
    out: Dict[str, List[Tuple[int, float, float]]] = {"vllm": [], "engine": []}

    vl = VllmSchedulerSide(num_blocks, max_num_seqs, max_num_batched_tokens, max_model_len, sm)
    s = vl.sched
    reqs = s.requests
    for step in range(max_steps):
        for rid, r in by_step.get(step, ()):
            vl.add(rid, r.prompt_token_ids, r.max_tokens, r.output_token_ids)
        if step > last and not reqs:
            break
        t0 = pc()
        so = s.schedule()
        t1 = pc()
        mro = vl.model_output(so)
        rec = StepRecord()
        for rid, n in so.num_scheduled_tokens.items():
            q = reqs[rid]
            _split(rec, rid, n, q.num_computed_tokens - n, q.num_output_tokens > 0, q.num_tokens)
        t2 = pc()
        s.update_from_output(so, mro)
        t3 = pc()
        if so.num_scheduled_tokens:
            out["vllm"].append((len(so.num_scheduled_tokens), (t1 - t0) + (t3 - t2),
                                sm.time(rec.chunks, rec.decode_contexts)))

    en = EngineModelSide(num_blocks, max_num_seqs, max_num_batched_tokens, max_model_len, sm, record=False)
    eng = en.eng
    now = 0.0
    for step in range(max_steps):
        for rid, r in by_step.get(step, ()):
            en.add(rid, r.prompt_token_ids, r.max_tokens, r.output_token_ids)
        if step > last and not eng.has_work():
            break
        t0 = pc()
        o = eng.step(now)
        t1 = pc()
        now += max(o.duration, 1e-3)
        if o.tokens or o.num_prefill_tokens:
            out["engine"].append((len(eng._running) + len(o.finished), t1 - t0, 0.0))
    return out
