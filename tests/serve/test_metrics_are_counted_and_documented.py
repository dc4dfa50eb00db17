"""The router's and the ingress's metrics (serve/metrics.py): counted on the request path without Ray,
exported by a flush, and every metric documented in the README and drawn in the Grafana dashboard.
(The scrape of a real cluster's endpoint is in test_three_regions_over_http.py.)"""

from __future__ import annotations

import asyncio
import json

import pytest
from fakes import fake_replica, offline_router, pending_request

from ray_geolb.serve.metrics import METRICS, MetricSink
from repo import REPO


def test_sink_counts_observes_and_keeps_totals_across_flushes():
    m = MetricSink({"region": "us"}, export=False)
    m.count("geolb_forwards_total", "us", "eu")
    m.count("geolb_forwards_total", "us", "eu", n=2)
    m.count("geolb_forwards_total", "us", "asia")
    m.observe("geolb_router_decision_seconds", 1e-4, "geoprefix")
    m.gauge("geolb_ingress_queue", 3)
    assert m.total("geolb_forwards_total", "us", "eu") == 3 and m.total("geolb_forwards_total") == 4
    m.flush()
    assert m.counts == {} and m.observations == {}  # handed over
    assert m.total("geolb_forwards_total", "us") == 4  # and still known
    assert m._tags("geolb_forwards_total", ("us", "eu")) == {"region": "us", "src": "us", "dst": "eu"}


def test_the_router_counts_its_decisions_and_holds():
    r = offline_router(region="us")
    reps = [fake_replica("a", {"num_waiting": 0, "num_running": 0, "max_num_seqs": 1, "timestamp": 1e12})]
    r._sync(reps)
    r.metrics._export = False

    async def route():  # on an event loop, as in Ray's router thread
        prs = [pending_request({"messages": [{"role": "user", "content": f"q{i} " * 40}]}, f"s{i}", f"i{i}")
               for i in range(2)]
        return r._choose(reps, prs[0]), r._choose(reps, prs[1])

    first, second = asyncio.run(route())
    assert first and first[0][0] is reps[0]
    assert second == []  # the one slot is taken: held
    m = r.metrics
    assert m.total("geolb_router_decisions_total", "geoprefix", "routed") == 1
    assert m.total("geolb_router_decisions_total", "geoprefix", "held") == 1
    r._flush_metrics()
    assert m.gauges[("geolb_router_held", ())] == 1 and m.gauges[("geolb_router_available_replicas", ())] == 0


@pytest.mark.parametrize("doc", ["README.md", "dashboards/geolb.json"])
def test_every_metric_is_documented_and_drawn(doc):
    text = (REPO / doc).read_text()
    if doc.endswith(".json"):
        json.loads(text)  # a valid dashboard
    missing = [n for n in METRICS if f"ray_{n}" not in text]
    assert missing == [], f"{doc} does not mention {missing}"
