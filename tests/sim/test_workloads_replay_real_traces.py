import json
import os
from collections import Counter
from pathlib import Path

import pytest

from ray_geolb.sim.workloads import (
    COUNTRY_REGION,
    WORKLOAD_NAMES,
    Call,
    Program,
    by_name,
    conversation,
    fixture_path,
    load_gsm8k,
    load_servegen,
    load_sharegpt,
    load_wildchat,
    mixed_tot,
    prefix_repetition,
    servegen,
    tot,
    tot_size,
    trace,
)
from ray_geolb.sim.workloads.datasets import DATA_DIR, FIXTURES
from repo import REPO

#: the full public traces the fixtures were cut from (optional: only the test that reads them skips without);
#: $GEOLB_SHARED_DATA, else a shared/data folder beside the checkout
SHARED = Path(os.environ.get("GEOLB_SHARED_DATA") or REPO.parent / "shared" / "data")


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# ----------------------------------------------------------------------------- fixtures


def test_fixtures_shipped_small_and_documented():
    sources = (DATA_DIR / "SOURCES.md").read_text()
    total = 0
    for name, fname in FIXTURES.items():
        p = fixture_path(name)
        assert p.is_file(), p
        assert fname in sources, f"{fname} not documented in SOURCES.md"
        total += p.stat().st_size
    assert total < 1_500_000


def test_fixtures_load():
    sg = load_sharegpt()
    assert len(sg) == 60 and all(c.turns for c in sg)
    assert all(len(t) <= 4000 for c in sg for pair in c.turns for t in pair)
    wc = load_wildchat()
    assert len(wc) == 60 and all(c.country for c in wc)
    assert Counter(COUNTRY_REGION[c.country] for c in wc) == {"us": 20, "eu": 20, "asia": 20}
    qs = load_gsm8k()
    assert len(qs) == 300 and [q.idx for q in qs] == list(range(300))
    sgen = load_servegen()
    assert len(sgen) == 24 and all(len(ws) == 144 for ws in sgen.values())
    for name in ("azure_code", "azure_conv"):
        assert len(trace(fixture_path(name)).open.arrivals) == 2000


# ----------------------------------------------------------------------------- determinism


def _closed_sig(w, n=5):
    return {r: w.closed.programs[r].take(n) for r in w.closed.clients}


@pytest.mark.parametrize("spec", ["conversation", "conversation:wildchat", "tot", "mixed-tot", "diurnal"])
def test_closed_determinism(spec):
    a, b = by_name(spec, seed=3), by_name(spec, seed=3)
    assert _closed_sig(a) == _closed_sig(b)
    # stream[i] does not depend on consumption order
    s = a.closed.programs["eu"]
    assert s[7] == b.closed.programs["eu"].take(8)[7]
    assert _closed_sig(by_name(spec, seed=4), 8) != _closed_sig(a, 8)


def test_open_and_prefix_determinism():
    a = prefix_repetition(1, num_prefixes=4, prompts_per_replica=16, seed=1)
    b = prefix_repetition(1, num_prefixes=4, prompts_per_replica=16, seed=1)
    assert list(a.closed.programs["us"]) == list(b.closed.programs["us"])
    s1 = servegen(hours=2, mean_rps=0.5, seed=5)
    s2 = servegen(hours=2, mean_rps=0.5, seed=5)
    assert s1.open.arrivals == s2.open.arrivals and len(s1.open.arrivals) > 0
    assert servegen(hours=2, mean_rps=0.5, seed=6).open.arrivals != s1.open.arrivals


# ----------------------------------------------------------------------------- conversations


@pytest.mark.parametrize("source", ["sharegpt", "wildchat"])
def test_conversation_turns_extend_history(source):
    w = conversation(source)
    convs = {c.session_key: c for c in (load_sharegpt() if source == "sharegpt" else load_wildchat())}
    for region, stream in w.closed.programs.items():
        for prog in stream.take(len(convs) + 5):  # includes a second cycle
            assert prog.region == region
            for k, call in enumerate(prog.calls):
                assert call.depends_on == ((k - 1,) if k else ())
                assert call.messages[-1]["role"] == "user"
                assert 1 <= call.output_tokens <= 1024
                if k + 1 < len(prog.calls):
                    nxt = prog.calls[k + 1].messages
                    assert nxt[: len(call.messages)] == call.messages
                    reply = nxt[len(call.messages)]
                    assert reply["role"] == "assistant"
                    assert call.output_tokens == min(1024, max(1, -(-len(reply["content"]) // 4)))
                    assert prog.calls[k + 1].text.startswith(call.text)
            base_key = prog.calls[0].session_key.split("#")[0]
            assert base_key in convs
            assert len({c.session_key for c in prog.calls}) == 1


def test_wildchat_regions_by_country_and_cycles_are_new_users():
    w = conversation("wildchat", clients={"us": 4, "eu": 3, "asia": 3})
    convs = {c.session_key: c for c in load_wildchat()}
    for region, stream in w.closed.programs.items():
        progs = stream.take(45)  # 20 per region -> cycles 0, 1, 2
        for p in progs:
            c = convs[p.calls[0].session_key.split("#")[0]]
            assert COUNTRY_REGION[c.country] == region
        assert len({p.program_id for p in progs}) == 45
        assert len({p.calls[0].session_key for p in progs}) == 45
        firsts = [p.calls[0].messages[0]["content"] for p in progs]
        assert len(set(firsts)) == 45  # salted repeats never resend identical text
        real = [convs[p.calls[0].session_key].turns[0][0] for p in progs[:20]]
        assert firsts[:20] == real  # cycle 0 sends the real text
        assert all(f.startswith(f"[{region}#") for f in firsts[20:])


# ----------------------------------------------------------------------------- ToT


@pytest.mark.parametrize("b,n", [(2, 15), (4, 85)])
def test_tot_size_and_structure(b, n):
    w = tot(branching=b, clients={"us": 1})
    prog = w.closed.programs["us"][0]
    assert len(prog.calls) == n == tot_size(b)
    calls = prog.calls
    assert calls[0].depends_on == ()
    for i in range(1, n):
        parent = (i - 1) // b
        assert calls[i].depends_on == (parent,)
        assert calls[i].prompt.startswith(calls[parent].prompt) and len(calls[i].prompt) > len(calls[parent].prompt)
        added = calls[i].prompt[len(calls[parent].prompt):]
        assert len(added) >= calls[parent].output_tokens * 4  # the parent's thought (~output_tokens*4 chars)
    assert len({c.session_key for c in calls}) == 1 and calls[0].session_key.startswith("gsm8k-")
    # siblings share the parent's prompt exactly (same parent thought)
    assert calls[1].prompt == calls[2].prompt
    # leaves at depth 4
    assert sum(1 for c in calls if c.depends_on and (calls.index(c) - 1) // b >= 1 + b) == b ** 3


def test_mixed_tot():
    w = mixed_tot()
    assert w.closed.clients == {"us": 2, "eu": 20, "asia": 20}
    assert len(w.closed.programs["us"][0].calls) == 85
    assert len(w.closed.programs["eu"][0].calls) == 15
    qs_us = {w.closed.programs["us"][i].calls[0].session_key for i in range(100)}
    qs_eu = {w.closed.programs["eu"][i].calls[0].session_key for i in range(100)}
    assert not (qs_us & qs_eu)  # disjoint question slices per region


# ----------------------------------------------------------------------------- prefix repetition


def test_prefix_repetition_sharing():
    w = prefix_repetition(2, num_prefixes=4, prompts_per_replica=32, prefix_tokens=64, suffix_tokens=16)
    assert w.closed.clients == {"us": 64}
    progs = list(w.closed.programs["us"])
    assert len(progs) == 64 and all(len(p.calls) == 1 for p in progs)
    by_key = {}
    for p in progs:
        c = p.calls[0]
        assert len(c.prompt) == (64 + 16) * 4 and c.output_tokens == 128
        by_key.setdefault(c.session_key, []).append(c.prompt)
    assert len(by_key) == 8 and all(len(v) == 8 for v in by_key.values())
    for prompts in by_key.values():
        assert len({p[:256] for p in prompts}) == 1  # shared 64-token prefix
        assert len(set(prompts)) == len(prompts)  # unique suffixes
    heads = [v[0][:256] for v in by_key.values()]
    assert len(set(heads)) == 8
    keys = [p.calls[0].session_key for p in progs]
    assert keys != sorted(keys)  # shuffled


# ----------------------------------------------------------------------------- servegen


def test_servegen_regions_shifted_by_timezone():
    kw = dict(hours=24, mean_rps=0.3, seed=2, iat="dist")
    shifted = servegen(tz_offsets={"us": -5, "eu": 1, "asia": 9}, **kw)
    flat = servegen(tz_offsets={"us": 0, "eu": 0, "asia": 0}, **kw)
    offs = {"us": -5, "eu": 1, "asia": 9}
    assert shifted.meta["clients"] == flat.meta["clients"]
    for region, h in offs.items():
        # local time of each arrival = sim time + h; compare the part of the local day both runs cover
        lo, hi = max(0, h), min(24, 24 + h)
        loc_s = sorted(round(t + h * 3600, 3) for t, p in shifted.open.arrivals
                       if p.region == region and lo * 3600 <= t + h * 3600 < hi * 3600)
        loc_f = sorted(round(t, 3) for t, p in flat.open.arrivals
                       if p.region == region and lo * 3600 <= t < hi * 3600)
        assert loc_s == loc_f and len(loc_s) > 50

    def peak(w, region):
        c = Counter(int(t // 3600) for t, p in w.open.arrivals if p.region == region)
        return max(range(24), key=lambda x: c[x])

    assert len({peak(shifted, r) for r in offs}) > 1


def test_servegen_prompts_and_tenants():
    w = servegen(hours=3, mean_rps=0.5, iat="exponential")
    arr = w.open.arrivals
    assert [t for t, _ in arr] == sorted(t for t, _ in arr) and all(0 <= t < 3 * 3600 for t, _ in arr)
    for _, p in arr:
        c = p.calls[0]
        assert len(p.calls) == 1 and c.tenant.startswith("servegen-") and c.messages[-1]["role"] == "user"
        assert p.region == w.meta["clients"][int(c.tenant.split("-")[1])]
    # a client's consecutive turns of one conversation extend each other
    by_tenant = {}
    for _, p in arr:
        by_tenant.setdefault(p.calls[0].tenant, []).append(p.calls[0])
    grew = 0
    for calls in by_tenant.values():
        for a, b in zip(calls, calls[1:]):
            if a.session_key == b.session_key:
                assert b.messages[: len(a.messages)] == a.messages
                grew += 1
    assert grew > 0


# ----------------------------------------------------------------------------- traces


def test_jsonl_trace_prefix_sharing(tmp_path):
    rows = [
        {"timestamp": 1000, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 3]},
        {"timestamp": 1500, "input_length": 1400, "output_length": 20, "hash_ids": [1, 2, 7]},
        {"timestamp": 1200, "input_length": 700, "output_length": 5, "hash_ids": [9, 2]},
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = trace(p, region_of=["us", "eu"])
    arr = w.open.arrivals
    assert [t for t, _ in arr] == [0.0, 0.2, 0.5]
    by_id = {prog.program_id: prog for _, prog in arr}
    a, b, c = (by_id[f"t:{i}"].calls[0] for i in range(3))
    assert len(a.prompt) == 1536 * 4 and len(b.prompt) == 1400 * 4 and len(c.prompt) == 700 * 4
    block = 512 * 4
    cp = _common_prefix(a.prompt, b.prompt)
    assert 2 * block <= cp < 2 * block + 50
    assert _common_prefix(a.prompt, c.prompt) < 50
    assert [by_id[f"t:{i}"].region for i in range(3)] == ["us", "eu", "us"]
    assert (a.output_tokens, b.output_tokens) == (10, 20)
    assert trace(p).open.arrivals == trace(p).open.arrivals
    assert a.session_key == b.session_key  # keyed by the first hash id


def test_azure_trace_fixture():
    w = trace(fixture_path("azure_conv"), region_of=["us", "eu", "asia"])
    arr = w.open.arrivals
    assert arr[0][0] == 0.0 and arr[-1][0] > 60
    assert w.meta["format"] == "azure-csv"
    first = arr[0][1].calls[0]
    assert len(first.prompt) == 374 * 4 and first.output_tokens == 44
    heads = {p.calls[0].prompt[:40] for _, p in arr[:500]}
    assert len(heads) == 500  # unique prompts
    assert {p.region for _, p in arr} == {"us", "eu", "asia"}


def test_bad_inputs(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("hello,world\n")
    with pytest.raises(ValueError, match="unknown trace format"):
        trace(p)
    p = tmp_path / "bad.jsonl"
    p.write_text('{"timestamp": 1, "input_length": 2, "output_length": 3}\n{"timestamp": 2, "input_length": 2}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: missing field 'output_length'"):
        trace(p)
    p.write_text('{"timestamp": 1, "input_length": 2, "output_length": 3}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: invalid JSON"):
        trace(p)
    p.write_text('{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": ["a"]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: hash_ids"):
        trace(p)
    p = tmp_path / "az.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\nnot-a-date,1,2\n")
    with pytest.raises(ValueError, match=r"az.csv:3: bad Azure row"):
        trace(p)
    with pytest.raises(ValueError, match="not found"):
        trace(tmp_path / "nope.csv")
    with pytest.raises(ValueError, match="valid: .*conversation.*trace:PATH"):
        by_name("bogus")
    with pytest.raises(ValueError, match="unknown conversation source"):
        by_name("conversation:reddit")
    with pytest.raises(ValueError, match="no branching factor"):
        tot(branching={"us": 2}, clients={"us": 1, "eu": 1})
    sg = tmp_path / "sg.csv"
    sg.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="ServeGen header"):
        load_servegen(sg)
    with pytest.raises(ValueError):
        Call(output_tokens=1, session_key="k")
    with pytest.raises(ValueError, match="depends on"):
        Program("p", "us", [Call(prompt="x", output_tokens=1, session_key="k", depends_on=(0,))])


def test_by_name_specs():
    for spec in WORKLOAD_NAMES:
        if spec == "trace:PATH":
            continue
        kw = {"hours": 1, "mean_rps": 0.2} if spec == "servegen" else {}
        if spec == "prefix-repetition":
            kw = {"num_replicas": 1, "prompts_per_replica": 8, "num_prefixes": 2}
        w = by_name(spec, **kw)
        assert (w.closed is None) != (w.open is None)
    assert by_name("conversation:wildchat").name == "conversation:wildchat"
    assert by_name("mixed-tot").closed.clients["us"] == 2
    assert by_name("diurnal").closed.clients == {"us": 120, "eu": 40, "asia": 40}
    assert by_name(f"trace:{fixture_path('azure_code')}").meta["format"] == "azure-csv"


# ----------------------------------------------------------------------------- full data (optional)


@pytest.mark.skipif(not SHARED.is_dir(), reason="full shared data not available")
def test_full_files_load():
    assert len(load_sharegpt(SHARED / "sharegpt_sample" / "sharegpt_sample_1000.jsonl")) > 500
    assert len(load_wildchat(SHARED / "wildchat_sample" / "wildchat_with_region.jsonl", require_country=True)) > 150
    assert len(load_gsm8k(SHARED / "gsm8k" / "test.jsonl")) == 1319
    w = trace(SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv", max_requests=3000)
    assert len(w.open.arrivals) == 3000
    w = tot(path=SHARED / "gsm8k" / "test.jsonl", clients={"us": 1})
    assert len(w.closed.programs["us"][0].calls) == 15
    w = servegen(path=SHARED / "servegen" / "servegen_reason_deepseek-r1_client_rates.csv", hours=1, mean_rps=0.5)
    assert len(w.open.arrivals) > 0
    # the fixture generator reproduces the shipped fixtures byte for byte is checked in make_fixtures' docs;
    # here: fixture rows are a subset of the full files
    full_q = {q.question for q in load_gsm8k(SHARED / "gsm8k" / "test.jsonl")}
    assert {q.question for q in load_gsm8k()} <= full_q
