"""Static validation of docker-compose.yml (no Docker engine runs here).

The compose path cannot be started in CI, so these tests make sure it cannot
silently rot: the file parses and Debian's ``docker-compose config -q`` accepts
it; every fs3 command it runs exists in fs3's CLI with the options it passes;
every ``FS3_<SECTION>_<KEY>`` it sets names a real key of that service's config
and the resulting configs load; the cluster file, node ids and target ids agree
with the services. :func:`compose_problems` returns every mismatch, and a test
feeds it drifted copies to prove it notices.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fs3 import config
from fs3.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
LOCAL = ROOT / "deploy" / "compose.local.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"

# fs3 subcommand -> config class of the process it runs
ROLE_CLASS: dict[str, type] = {
    "mgmtd": config.MgmtdConfig,
    "meta": config.MetaConfig,
    "storage": config.StorageConfig,
    "mount": config.ClientConfig,
    "admin": config.ClientConfig,
    "cluster": config.ClientConfig,
}
# FS3_* variables that are not config keys but documented discovery variables
NON_KEY_VARS = {"FS3_CLUSTER_FILE"}


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


def env_of(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def key_of(cls: type, var: str) -> tuple[str, str] | None:
    """(section, key) named by FS3_<SECTION>_<KEY> in ``cls``, or None."""
    for sec in cls.__dataclass_fields__:
        prefix = f"FS3_{sec.upper()}_"
        if var.startswith(prefix):
            key = var[len(prefix) :].lower()
            sec_cls = cls.__dataclass_fields__[sec].default_factory  # type: ignore[misc]
            if key in sec_cls().__dataclass_fields__:
                return sec, key
    return None


def fs3_argv(cmd: Any) -> list[str] | None:
    if isinstance(cmd, list) and cmd and cmd[0] == "fs3":
        return [str(x) for x in cmd]
    return None


def load_local() -> dict[str, Any]:
    """docker-compose.yml with deploy/compose.local.yml on top, merged by docker-compose itself."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (scripts/install.sh installs it)")
    r = subprocess.run(
        [exe, "-f", str(COMPOSE), "-f", str(LOCAL), "config"],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(r.stdout)
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


def compose_problems(
    data: dict[str, Any],
    *,
    cluster_file: Path = ROOT / "deploy" / "compose.cluster",
    host_network: bool = False,
) -> list[str]:
    """Everything in ``data`` (a parsed compose file) that disagrees with fs3's CLI and config.

    ``host_network``: the services share the host's network (deploy/compose.local.yml),
    so each must listen on 127.0.0.1 with a port of its own, instead of on its name.
    """
    problems: list[str] = []
    services: dict[str, Any] = data["services"]
    dockerfile = DOCKERFILE.read_text()
    node_ids: dict[int, str] = {}
    mgmtd_addrs: set[str] = set()
    cluster_ids: set[str] = set()
    ports: dict[int, str] = {}
    for name, svc in services.items():
        argv = fs3_argv(svc.get("command"))
        if argv is None:
            continue
        sub = argv[1] if len(argv) > 1 else ""
        if sub not in COMMANDS:
            problems.append(
                f"{name}: `fs3 {sub}` is not an fs3 command (known: {', '.join(COMMANDS)})"
            )
            continue
        cls = ROLE_CLASS[sub]
        env = env_of(svc)
        for var in env:
            if var.startswith("FS3_") and var not in NON_KEY_VARS and key_of(cls, var) is None:
                problems.append(f"{name}: {var} is not a key of {cls.__name__}")
        if "--config" in argv:
            path = argv[argv.index("--config") + 1]
            template = ROOT / "deploy" / Path(path).name
            if not path.startswith("/etc/fs3/") or not template.exists():
                problems.append(f"{name}: config {path} is not one of deploy/*.toml")
            elif f"deploy/{template.name}" not in dockerfile:
                problems.append(
                    f"{name}: deploy/Dockerfile does not copy deploy/{template.name} to /etc/fs3/"
                )
            else:
                try:
                    cfg = config.load(cls, template, env=env)
                except config.ConfigError as e:
                    problems.append(f"{name}: {e.message}")
                    continue
                node = getattr(cfg, "node", None)
                if node is not None:
                    if node.id in node_ids:
                        problems.append(
                            f"{name}: node id {node.id} is also used by {node_ids[node.id]}"
                        )
                    node_ids[node.id] = name
                    if host_network:
                        if node.host != "127.0.0.1" or svc.get("network_mode") != "host":
                            problems.append(
                                f"{name}: on the host network it must listen on 127.0.0.1, not {node.host!r}"
                            )
                        own = [node.port]
                        if sub == "storage":
                            own.append(cfg.transport.tcp_port)
                        if hasattr(cfg, "metrics") and cfg.metrics.port > 0:
                            own.append(cfg.metrics.port)
                        for port in own:
                            if port in ports or port <= 0:
                                problems.append(
                                    f"{name}: port {port} is not its own ({ports.get(port, 'free port')})"
                                )
                            ports[port] = name
                    elif node.host != name and svc.get("hostname") != node.host:
                        problems.append(f"{name}: advertises host {node.host!r}, not its own name")
                if sub == "mgmtd":
                    mgmtd_addrs.add(f"{cfg.node.host}:{cfg.node.port}")
                if hasattr(cfg, "cluster"):
                    cluster_ids.add(cfg.cluster.id)
                if sub == "storage":
                    st = cfg.storage
                    i = cfg.node.id - 10000
                    want = [i * 100 + j for j in range(1, len(st.targets) + 1)]
                    if not st.targets or st.target_ids != want:
                        problems.append(
                            f"{name}: target ids {st.target_ids} should be {want} (storage-i -> i*100+j)"
                        )
                    vols = [str(v).split(":")[1] for v in svc.get("volumes", []) if ":" in str(v)]
                    if not any(t.startswith(v) for v in vols for t in st.targets):
                        problems.append(f"{name}: its targets {st.targets} are not on a volume")
    cf = config.read_cluster_file(cluster_file)
    if set(cf.mgmtd_addresses) != mgmtd_addrs:
        problems.append(
            f"deploy/{cluster_file.name} lists {sorted(cf.mgmtd_addresses)}, mgmtd services are {sorted(mgmtd_addrs)}"
        )
    if cluster_ids and cluster_ids != {cf.cluster_id}:
        problems.append(
            f"cluster ids {sorted(cluster_ids)} differ from deploy/{cluster_file.name}'s {cf.cluster_id!r}"
        )
    return problems


@pytest.mark.timeout(30)
def test_compose_parses_and_has_the_required_services() -> None:
    data = load_compose()
    services = data["services"]
    roles = {n: (fs3_argv(s.get("command")) or ["", ""])[1] for n, s in services.items()}
    assert sum(r == "mgmtd" for r in roles.values()) == 2
    assert sum(r == "meta" for r in roles.values()) == 2
    assert sum(r == "storage" for r in roles.values()) == 3
    assert sum(r == "mount" for r in roles.values()) == 1
    fdb = [
        s
        for s in services.values()
        if str(s.get("image", "")).startswith("foundationdb/foundationdb:")
    ]
    assert len(fdb) == 2, "an FDB server and a one-shot init from the official image"
    init = next(s for s in fdb if "configure new single ssd" in str(s.get("command")))
    assert init.get("restart") == "no"
    # storage nodes each have their own volume
    storage_vols = [tuple(s["volumes"]) for n, s in services.items() if roles[n] == "storage"]
    assert len(set(storage_vols)) == 3
    fuse = next(s for n, s in services.items() if roles[n] == "mount")
    assert any("/dev/fuse" in d for d in fuse["devices"]) and "SYS_ADMIN" in fuse["cap_add"]
    # start order: everything fs3 waits on a condition, and every long-running fs3 service is health-checked
    for n, s in services.items():
        if roles[n] in {"mgmtd", "meta", "storage", "mount", "admin"}:
            deps = s.get("depends_on")
            assert isinstance(deps, dict) and all("condition" in d for d in deps.values()), n
        if roles[n] in {"mgmtd", "meta", "storage", "mount"}:
            assert "healthcheck" in s, n
    mgmtd_deps = next(s for n, s in services.items() if roles[n] == "mgmtd")["depends_on"]
    assert any(d["condition"] == "service_completed_successfully" for d in mgmtd_deps.values())


@pytest.mark.timeout(60)
def test_docker_compose_config_accepts_the_file() -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (scripts/install.sh installs it)")
    r = subprocess.run(
        [exe, "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.timeout(30)
def test_commands_and_config_keys_match_fs3() -> None:
    assert compose_problems(load_compose()) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "mutate, expect",
    [
        (
            lambda d: d["services"]["storage1"]["environment"].__setitem__(
                "FS3_STORAGE_NO_SUCH_KEY", "1"
            ),
            "FS3_STORAGE_NO_SUCH_KEY",
        ),
        (
            lambda d: d["services"]["meta1"].__setitem__(
                "command", ["fs3", "metadata", "--config", "/etc/fs3/meta.toml"]
            ),
            "metadata",
        ),
        (
            lambda d: d["services"]["mgmtd2"]["environment"].__setitem__("FS3_NODE_PORT", "8001"),
            "compose.cluster",
        ),
        (
            lambda d: d["services"]["storage2"]["environment"].__setitem__(
                "FS3_STORAGE_TARGET_IDS", "101,102"
            ),
            "should be [201, 202]",
        ),
        (
            lambda d: d["services"]["storage3"]["environment"].__setitem__("FS3_NODE_ID", "10002"),
            "node id",
        ),
        (
            lambda d: d["services"]["mgmtd1"]["environment"].__setitem__(
                "FS3_MGMTD_LEASE_LENGTH_S", "-5"
            ),
            "lease_length_s",
        ),
    ],
)
def test_drift_is_detected(mutate: Any, expect: str) -> None:
    data = copy.deepcopy(load_compose())
    mutate(data)
    problems = compose_problems(data)
    assert problems and any(expect in p for p in problems), problems


LOCAL_CLUSTER = ROOT / "deploy" / "compose.local.cluster"


@pytest.mark.timeout(60)
def test_local_override_keeps_the_topology_on_sqlite_and_the_host_network() -> None:
    """deploy/compose.local.yml: same services and start order, no FoundationDB, 127.0.0.1 ports."""
    base = load_compose()["services"]
    data = load_local()
    services = data["services"]
    assert compose_problems(data, cluster_file=LOCAL_CLUSTER, host_network=True) == []
    # the fdb server is left out (profile), nothing waits for it; everything else stays
    assert services["fdb"].get("profiles") == ["fdb"]
    assert set(services) == set(base)
    for name, svc in services.items():
        assert "fdb" not in (svc.get("depends_on") or {}), name
        if name != "fdb":
            assert svc.get("network_mode") == "host", name
            assert svc.get("image") == "fs3:local", name
        # health checks and start order of the production file are kept
        assert set(svc.get("depends_on") or {}) == set(base[name].get("depends_on") or {}), name
        assert ("healthcheck" in svc) == ("healthcheck" in base[name]), name
    # mgmtd and meta share one SQLite database on one volume
    urls = set()
    for name in ("mgmtd1", "mgmtd2", "meta1", "meta2"):
        env = env_of(services[name])
        urls.add(env["FS3_KV_URL"])
        assert "kv-data:/var/lib/fs3/kv:rw" in services[name]["volumes"], name
    assert len(urls) == 1 and urls.pop().startswith("sqlite:///var/lib/fs3/kv/")
    # storage nodes keep a volume each
    vols = [tuple(str(v) for v in services[f"storage{i}"]["volumes"]) for i in (1, 2, 3)]
    assert len(set(vols)) == 3


@pytest.mark.timeout(60)
def test_local_override_drift_is_detected() -> None:
    data = load_local()
    data["services"]["meta2"]["environment"]["FS3_NODE_PORT"] = "17101"
    problems = compose_problems(data, cluster_file=LOCAL_CLUSTER, host_network=True)
    assert any("port 17101 is not its own" in p for p in problems), problems
    data = load_local()
    data["services"]["storage1"]["environment"]["FS3_NODE_HOST"] = "0.0.0.0"
    problems = compose_problems(data, cluster_file=LOCAL_CLUSTER, host_network=True)
    assert any("must listen on 127.0.0.1" in p for p in problems), problems


def _fs3_commands() -> list[tuple[str, list[str]]]:
    out = []
    for name, svc in load_compose()["services"].items():
        argv = fs3_argv(svc.get("command"))
        if argv:
            out.append((name, argv))
        hc = (svc.get("healthcheck") or {}).get("test")
        if isinstance(hc, list) and hc[:1] == ["CMD"] and hc[1:2] == ["fs3"]:
            out.append((f"{name} healthcheck", [str(x) for x in hc[1:]]))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, argv", _fs3_commands(), ids=[n for n, _ in _fs3_commands()])
def test_every_fs3_command_accepts_its_options(name: str, argv: list[str]) -> None:
    """Run ``fs3 <cmd> [<subcmd>] --help`` and check every option the compose file passes exists."""
    help_argv = argv[1:2]
    positional = [a for a in argv[2:] if not a.startswith("-")]
    # a subcommand (admin create-chain-table, cluster probe) comes right after the options before it
    subcmds = {"create-chain-table", "probe", "credentials"}
    help_argv += [a for a in positional if a in subcmds]
    r = subprocess.run(
        [sys.executable, "-m", "fs3.cli.main", *help_argv, "--help"],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=ROOT,
    )
    assert r.returncode == 0, (
        f"{name}: `fs3 {' '.join(help_argv)} --help` failed: {r.stderr[-2000:]}"
    )
    options = [a for a in argv[2:] if a.startswith("--")]
    if argv[1] == "admin":  # global options of admin are on its top-level help
        top = subprocess.run(
            [sys.executable, "-m", "fs3.cli.main", "admin", "--help"],
            capture_output=True,
            text=True,
            timeout=50,
            cwd=ROOT,
        ).stdout
        r_out = r.stdout + top
    else:
        r_out = r.stdout
    missing = [o for o in options if o not in r_out]
    assert not missing, f"{name}: fs3 {' '.join(help_argv)} has no option(s) {missing}"
