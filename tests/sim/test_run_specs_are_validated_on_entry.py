"""A simulator run is a dict on the wire and a RunSpec on entry: ``run_one`` validates it before it
simulates, a bad run names its field, and the summary records the dict as given."""

import json

import pytest

from ray_geolb.sim.run_spec import RunSpec, WorkloadSpec
from ray_geolb.sim.scenarios import build_workload, run_one, scenario_runs
from ray_geolb.sim.simulator import SimConfig

pytestmark = pytest.mark.timeout(60)


def _run(**over):
    run = {"label": "tiny", "group": "g", "system": "ll", "replicas": {"us": 1},
           "workload": {"name": "conversation:wildchat", "kw": {"clients": {"us": 2}, "seed": 0}},
           "sim": {"duration_s": 10.0, "seed": 0, "warmup_s": 0.0}, "deploy": {}}
    run.update(over)
    return run


def test_every_scenario_run_is_a_valid_run_spec():
    for name in ("skylb-fig8", "network-hard", "shared-context", "gorgo"):
        for r in scenario_runs(name, scale=0.1, duration_s=2.0):
            spec = RunSpec.model_validate(r)
            assert spec.label == r["label"] and spec.system == r["system"] and isinstance(spec.sim, SimConfig)
            assert RunSpec.model_validate(json.loads(json.dumps(r))) == spec  # what a Ray task receives


@pytest.mark.parametrize("bad, field", [
    ({"sim": {"duraton_s": 2.0}}, "sim.duraton_s"),
    ({"sim": {"duration_s": 0}}, "duration_s must be > 0"),
    ({"sim": {"seed": "x"}}, "sim.seed"),
    ({"replicas": {"us": -1}}, "replicas.us"),
    ({"workload": {"kw": {}}}, "workload.name"),
    ({"workload": {"name": "tot", "kwargs": {}}}, "workload.kwargs"),
    ({"label": ""}, "label"),
    ({"sytem": "ll"}, "sytem"),
    ({"deploy": ["x"]}, "deploy"),
])
def test_a_bad_run_names_its_field_before_it_simulates(bad, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        run_one(_run(**bad))


def test_the_summary_records_the_run_dict_as_given():
    run = _run(deploy=None)  # no overrides, as an older run dict may say
    m = run_one(run)
    assert m["run"] == {k: run[k] for k in ("system", "replicas", "workload", "sim", "deploy")}
    assert m["label"] == "tiny" and m["group"] == "g" and m["scenario"] == ""
    assert m["config"]["duration_s"] == 10.0 and m["counters"]["requests_completed"] > 0


def test_build_workload_takes_a_dict_or_a_workload_spec():
    spec = {"name": "conversation:wildchat", "kw": {"clients": {"us": 2}, "seed": 0}}
    a, b = build_workload(spec), build_workload(WorkloadSpec(**spec))
    assert type(a) is type(b)
    with pytest.raises(ValueError, match="region_map"):
        build_workload(dict(spec, region_map=["us"]))
