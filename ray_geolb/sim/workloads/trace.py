"""Trace replay (open loop): Azure LLM 2023 CSV or Mooncake-style JSONL with ``hash_ids``."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from .datasets import open_text
from .model import Call, OpenLoopSpec, Program, Workload
from .text import CHARS_PER_TOKEN, block_text, rng_for, stable_int, words

AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


#: how trace rows are mapped onto ``region_of``'s regions (``trace(region_by=...)``)
REGION_BY = ("row", "session", "prefix")


def _region_fn(region_of) -> Callable[[int], str]:
    if isinstance(region_of, str):
        return lambda i: region_of
    if callable(region_of):
        return region_of
    seq = list(region_of)
    if not seq:
        raise ValueError("region_of: empty region list")
    return lambda i: seq[i % len(seq)]


def _region_list(region_of, region_by: str) -> list:
    if isinstance(region_of, str):
        return [region_of]
    if callable(region_of):
        raise ValueError(f"region_by={region_by!r} maps rows by a key onto a list of regions; "
                         f"region_of must be a region or a list, not a function")
    seq = list(region_of)
    if not seq:
        raise ValueError("region_of: empty region list")
    return seq


def _first_distinct_keys(heads: list) -> list:
    """Per row, the first prefix block that not every row shares (rows' leading block ids; a row with
    no block past the common ones keys on its last block, a row with none on its index)."""
    rows = [h for h in heads if h]
    common = 0
    if rows:
        shortest = min(len(h) for h in rows)
        first = rows[0]
        while common < shortest and all(h[common] == first[common] for h in rows):
            common += 1
    out = []
    for i, h in enumerate(heads):
        if not h:
            out.append(f"row{i}")
        else:
            out.append(f"b{h[min(common, len(h) - 1)]}")
    return out


def _assign_regions(arrivals: list, heads: list, region_of, region_by: str) -> list:
    """``arrivals``' programs with regions by ``region_by`` (row: ``region_of`` dealt round-robin by row
    or ``f(row)``; session: a stable hash of the call's session key; prefix: a stable hash of the row's
    first distinct prefix block)."""
    if region_by not in REGION_BY:
        raise ValueError(f"region_by must be one of {', '.join(REGION_BY)}, got {region_by!r}")
    if region_by == "row":
        rf = _region_fn(region_of)
        return [(t, replace(prog, region=rf(i))) for i, (t, prog) in enumerate(arrivals)]
    regions = _region_list(region_of, region_by)
    if region_by == "session":
        keys = [prog.calls[0].session_key for _, prog in arrivals]
    else:
        keys = _first_distinct_keys(heads)
    return [(t, replace(prog, region=regions[stable_int(k) % len(regions)]))
            for (t, prog), k in zip(arrivals, keys)]


def _parse_ts(s: str) -> float:
    """Seconds since the epoch; naive timestamps are read as UTC (never the machine's local zone)."""
    s = s.strip()
    frac = 0.0
    if "." in s:  # Azure has 7 fractional digits; datetime takes at most 6
        s, f = s.split(".", 1)
        frac = float("0." + f)
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp() + frac


def _unique_prompt(i: int, n_chars: int, seed: int) -> str:
    head = f"[req {i}] "
    return (head + words(max(0, n_chars - len(head)), rng_for(seed, 31, i)))[:max(1, n_chars)]


def _read_azure(p: Path, lines, seed, tenant, max_requests, block_chars):
    out = []
    for lineno, row in lines:
        if max_requests is not None and len(out) >= max_requests:
            break
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != 3:
            raise ValueError(f"{p}:{lineno}: expected 3 columns TIMESTAMP,ContextTokens,GeneratedTokens, got {row!r}")
        try:
            ts = _parse_ts(row[0])
            ctx, gen = int(row[1]), int(row[2])
        except ValueError as e:
            raise ValueError(f"{p}:{lineno}: bad Azure row {row!r} ({e})") from None
        if ctx < 0 or gen < 0:
            raise ValueError(f"{p}:{lineno}: negative token count")
        i = len(out)
        prompt = _unique_prompt(i, ctx * CHARS_PER_TOKEN, seed)
        prog = Program(f"{p.stem}:{i}", "", [Call(prompt=prompt, output_tokens=max(1, gen),
                                                  session_key=f"{p.stem}-{i}", tenant=tenant)])
        out.append((ts, prog, [stable_int(prompt[:block_chars])]))
    return out


def _read_jsonl(p: Path, f, seed, tenant, max_requests, block_tokens):
    out = []
    block_chars = block_tokens * CHARS_PER_TOKEN
    for lineno, line in enumerate(f, 1):
        if max_requests is not None and len(out) >= max_requests:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}:{lineno}: invalid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{p}:{lineno}: expected a JSON object")
        for k in ("timestamp", "input_length", "output_length"):
            if k not in row:
                raise ValueError(f"{p}:{lineno}: missing field {k!r}")
        ts, n_in, n_out = row["timestamp"], row["input_length"], row["output_length"]
        hids = row.get("hash_ids", [])
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            raise ValueError(f"{p}:{lineno}: timestamp must be a number (ms), got {ts!r}")
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (n_in, n_out)):
            raise ValueError(f"{p}:{lineno}: input_length/output_length must be non-negative ints")
        if not isinstance(hids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                 for h in hids):
            raise ValueError(f"{p}:{lineno}: hash_ids must be a list of non-negative ints")
        i = len(out)
        n_chars = max(1, n_in * CHARS_PER_TOKEN)
        text = "".join(block_text(h, block_chars, seed) for h in hids)
        if len(text) < n_chars:  # input longer than its blocks: unique tail
            text += words(n_chars - len(text), rng_for(seed, 37, i))
        text = text[:n_chars]
        sid = row.get("session_id")
        if sid is not None and (isinstance(sid, bool) or not isinstance(sid, (str, int))):
            raise ValueError(f"{p}:{lineno}: session_id must be a string or an int, got {sid!r}")
        key = (f"{p.stem}-s{sid}" if sid is not None else f"{p.stem}-h{hids[0]}" if hids else f"{p.stem}-{i}")
        prog = Program(f"{p.stem}:{i}", "", [Call(prompt=text, output_tokens=max(1, n_out),
                                                  session_key=key, tenant=tenant)])
        out.append((float(ts), prog, hids))  # ms; converted in trace()
    return out


def trace(path: str | Path, region_of: str | Sequence[str] | Callable[[int], str] = "us", seed: int = 0, *,
          tenant: str | None = None, max_requests: int | None = None, block_tokens: int = 512,
          time_scale: float = 1.0, region_by: str = "row") -> Workload:
    """Replay a trace file. Format is detected from its content:

    * Azure LLM 2023 CSV (header ``TIMESTAMP,ContextTokens,GeneratedTokens``): arrival = offset from
      the first timestamp; prompt = unique synthetic text of ``ContextTokens*4`` characters.
    * JSONL ``{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}``: each hash id is a
      deterministic block of ``block_tokens*4`` characters, so requests with the same leading hash ids
      share that text prefix; the prompt is cut to ``input_length*4`` characters.

    A JSONL row may carry ``"session_id"`` (string or int): the call's session key is then
    ``<stem>-s<session_id>``, else ``<stem>-h<first hash id>``.

    ``region_of``: one region, a list of regions, or ``f(row_index) -> region``; ``region_by`` says how
    rows are mapped onto the list (``REGION_BY``):

    * ``"row"`` (dealt): row ``i`` goes to ``region_of[i % len]`` (or ``f(i)``), so requests that share
      a prefix arrive in every region;
    * ``"session"``: a stable hash (sha256) of the row's session key picks the region, so a session
      stays in one region;
    * ``"prefix"``: a stable hash of the row's *first distinct prefix block* -- the first hash id that
      not every row of the trace shares (a system prompt common to all rows is skipped; Azure rows: the
      first ``block_tokens*4`` characters of the prompt) -- so a shared prefix stays in one region.

    ``time_scale`` multiplies arrival offsets (0.5 = replay twice as fast). Bad input -> ValueError.
    """
    p = Path(path)
    if region_by not in REGION_BY:
        raise ValueError(f"region_by must be one of {', '.join(REGION_BY)}, got {region_by!r}")
    tenant = tenant if tenant is not None else p.stem
    with open_text(p) as f:
        first = ""
        for line in f:
            if line.strip():
                first = line.strip()
                break
        f.seek(0)
        if first.lstrip("\ufeff").split(",")[:3] == AZURE_HEADER:
            reader = csv.reader(f)
            next(reader)
            lines = ((n, row) for n, row in enumerate(reader, 2))
            rows = _read_azure(p, lines, seed, tenant, max_requests, block_tokens * CHARS_PER_TOKEN)
            fmt = "azure-csv"
        elif first.startswith("{"):
            rows = _read_jsonl(p, f, seed, tenant, max_requests, block_tokens)
            fmt = "jsonl"
        else:
            raise ValueError(f"{p}:1: unknown trace format (expected Azure CSV header "
                             f"{','.join(AZURE_HEADER)} or JSONL objects), got {first[:80]!r}")
    if not rows:
        raise ValueError(f"{p}: trace has no requests")
    arrivals = _assign_regions([(t, prog) for t, prog, _ in rows], [h for _, _, h in rows], region_of, region_by)
    t0 = min(t for t, _ in arrivals)  # = the first timestamp for a time-sorted file
    unit = 1000.0 if fmt == "jsonl" else 1.0
    arrivals = [((t - t0) / unit * time_scale, prog) for t, prog in arrivals]
    return Workload(name=f"trace:{p}", description=f"{fmt} replay of {p.name}: {len(arrivals)} requests",
                    open=OpenLoopSpec(arrivals), meta={"format": fmt, "seed": seed, "path": str(p),
                                                       "region_by": region_by})
