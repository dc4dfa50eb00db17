"""Prefix-match helpers shared by the cost policies and the region layer's cost selector.

A prefix index answers "how many characters of this prompt did I send to target t"; these helpers
turn that into what a cost estimate needs: how old the match is (:func:`match_age`) and how many
prompt tokens it is likely to save (:func:`discounted_hits`).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Dict, Hashable, Optional, Tuple

__all__ = ["match_age", "discounted_hits", "through_reply"]


def match_age(index, prepared, target: Hashable, chars: int, now: float) -> Optional[float]:
    """Seconds since ``target`` was last sent the matched prefix of length ``chars`` (None: unknown).

    Reads the matched block's per-target access time in the prefix index (an insert touches the whole
    path, so it is when this prefix last went to ``target``).
    """
    t = index.last_access_at(prepared, chars, target)
    return None if t is None else max(0.0, now - t)


def through_reply(match: Dict[Hashable, int], prepared, span: Optional[Tuple[int, int]]) -> Dict[Hashable, int]:
    """Raise each match that covers the turn a chat's last reply answered to the end of that reply: the
    replica that ran the turn decoded the reply after it and cached its blocks too (vLLM does), so the
    next turn's cached prefix is its whole history -- even where this index heard only of the turn (a
    sibling router sent it, and the reply it learned has not reached this one yet).

    ``span``: ``RouteRequest.reply_span`` (None: unchanged). A match "covers the turn" when it reaches the
    last block of ``prepared`` that ends inside the turn (a prompt's partial last block is keyed on its own
    end, so an index never matches past it); a turn shorter than one block says nothing. In place; returns
    ``match``."""
    if not span or not match:
        return match
    start, end = span
    ends = prepared.ends
    i = bisect_right(ends, start)
    floor = ends[i - 1] if i else 0
    if floor <= 0:
        return match
    for t, chars in match.items():
        if floor <= chars < end:
            match[t] = end
    return match


def discounted_hits(match: Dict[Hashable, int], L: int, chars_per_token: float, min_match_chars: int,
                    half_life_s: Optional[float], index=None, prepared=None, now: float = 0.0,
                    times: Optional[Dict[Hashable, float]] = None) -> Dict[Hashable, float]:
    """Matched characters → estimated cached tokens (min-length rule, age discount, capped at L).
    The age of each match comes from ``times`` (filled by ``index.match(..., times=)``) or, without
    it, from ``index.access_times``."""
    floor = max(1, min_match_chars)
    fl = float(L)
    out = {}
    if half_life_s is None:
        for t, chars in match.items():
            if chars >= floor:
                x = chars / chars_per_token
                out[t] = x if x < fl else fl
        return out
    if times is None:
        kept = {t: chars for t, chars in match.items() if chars >= floor}
        times = index.access_times(prepared, kept) if (index is not None and kept) else {}
    get = times.get
    for t, chars in match.items():
        if chars < floor:
            continue
        x = chars / chars_per_token
        x = x if x < fl else fl  # min(L, chars / chars_per_token)
        ts = get(t)
        if ts is not None and now > ts:  # age = max(0, now - ts) > 0, as match_age
            x *= 0.5 ** ((now - ts) / half_life_s)
        out[t] = x
    return out
