"""The Serve adapter drives a policy through the policy's methods, never its load tracker: no code
under ``ray_geolb/serve`` assigns to a tracker's attributes, sets ``seen_margin_s``, or calls a tracker
method that changes its accounting (``reserve`` / ``release`` / ``set_headroom_share`` /
``set_seen_margin`` / ``revalidate`` on the ``Policy`` do that). Reading the tracker's figures is the
``LocalLayer`` protocol's business and allowed. And Ray's private ``RequestRouter`` members are used
in one file only. Source checks, no Ray."""

import ast
import re

from ray_geolb.policy import RouteRequest, build_policy
from repo import REPO, parse_python

SERVE = REPO / "ray_geolb" / "serve"
#: LoadTracker queries that change nothing (the region layer's LocalLoad reads)
TRACKER_READS = {"free_slots", "total_outstanding", "stats", "unseen", "unseen_tokens", "outstanding",
                 "outstanding_of", "tokens_inflight", "is_available"}


def _is_tracker(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "tracker"


def _tracker_writes(path) -> list:
    tree = parse_python(path.read_text(), str(path))
    # names bound to a tracker anywhere in the file (``tr = self.policy.tracker``)
    aliases = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _is_tracker(n.value)
               for t in n.targets if isinstance(t, ast.Name)}

    def through_tracker(node) -> bool:
        return _is_tracker(node) or (isinstance(node, ast.Name) and node.id in aliases)

    out = []
    for n in ast.walk(tree):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(
            n, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and (through_tracker(t.value) or t.attr == "seen_margin_s"):
                out.append(f"{path.name}:{n.lineno}: assigns {ast.unparse(t)}")
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and through_tracker(n.func.value) \
                and n.func.attr not in TRACKER_READS:
            out.append(f"{path.name}:{n.lineno}: calls {ast.unparse(n.func)}")
    return out


def test_no_serve_code_writes_to_the_policys_tracker():
    files = sorted(SERVE.rglob("*.py"))
    assert len(files) >= 10
    offenders = [o for p in files for o in _tracker_writes(p)]
    offenders += [f"{p.name}: sets seen_margin_s" for p in files
                  if re.search(r"seen_margin_s\s*=(?!=)", p.read_text())]
    assert not offenders, offenders


def test_the_guard_catches_a_write(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(self):\n    tr = self.policy.tracker\n    tr.on_dispatch('a', 'r', 0.0)\n"
                   "    self.policy.tracker.set_share(0, 2)\n    self.policy.tracker.share = (0, 1)\n"
                   "    self.policy.tracker.free_slots()\n")
    found = _tracker_writes(bad)
    assert len(found) == 3 and all("free_slots" not in f for f in found), found


def test_the_policy_methods_reach_its_tracker():
    p = build_policy({"name": "skylb", "availability": {"mode": "sp-p"}}, targets=["a", "b"])
    tr = p.tracker
    req = RouteRequest(request_id="r1", text="x" * 40)
    p.reserve(req, "a", 1.0)
    assert tr.outstanding("a") == 1
    assert p.release("r1", "a", 2.0) and tr.outstanding("a") == 0
    assert not p.release("r1", "a", 2.0)
    p.set_headroom_share(1, 3)
    assert p.headroom_share == (1, 3) == tr.share
    p.set_seen_margin(0.25)
    assert tr.seen_margin_s == 0.25
    for bad in (-1, "x", None):
        try:
            p.set_seen_margin(bad)
        except ValueError:
            continue
        raise AssertionError(f"set_seen_margin({bad!r}) was accepted")
    assert p.revalidate(100.0) == 0  # nothing reported: nothing frozen


# Ray 2.60 RequestRouter members that are not public API (the facts note, section 1)
RAY_PRIVATE = re.compile(r"\b(_replicas|_replica_queue_len_cache|_pending_requests_by_id|_deployment_id|"
                         r"_choose_replica_for_request|_compute_backoff_s|_remove_pending_request_from_indices|"
                         r"_probe_queue_lens|_backoff)\b|ray\.serve\._private")


def test_one_serve_file_touches_rays_private_router_members():
    users = sorted(str(p.relative_to(SERVE)) for p in SERVE.rglob("*.py") if RAY_PRIVATE.search(p.read_text()))
    assert len(users) <= 1, users
