"""The `ray up` YAMLs in cluster_configs/ validate offline (no cloud credentials, no SSH).

As in the project's notes on `ray up` across regions: ``prepare_config`` then ``validate_config`` for every
YAML, plus ``commands._bootstrap_config(no_config_cache=True)`` for the local provider (the cloud
providers need credentials there). Region labels -- in ``available_node_types.*.labels`` and in every
``ray start --labels=...`` -- are checked with Ray's own label-syntax validator.
"""

import copy
import re
import shlex

import pytest
import yaml

from repo import REPO

CONFIG_DIR = REPO / "cluster_configs"
YAMLS = sorted(CONFIG_DIR.glob("*.yaml"))
REGION_KEY = "ray.io/availability-region"


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def start_commands(cfg):
    return [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in cfg.get(key, [])]


def labels_in_commands(cfg):
    """``{key: value}`` dicts from each ``--labels="k=v,..."`` (shell variables left as is)."""
    out = []
    for cmd in start_commands(cfg):
        for m in re.finditer(r"--labels=(\"[^\"]*\"|'[^']*'|\S+)", cmd):
            raw = shlex.split(m.group(1))[0]
            out.append(dict(kv.split("=", 1) for kv in raw.split(",") if kv))
    return out


def test_there_are_configs():
    names = {p.name for p in YAMLS}
    assert "local-multiregion.yaml" in names and any(n.startswith("aws-") for n in names), names
    assert any(n.startswith("gcp-") for n in names), names


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_prepare_and_validate(path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = prepare_config(load(path))
    validate_config(cfg)  # raises on schema errors
    assert cfg["cluster_name"]


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_label_syntax(path):
    from ray._private.label_utils import validate_node_label_syntax

    cfg = load(path)
    found = []
    for name, nt in (cfg.get("available_node_types") or {}).items():
        if nt.get("labels"):
            validate_node_label_syntax({k: str(v) for k, v in nt["labels"].items()})
            found.append(nt["labels"])
    for labels in labels_in_commands(cfg):
        concrete = {k: v for k, v in labels.items() if "$" not in v}
        validate_node_label_syntax(concrete)
        for k, v in labels.items():
            assert re.fullmatch(r"[A-Za-z0-9._/-]+", k), k
            assert re.fullmatch(r"[A-Za-z0-9._-]+|\$[A-Z_]+", v), v
        found.append(labels)
    assert any(REGION_KEY in lab for lab in found), f"{path.name}: no {REGION_KEY} label anywhere"


def test_label_validator_rejects_bad_syntax():
    """The check above is not vacuous: Ray's validator rejects a malformed label."""
    from ray._private.label_utils import validate_node_label_syntax

    with pytest.raises(ValueError):
        validate_node_label_syntax({REGION_KEY: "us east"})
    with pytest.raises(ValueError):
        validate_node_label_syntax({"bad key!": "us"})


def test_local_multiregion_bootstraps_offline():
    from ray.autoscaler._private import commands
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = load(CONFIG_DIR / "local-multiregion.yaml")
    cfg = prepare_config(copy.deepcopy(raw))
    validate_config(cfg)
    boot = commands._bootstrap_config(cfg, no_config_cache=True)
    assert boot["provider"]["type"] == "local"
    assert boot["provider"]["head_ip"] == raw["provider"]["head_ip"]
    assert "available_node_types" in boot  # filled in by the local provider's bootstrap


def test_local_multiregion_assigns_every_region():
    """Each worker IP's region, computed by the worker start command's own `case`, covers us/eu/asia."""
    raw = load(CONFIG_DIR / "local-multiregion.yaml")
    cmd = next(c for c in raw["worker_start_ray_commands"] if "case" in c)
    case = cmd[cmd.index("case"): cmd.index("esac") + len("esac")]
    import subprocess

    regions = {}
    for ip in raw["provider"]["worker_ips"]:
        script = f'hostname() {{ echo " {ip} "; }}; {case}; echo $REGION'
        regions[ip] = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert set(regions.values()) == {"us", "eu", "asia"}, regions
    assert all(regions[ip] == "eu" for ip in regions if ip.startswith("10.20."))
    head_labels = labels_in_commands({"head_start_ray_commands": raw["head_start_ray_commands"]})
    assert head_labels == [{REGION_KEY: "us"}]


@pytest.mark.parametrize("name, provider, cloud_region, region", [
    ("aws-us-east-1.yaml", "aws", "us-east-1", "us"),
    ("gcp-europe-west4.yaml", "gcp", "europe-west4", "eu"),
])
def test_cloud_configs_have_explicit_resources_and_region_labels(name, provider, cloud_region, region):
    raw = load(CONFIG_DIR / name)
    assert raw["provider"]["type"] == provider and raw["provider"]["region"] == cloud_region
    for node_type, nt in raw["available_node_types"].items():
        assert nt.get("resources"), f"{node_type}: offline validation needs explicit resources"
        assert nt["labels"][REGION_KEY] == region


# ---------------------------------------------------------------------------------------------- install step
WHEEL_MOUNT_SOURCE = "./dist"  # where `python -m pip wheel --no-deps -w dist .` puts the wheel


def test_install_step_installs_the_wheel_this_repository_builds(tmp_path):
    """ray_geolb is not on PyPI: every YAML ships the wheel that the documented command builds from
    this repository (file_mounts ./dist) and installs that very file. Build it here, offline, the way
    cluster_configs/README.md says, and check the YAMLs name exactly what was built."""
    import subprocess
    import sys
    import zipfile

    root = CONFIG_DIR.parent
    out = tmp_path / "dist"
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out), str(root)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    wheels = list(out.glob("ray_geolb-*.whl"))
    assert len(wheels) == 1, wheels
    whl = wheels[0]
    names = zipfile.ZipFile(whl).namelist()
    assert "ray_geolb/serve/router.py" in names and any(n.startswith("ray_geolb/data/") for n in names)
    readme = (CONFIG_DIR / "README.md").read_text()
    assert "python -m pip wheel --no-deps -w dist ." in readme
    for path in YAMLS:
        raw = load(path)
        mounts = {remote: local for remote, local in (raw.get("file_mounts") or {}).items()}
        remote = [r for r, local in mounts.items() if local == WHEEL_MOUNT_SOURCE]
        assert len(remote) == 1, f"{path.name}: no file_mounts entry ships {WHEEL_MOUNT_SOURCE}: {mounts}"
        mount = remote[0].replace("~/", "$HOME/")
        installs = [c for c in raw.get("setup_commands", []) if "pip install" in c]
        assert any(f"{mount}/{whl.name}[llm]" in c for c in installs), (path.name, whl.name, installs)
        assert not any(re.search(r"\sray_geolb(\s|$)", c) for c in installs), "installs ray_geolb from PyPI"
