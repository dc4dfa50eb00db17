"""The registry's wire messages are pydantic models: the heartbeat (``Heartbeat``, built by
``heartbeat_message``) and the snapshot delta (``SnapshotDelta``). On the wire they stay plain dicts; a bad
field is refused by a message that names it, with the registry's refusal code."""

import json

import pytest
from pydantic import ValidationError

from ray_geolb.policy.region.heartbeat import Heartbeat, first_error, heartbeat_message
from ray_geolb.policy.region.snapshot_sync import SnapshotDelta, validate_delta


def test_the_builder_returns_the_validated_models_plain_wire_dict():
    hb = heartbeat_message("us", "us/1", 2, 3, {"eu": 0.05, "us": 0.0}, extra={"inflight": 4, "t_p_s": 1e-4},
                           delay_s=0.01)
    assert type(hb) is dict and json.loads(json.dumps(hb)) == hb
    assert hb == {"region": "us", "source": "us/1", "available_replicas": 2, "queue_len": 3, "rtts": {"eu": 0.05},
                  "delay_s": 0.01, "extra": {"inflight": 4, "t_p_s": 1e-4}}
    assert isinstance(hb["extra"]["inflight"], int)  # an int stays an int (the registry sums it)
    bare = heartbeat_message("us", "us", 0, 0, {})
    assert set(bare) == {"region", "source", "available_replicas", "queue_len", "rtts"}  # no empty extras
    assert Heartbeat.model_validate(hb).wire() == hb


@pytest.mark.parametrize("kw, field", [
    (dict(queue_len=-1), "heartbeat.queue_len"),
    (dict(available_replicas=10**40), "heartbeat.available_replicas"),
    (dict(extra={"inflight": float("inf")}), "heartbeat.extra['inflight']"),
    (dict(delay_s=11.0), "heartbeat.delay_s"),
    (dict(rtts={"eu": -1.0}), "heartbeat.rtts['eu']"),
])
def test_the_builder_refuses_a_value_out_of_its_bounds_by_name(kw, field):
    args = dict(region="us", source="us/1", available_replicas=1, queue_len=0, rtts={}) | kw
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        heartbeat_message(**args)


def test_a_validation_error_maps_to_the_registry_refusal_code():
    ctx = {"regions": frozenset({"us", "eu"}), "max_regions": 64}
    cases = [({"region": "asia", "available_replicas": 1, "source": "a b"}, "unknown_region"),
             ({"region": "u s", "available_replicas": 1}, "bad_name"),
             ({"region": "us", "source": "us/" + "x" * 200, "available_replicas": 1}, "bad_name"),
             ({"region": "us", "available_replicas": True}, "malformed"),
             ("junk", "malformed")]
    for item, code in cases:
        with pytest.raises(ValidationError) as e:
            Heartbeat.model_validate(item, context=ctx)
        assert first_error(e.value, "heartbeat")[0] == code, item
    hb = Heartbeat.model_validate({"region": "us", "available_replicas": 1, "rtts": {"eu": 1, "mars": 2, "us": 0}},
                                  context=ctx)
    assert hb.rtts == {"eu": 1.0}  # itself and regions the registry does not serve left out


def test_a_snapshot_delta_is_a_typed_model_with_64_bit_rows():
    d = validate_delta({"version": 2, "base": 1, "reset": False, "geometry": [8, 0.0],
                        "upsert": [[5, -1, 0, 8, {"eu": 1}]], "remove": [7], "more": 0}, max_rows=10)
    assert isinstance(d, SnapshotDelta) and d.upsert[0].wire() == [5, -1, 0, 8, {"eu": 1.0}] and not d.more
    with pytest.raises(ValueError, match=r"snapshot_delta\.upsert\[0\]\.key"):
        validate_delta({"version": 1, "reset": True, "geometry": [8, 0.0], "upsert": [[1 << 64, -1, 0, 8, {"eu": 1}]]},
                       max_rows=10)
    with pytest.raises(ValueError, match=r"snapshot_delta\.remove\[1\]"):
        validate_delta({"version": 1, "reset": True, "geometry": [8, 0.0], "remove": [1, "x"]}, max_rows=10)
