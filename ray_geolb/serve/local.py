"""Local Ray clusters for the demo, tests and benchmarks: never a plain ``ray.init()`` (it would join
whatever cluster already runs on the machine); regions are node labels, as in a real deployment."""

from __future__ import annotations

import socket
from typing import List

REGION_LABEL = "ray.io/availability-region"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def start_region_cluster(regions: List[str], tmp: str, namespace: str, num_cpus: int = 1):
    """A local multi-node Ray cluster, one node per region labelled ``ray.io/availability-region``
    (the head is the first region), with this process connected to it. Returns the ``Cluster``;
    the caller shuts it down (``ray.shutdown(); cluster.shutdown()``)."""
    import ray
    from ray.cluster_utils import Cluster

    if not regions:
        raise ValueError("start_region_cluster needs at least one region")
    cluster = Cluster(initialize_head=True, shutdown_at_exit=True, head_node_args={
        "num_cpus": num_cpus, "labels": {REGION_LABEL: regions[0]}, "include_dashboard": False, "temp_dir": tmp})
    try:
        for r in regions[1:]:
            cluster.add_node(num_cpus=num_cpus, labels={REGION_LABEL: r})
        ray.init(address=cluster.address, log_to_driver=False, namespace=namespace)
        cluster.wait_for_nodes()
        labels = sorted(n["Labels"].get(REGION_LABEL, "?") for n in ray.nodes() if n["Alive"])
        if labels != sorted(regions):
            raise RuntimeError(f"node labels {labels} do not match regions {regions}")
    except BaseException:
        ray.shutdown()
        cluster.shutdown()
        raise
    return cluster
