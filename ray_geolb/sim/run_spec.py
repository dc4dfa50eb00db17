"""One simulator run, typed: :class:`RunSpec` (and its :class:`WorkloadSpec`).

A run travels as a plain dict (JSON-able: the scenarios build it, the CLI and the benchmarks change
it, Ray tasks ship it, ``results.json`` records it); :func:`~ray_geolb.sim.scenarios.run_one`
validates it here on entry, so a bad run fails before it simulates, with an error naming the field
(``sim.duraton_s``, ``workload.name``, ``replicas.us``, ``faults[0].region``).

``sim.faults`` (``SimConfig.faults``, ``sim/faults.py``): region outages and partitions, e.g.
``[{"kind": "outage", "region": "eu", "start_s": 60, "duration_s": 60, "detect_s": 10}]``; each is checked
here against the run (a kind, a region of the deployment's network, a window inside ``[0, sim.duration_s)``,
a duration > 0, no two overlapping windows on one region)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator, model_validator
from typing_extensions import Annotated

from .simulator import SimConfig

__all__ = ["RunSpec", "WorkloadSpec"]

_Name = Annotated[str, Field(min_length=1)]


class WorkloadSpec(BaseModel):
    """``run["workload"]``: what :func:`~ray_geolb.sim.scenarios.build_workload` builds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: _Name = Field(description="A workload name (workloads.WORKLOAD_NAMES), e.g. 'tot', "
                                    "'conversation:wildchat', 'trace'.")
    kw: Dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the workload's builder.")
    data_dir: Optional[str] = Field(None, description="Where to look for the dataset file when kw has no 'path'.")
    region_map: Optional[Dict[str, str]] = Field(
        None, description="{workload region: network region}, applied to every client after building.")


class RunSpec(BaseModel):
    """One run: a system on a deployment, one workload, one simulator configuration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: _Name = Field(description="The run's name in tables and results (unique within a sweep).")
    group: str = Field("", description="The panel or group the run belongs to (e.g. 'tot').")
    scenario: str = Field("", description="The scenario it came from ('simulate' for a CLI workload).")
    system: _Name = Field(description="A system of sim.deploy.SYSTEMS or a policy name.")
    replicas: Dict[str, NonNegativeInt] = Field(description="Model replicas per region.")
    workload: WorkloadSpec
    sim: SimConfig = Field(default_factory=SimConfig, description="The simulator's configuration (SimConfig).")
    deploy: Dict[str, Any] = Field(default_factory=dict,
                                   description="DeploymentSpec overrides (checked by sim.deploy.deployment_for).")

    @field_validator("deploy", mode="before")
    @classmethod
    def _no_deploy(cls, v: Any) -> Any:
        return {} if v is None else v

    @model_validator(mode="after")
    def _fault_regions(self) -> "RunSpec":
        if self.sim.faults:
            from .deploy import resolve_network
            from .faults import check_faults

            check_faults(self.sim.faults, regions=resolve_network(self.deploy.get("network")).regions)
        return self
