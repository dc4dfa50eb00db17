"""Multi-turn conversation workloads (SkyLB §5.1: ShareGPT / WildChat, closed loop)."""

from __future__ import annotations

import math
import random
from pathlib import Path

from .datasets import Conversation, load_conversations
from .model import Call, ClosedLoopSpec, Program, ProgramStream, Workload
from .text import stable_int

DEFAULT_CLIENTS = {"us": 40, "eu": 30, "asia": 30}
MAX_OUTPUT_TOKENS = 1024

_AMERICAS = """United States, Canada, Mexico, Brazil, Argentina, Chile, Colombia, Peru, Venezuela, Ecuador,
Bolivia, Uruguay, Paraguay, Guatemala, Costa Rica, Panama, Cuba, Dominican Republic, Puerto Rico, Honduras,
El Salvador, Nicaragua, Jamaica, Trinidad and Tobago, Haiti, Bahamas, Barbados"""
_EUROPE_MEA = """United Kingdom, Ireland, France, Germany, The Netherlands, Netherlands, Belgium, Luxembourg,
Switzerland, Austria, Italy, Spain, Portugal, Greece, Denmark, Norway, Sweden, Finland, Iceland, Estonia,
Latvia, Lithuania, Poland, Czechia, Czech Republic, Slovakia, Hungary, Romania, Bulgaria, Serbia, Croatia,
Slovenia, Bosnia and Herzegovina, Montenegro, North Macedonia, Albania, Moldova, Ukraine, Belarus, Russia,
Georgia, Armenia, Azerbaijan, Cyprus, Malta, Türkiye, Turkey, Israel, Palestine, Lebanon, Jordan, Syria, Iraq,
Iran, Saudi Arabia, United Arab Emirates, Qatar, Kuwait, Bahrain, Oman, Yemen, Egypt, Libya, Tunisia, Algeria,
Morocco, Nigeria, Ghana, Kenya, Ethiopia, Tanzania, Uganda, South Africa, Cameroon, Senegal, Ivory Coast,
Côte d'Ivoire, Zimbabwe, Zambia, Sudan, Angola, Rwanda"""
_ASIA_PACIFIC = """China, Hong Kong, Taiwan, Macao, Japan, South Korea, Korea, Mongolia, India, Pakistan,
Bangladesh, Sri Lanka, Nepal, Afghanistan, Kazakhstan, Uzbekistan, Tajikistan, Kyrgyzstan, Turkmenistan,
Vietnam, Thailand, Malaysia, Singapore, Indonesia, Philippines, Myanmar, Cambodia, Laos, Brunei, Australia,
New Zealand, Papua New Guinea, Fiji"""


def _table(block: str, region: str) -> dict[str, str]:
    return {c.strip(): region for c in block.replace("\n", " ").split(",") if c.strip()}


#: WildChat ``metadata.country`` -> region. Americas -> us; Europe, Middle East and Africa -> eu
#: (all closer to Frankfurt than to Tokyo); Asia-Pacific incl. Central/South Asia -> asia.
COUNTRY_REGION: dict[str, str] = {**_table(_AMERICAS, "us"), **_table(_EUROPE_MEA, "eu"),
                                  **_table(_ASIA_PACIFIC, "asia")}


def region_of_country(country: str | None, regions: list[str], key: str, seed: int = 0) -> str:
    """Region for a country; unknown/missing countries (or a region not in ``regions``) are
    assigned by a seeded sha256 bucket of ``key`` (stable across runs and machines)."""
    r = COUNTRY_REGION.get(country or "")
    if r in regions:
        return r
    return regions[stable_int(f"{seed}:{key}") % len(regions)]


def output_tokens_for(reply: str) -> int:
    """ceil(len(reply)/4), clipped to [1, 1024]."""
    return min(MAX_OUTPUT_TOKENS, max(1, math.ceil(len(reply) / 4)))


def salt_for(region: str, cycle: int) -> str:
    return f"[{region}#{cycle}] "


def conversation_program(conv: Conversation, program_id: str, region: str, *, salt: str = "",
                         session_key: str | None = None, tenant: str | None = None,
                         max_turns: int | None = None, max_tokens: int | None = None) -> Program:
    """A conversation as a program: call k sends system? + u1 + a1 + ... + u_k and depends on call k-1.

    ``salt`` is prepended to the first user message (used to make re-used conversations distinct users).
    ``max_tokens``: the client sends it, so a reply is at most that long, and the history replays the
    reply as the model would have cut it (its first ``4 * max_tokens`` characters; SkyLB's client
    replays the model's own replies). None: the dataset's replies (at most 1,024 tokens), no max_tokens.
    """
    key = session_key or conv.session_key
    turns = conv.turns if max_turns is None else conv.turns[:max_turns]
    history: list[dict] = [{"role": "system", "content": conv.system}] if conv.system is not None else []
    calls = []
    for k, (user, reply) in enumerate(turns):
        if k == 0 and salt:
            user = salt + user
        history.append({"role": "user", "content": user})
        out = output_tokens_for(reply)
        if max_tokens is not None:
            out = min(out, max_tokens)
            reply = reply[: 4 * max_tokens]
        calls.append(Call(messages=list(history), output_tokens=out, session_key=key,
                          depends_on=(k - 1,) if k else (), tenant=tenant, max_tokens=max_tokens,
                          reply=reply if k + 1 < len(turns) else None))
        history.append({"role": "assistant", "content": reply})
    return Program(program_id, region, calls)


def conversation_turn_call(conv: Conversation, k: int, *, salt: str = "", session_key: str | None = None,
                           tenant: str | None = None) -> Call:
    """Call k (0-based) of ``conversation_program`` on its own, without dependencies (for open loop)."""
    msgs: list[dict] = [{"role": "system", "content": conv.system}] if conv.system is not None else []
    for j, (user, reply) in enumerate(conv.turns[: k + 1]):
        msgs.append({"role": "user", "content": (salt + user) if j == 0 and salt else user})
        if j < k:
            msgs.append({"role": "assistant", "content": reply})
    return Call(messages=msgs, output_tokens=output_tokens_for(conv.turns[k][1]),
                session_key=session_key or conv.session_key, tenant=tenant)


def partition_conversations(convs: list[Conversation], clients: dict[str, int], source: str,
                            seed: int) -> dict[str, list[Conversation]]:
    """Disjoint per-region pools. WildChat: by country (``COUNTRY_REGION``). ShareGPT (no location):
    a seeded shuffle dealt to regions in proportion to their client counts (each region >= 1)."""
    regions = list(clients)
    pools: dict[str, list[Conversation]] = {r: [] for r in regions}
    if source == "wildchat":
        for c in convs:
            pools[region_of_country(c.country, regions, c.session_key, seed)].append(c)
    else:
        order = list(convs)
        random.Random(f"{seed}:partition:{source}").shuffle(order)
        total = sum(clients.values()) or 1
        bounds, acc = [], 0.0
        for r in regions:
            acc += clients[r] / total
            bounds.append(acc)
        for i, c in enumerate(order):
            x = (i + 0.5) / len(order)
            pools[regions[next(j for j, b in enumerate(bounds) if x <= b + 1e-12)]].append(c)
    # A region left empty borrows the whole pool (its programs are salted, so they are distinct users).
    for r in regions:
        if not pools[r]:
            pools[r] = list(convs)
    return pools


def conversation_stream(pool: list[Conversation], region: str, source: str, seed: int,
                        max_turns: int | None = None, salt_first_cycle: bool = False,
                        max_tokens: int | None = None) -> ProgramStream:
    """Infinite stream over a region's pool: each cycle is a fresh seeded permutation; programs of
    cycle >= 1 (or every cycle when ``salt_first_cycle``) get a salt and ``#c<cycle>`` ids/keys."""
    n = len(pool)
    perms: dict[int, list[int]] = {}

    def make(i: int) -> Program:
        cycle, j = divmod(i, n)
        if cycle not in perms:
            p = list(range(n))
            random.Random(f"{seed}:{source}:{region}:{cycle}").shuffle(p)
            perms[cycle] = p
        conv = pool[perms[cycle][j]]
        salted = cycle > 0 or salt_first_cycle
        suffix = f"#{region}.c{cycle}" if salted else ""
        return conversation_program(conv, f"{source}:{region}:{i}:{conv.conv_id}{suffix}", region,
                                    salt=salt_for(region, cycle) if salted else "",
                                    session_key=conv.session_key + suffix, max_turns=max_turns,
                                    max_tokens=max_tokens)

    return ProgramStream(make)


def conversation(source: str = "sharegpt", clients: dict[str, int] | None = None,
                 path: str | Path | None = None, seed: int = 0, *, max_turns: int | None = None,
                 max_message_chars: int | None = 4000, think_time_s: float = 0.0,
                 max_tokens: int | None = None) -> Workload:
    """Closed-loop multi-turn chat. Each region's clients take conversations from that region's pool.
    ``max_tokens``: the client's max_tokens (see :func:`conversation_program`)."""
    clients = dict(DEFAULT_CLIENTS if clients is None else clients)
    convs = load_conversations(source, path, max_message_chars=max_message_chars)
    if not convs:
        raise ValueError(f"no usable {source} conversations in {path or 'the shipped fixture'}")
    pools = partition_conversations(convs, clients, source, seed)
    shared = {r for r in clients if len(pools[r]) == len(convs) and len(clients) > 1}
    streams = {r: conversation_stream(pools[r], r, source, seed, max_turns, salt_first_cycle=r in shared,
                                      max_tokens=max_tokens)
               for r in clients}
    return Workload(
        name=f"conversation:{source}",
        description=f"{source} multi-turn conversations, closed loop, clients={clients}",
        closed=ClosedLoopSpec(clients=clients, programs=streams, think_time_s=think_time_s),
        meta={"source": source, "seed": seed, "pool_sizes": {r: len(p) for r, p in pools.items()}},
    )
