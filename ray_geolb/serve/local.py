"""Local Ray clusters for the demo, tests and benchmarks: never a plain ``ray.init()`` (it would join
whatever cluster already runs on the machine); regions are node labels, as in a real deployment.

Nothing here relies on what an earlier run left on the machine. ``ray.cluster_utils.Cluster`` writes
its address to ``<Ray's default temp dir>/ray_current_cluster`` (``$RAY_TMPDIR/ray`` or
``/tmp/ray``) and crashes with ``FileNotFoundError`` when that folder does not exist -- which is the
case on a fresh machine, and whenever ``RAY_TMPDIR`` names a new empty folder (as CI does). It would
also overwrite the address of a cluster the user runs on the same machine. :func:`start_region_cluster`
therefore points Ray's default temp dir at this run's own temp dir while the cluster starts (the
address file lands there, and goes away with it) and creates the folder first.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from typing import Iterator, List, Optional

#: the node label that names a node's region, here as on a real cluster (``ray up`` sets it per node type)
REGION_LABEL = "ray.io/availability-region"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


#: longest temp dir a local cluster may use: Ray puts Unix sockets at
#: ``<dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store`` (~64 bytes more), and a socket
#: path must stay under 108 bytes
MAX_RAY_TEMP_DIR = 40


def ray_temp_dir(prefix: str = "geolb_") -> str:
    """A new empty folder for one local Ray cluster's session files: under ``$RAY_TMPDIR`` when set
    (CI points it at a fresh folder) and short enough for Ray's socket paths, else under ``/tmp``
    (or the system temp dir). Always new, so nothing an earlier run left is reused."""
    prefix = prefix[:12]
    candidates = [os.environ.get("RAY_TMPDIR"), "/tmp" if os.path.isdir("/tmp") else None, tempfile.gettempdir()]
    for base in candidates:
        if base and len(os.path.join(base, prefix)) + 8 <= MAX_RAY_TEMP_DIR:
            os.makedirs(base, exist_ok=True)
            return tempfile.mkdtemp(prefix=prefix, dir=base)
    raise RuntimeError(f"no temp dir short enough for Ray's socket paths (<= {MAX_RAY_TEMP_DIR} characters); "
                       "set RAY_TMPDIR to a short path such as /tmp/r")


def start_local_ray(num_cpus: int = 2, prefix: str = "geolb_", **init_kwargs):
    """``ray.init(address="local")`` -- a new single-node cluster of this process's own (never one
    already running on the machine) in a new temp dir from :func:`ray_temp_dir`, no dashboard.
    Extra keyword arguments go to ``ray.init`` (``namespace``, ``runtime_env``, ``logging_level``...).
    Returns the ``ray.init`` context; the caller calls ``ray.shutdown()``."""
    import ray

    init_kwargs.setdefault("include_dashboard", False)
    init_kwargs.setdefault("log_to_driver", False)
    ctx = ray.init(address="local", num_cpus=num_cpus, _temp_dir=ray_temp_dir(prefix), **init_kwargs)
    if not ctx.address_info.get("node_id"):
        ray.shutdown()
        raise RuntimeError("ray.init(address='local') did not start a new local cluster")
    return ctx


@contextlib.contextmanager
def _default_ray_temp_dir(tmp: str) -> Iterator[None]:
    """Ray's default temp dir is ``tmp`` (and exists) inside the block; the environment is restored after."""
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    os.makedirs(os.path.join(tmp, "ray"), exist_ok=True)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old


def start_region_cluster(regions: List[str], tmp: Optional[str] = None, namespace: str = "geolb",
                         num_cpus: int = 1, metrics_export_port: Optional[int] = None):
    """A local multi-node Ray cluster, one node per region labelled ``ray.io/availability-region``
    (the head is the first region), with this process connected to it. ``tmp``: the cluster's temp
    dir (None: a new one from :func:`ray_temp_dir`). Returns the ``Cluster``; the caller shuts it
    down (``ray.shutdown(); cluster.shutdown()``). ``metrics_export_port``: where the head node (the
    first region) serves Prometheus metrics (``/metrics``); other nodes get free ports."""
    import ray
    from ray.cluster_utils import Cluster

    if not regions:
        raise ValueError("start_region_cluster needs at least one region")
    tmp = tmp or ray_temp_dir()
    os.makedirs(tmp, exist_ok=True)
    with _default_ray_temp_dir(tmp):
        head = {"num_cpus": num_cpus, "labels": {REGION_LABEL: regions[0]}, "include_dashboard": False,
                "temp_dir": tmp}
        if metrics_export_port is not None:
            head["metrics_export_port"] = metrics_export_port
        cluster = Cluster(initialize_head=True, shutdown_at_exit=True, head_node_args=head)
    try:
        for r in regions[1:]:
            extra = {"metrics_export_port": free_port()} if metrics_export_port is not None else {}
            cluster.add_node(num_cpus=num_cpus, labels={REGION_LABEL: r}, **extra)
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


@contextlib.contextmanager
def serve_on_region_cluster(regions: List[str], prefix: str = "geolb_", namespace: str = "geolb", num_cpus: int = 1,
                            metrics_export_port: Optional[int] = None) -> Iterator[str]:
    """:func:`start_region_cluster` (in a new temp dir named ``prefix``...) with Ray Serve started on it (one
    HTTP proxy, on the head, at a free port on 127.0.0.1); yields the proxy's base URL and shuts Serve,
    this process's Ray connection and the cluster down afterwards, whatever happened."""
    import ray
    from ray import serve

    cluster = start_region_cluster(list(regions), ray_temp_dir(prefix), namespace=namespace, num_cpus=num_cpus,
                                   metrics_export_port=metrics_export_port)
    try:
        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        try:
            serve.shutdown()
        except Exception:  # noqa: BLE001 - already down: the cluster still goes
            pass
        ray.shutdown()
        cluster.shutdown()
