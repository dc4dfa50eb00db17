"""Loaders for the shipped fixtures (``ray_geolb/data``) and for the full public files.

Every loader takes ``path=None`` (use the small shipped fixture) or a path to the full file
(``.gz`` is opened transparently). Malformed input raises ``ValueError`` naming file and line.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO

DATA_DIR = Path(__file__).resolve().parents[2] / "data"

FIXTURES = {
    "sharegpt": "sharegpt_60.jsonl.gz",
    "wildchat": "wildchat_60.jsonl.gz",
    "gsm8k": "gsm8k_test_300.jsonl",
    "azure_code": "azure_code_2000.csv",
    "azure_conv": "azure_conv_2000.csv",
    "servegen": "servegen_m-large_24clients_1day.csv.gz",
    "rtt": "ibm_cloud_inter_region_rtt_ms_2024-03-03.csv",
    "servegen_workday": "servegen_m-large_workday_tenants_hourly.csv",
    "azure_arrivals": "azure_2023_arrivals.csv.gz",
}


def fixture_path(name: str) -> Path:
    """Path of a shipped fixture by short name (see ``FIXTURES``)."""
    try:
        return DATA_DIR / FIXTURES[name]
    except KeyError:
        raise ValueError(f"unknown fixture {name!r}; known: {sorted(FIXTURES)}") from None


def open_text(path: str | Path) -> IO[str]:
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{p}: file not found")
    if p.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8")
    return open(p, encoding="utf-8")


def _jsonl(path: Path):
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None


# --------------------------------------------------------------------------- conversations


@dataclass(frozen=True)
class Conversation:
    """A chat normalised to ``system?`` + alternating (user, assistant) turns.

    ``turns[k] = (user_text, assistant_reply)``; a trailing user message without a reply is dropped.
    ``session_key`` is the dataset's conversation key (ShareGPT id / WildChat conversation_hash).
    """

    conv_id: str
    session_key: str
    system: str | None
    turns: tuple[tuple[str, str], ...]
    country: str | None = None


_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}


def _normalise(conv_id: str, session_key: str, msgs: list[tuple[str, str]], max_chars: int | None,
               country: str | None, where: str) -> Conversation | None:
    system = None
    merged: list[list[str]] = []
    for role, content in msgs:
        if role not in _ROLE:
            raise ValueError(f"{where}: unknown message role {role!r}")
        role = _ROLE[role]
        if not isinstance(content, str):
            raise ValueError(f"{where}: message content is not a string")
        if max_chars is not None:
            content = content[:max_chars]
        if role == "system":
            if not merged and system is None:
                system = content
            continue  # a system message in the middle is ignored
        if merged and merged[-1][0] == role:
            merged[-1][1] += "\n\n" + content
        else:
            merged.append([role, content])
    while merged and merged[0][0] != "user":
        merged.pop(0)
    turns = tuple((merged[i][1], merged[i + 1][1]) for i in range(0, len(merged) - 1, 2))
    if not turns:
        return None
    return Conversation(conv_id, session_key, system, turns, country)


def load_sharegpt(path: str | Path | None = None, *, max_message_chars: int | None = 4000,
                  human_first: bool = True) -> list[Conversation]:
    """ShareGPT lines ``{"id", "conversations": [{"from", "value"}]}``; keeps human-first ones by default."""
    p = Path(path) if path is not None else fixture_path("sharegpt")
    out = []
    for lineno, row in _jsonl(p):
        where = f"{p}:{lineno}"
        try:
            conv = row["conversations"]
            cid = str(row["id"])
            msgs = [(m["from"], m["value"]) for m in conv]
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: not a ShareGPT row (missing {e})") from None
        if human_first and (not msgs or msgs[0][0] != "human"):
            continue
        c = _normalise(cid, f"sharegpt-{cid}", msgs, max_message_chars, None, where)
        if c is not None:
            out.append(c)
    return out


def load_wildchat(path: str | Path | None = None, *, max_message_chars: int | None = 4000,
                  require_country: bool = False) -> list[Conversation]:
    """WildChat lines ``{"conversation_hash", "messages": [{"role","content"}], "metadata": {"country"}}``."""
    p = Path(path) if path is not None else fixture_path("wildchat")
    out = []
    for lineno, row in _jsonl(p):
        where = f"{p}:{lineno}"
        try:
            key = str(row.get("conversation_hash") or row["id"])
            msgs = [(m["role"], m["content"]) for m in row["messages"]]
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{where}: not a WildChat row (missing {e})") from None
        country = (row.get("metadata") or {}).get("country") or None
        if require_country and country is None:
            continue
        c = _normalise(str(row.get("id", key)), f"wildchat-{key}", msgs, max_message_chars, country, where)
        if c is not None:
            out.append(c)
    return out


def load_conversations(source: str, path: str | Path | None = None, **kw) -> list[Conversation]:
    if source == "sharegpt":
        return load_sharegpt(path, **kw)
    if source == "wildchat":
        return load_wildchat(path, **kw)
    raise ValueError(f"unknown conversation source {source!r}; valid: 'sharegpt', 'wildchat'")


# --------------------------------------------------------------------------- GSM8K


@dataclass(frozen=True)
class GsmQuestion:
    """A GSM8K item; ``idx`` is the 0-based line number in the original ``test.jsonl``."""

    idx: int
    question: str
    answer: str


def load_gsm8k(path: str | Path | None = None) -> list[GsmQuestion]:
    p = Path(path) if path is not None else fixture_path("gsm8k")
    out = []
    for lineno, row in _jsonl(p):
        try:
            q, a = row["question"], row["answer"]
        except (KeyError, TypeError) as e:
            raise ValueError(f"{p}:{lineno}: not a GSM8K row (missing {e})") from None
        if not isinstance(q, str) or not isinstance(a, str):
            raise ValueError(f"{p}:{lineno}: question/answer must be strings")
        out.append(GsmQuestion(int(row.get("idx", lineno - 1)), q, a))
    return out


# --------------------------------------------------------------------------- ServeGen


@dataclass(frozen=True)
class ServeGenWindow:
    """One 600 s rate window of one ServeGen client (t=0 is the client's local midnight)."""

    client_id: int
    window_start_s: float
    rate_rps: float
    iat_cv: float
    iat_dist: str | None  # "Gamma" / "Weibull" / None when idle
    shape: float
    scale: float


SERVEGEN_COLUMNS = ["client_id", "window_start_s", "rate_rps", "iat_cv", "iat_dist", "iat_param1", "iat_param2"]


def load_servegen(path: str | Path | None = None) -> dict[int, list[ServeGenWindow]]:
    """Per-client windows sorted by start time: ``{client_id: [ServeGenWindow, ...]}``."""
    p = Path(path) if path is not None else fixture_path("servegen")
    out: dict[int, list[ServeGenWindow]] = {}
    with open_text(p) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != SERVEGEN_COLUMNS:
            raise ValueError(f"{p}:1: expected ServeGen header {','.join(SERVEGEN_COLUMNS)}, got {header}")
        for lineno, row in enumerate(reader, 2):
            try:
                cid, ws, rate, cv, dist, a, b = row
                w = ServeGenWindow(int(cid), float(ws), float(rate), float(cv or 0), dist or None,
                                   float(a or 0), float(b or 0))
            except ValueError as e:
                raise ValueError(f"{p}:{lineno}: bad ServeGen row {row!r} ({e})") from None
            if w.rate_rps < 0 or w.window_start_s < 0:
                raise ValueError(f"{p}:{lineno}: negative rate or window start")
            if w.iat_dist not in (None, "Gamma", "Weibull"):
                raise ValueError(f"{p}:{lineno}: unknown iat_dist {w.iat_dist!r}")
            out.setdefault(w.client_id, []).append(w)
    if not out:
        raise ValueError(f"{p}: no ServeGen rows")
    for ws in out.values():
        ws.sort(key=lambda w: w.window_start_s)
    return out
