"""deploy/ checked by parsing it, since no cluster or init system runs here: the Kubernetes
manifests' probes, ports and host paths against the daemon's own arguments, the systemd unit's
directories against its command line, the example config against zerod's flags, the Containerfile
against both, the Prometheus scrape configs against where each deployment keeps its viewer token,
and `systemd-analyze verify` and `promtool check config` where they are installed.

ZEROD_BIN names the built zerod (ctest sets it)."""

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import tomllib

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
ZEROD = os.environ.get("ZEROD_BIN", os.path.join(ROOT, "build", "bin", "zerod"))


def flag_values(args):
    """["--socket", "/run/x", "--no-auth"] -> {"--socket": "/run/x", "--no-auth": True}."""
    values = {}
    i = 0
    while i < len(args):
        assert args[i].startswith("--"), f"not a flag: {args[i]!r} in {args}"
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            values[args[i]] = args[i + 1]
            i += 2
        else:
            values[args[i]] = True
            i += 1
    return values


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def zerod_flags():
    """The long flags `zerod --help` lists."""
    out = subprocess.run([ZEROD, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"^\s+(?:-\w,)?(--[a-z0-9-]+)", out, re.MULTILINE))


@pytest.fixture(scope="module")
def manifests():
    with open(os.path.join(DEPLOY, "kubernetes", "zerod.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module")
def daemon(manifests):
    pod = manifests["DaemonSet"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    return pod, container, flag_values(container["args"])


def test_every_daemonset_argument_is_a_zerod_flag(daemon):
    _, _, args = daemon
    unknown = set(args) - zerod_flags()
    assert not unknown, f"not zerod flags: {unknown}"


def test_grpc_probes_ask_the_health_port_the_daemon_listens_on(daemon):
    _, container, args = daemon
    health = port_of(args["--health-listen"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == health
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == health, probe
    # The gRPC port (TLS, client certificates) is not what the kubelet's probe can speak.
    assert health != port_of(args["--listen"])
    assert ports["grpc"] == port_of(args["--listen"])


def test_the_service_targets_the_daemons_grpc_and_metrics_ports(manifests, daemon):
    _, container, args = daemon
    service = manifests["Service"]
    assert service["spec"]["selector"] == manifests["DaemonSet"]["spec"]["selector"]["matchLabels"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    targets = {p["name"]: p for p in service["spec"]["ports"]}
    assert named[targets["grpc"]["targetPort"]] == port_of(args["--listen"])
    assert named[targets["metrics"]["targetPort"]] == port_of(args["--http-listen"])
    # Each daemon holds its own node's jobs: a pod must reach the one on its node.
    assert service["spec"]["internalTrafficPolicy"] == "Local"


def test_the_daemonsets_tcp_port_needs_tls_client_certificates_and_tokens(daemon):
    # The node's network reaches port 7420 (hostPort): TLS with client certificates from the
    # mounted Secret, job tokens on, nothing that would open it.
    pod, container, args = daemon
    assert not args["--listen"].startswith("127.")
    for flag in ("--no-auth", "--allow-plaintext-tcp", "--open-inspection"):
        assert flag not in args, flag
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert "tls" in secrets
    for flag in ("--tls-cert", "--tls-key", "--tls-client-ca"):
        assert os.path.dirname(args[flag]) == mounts["tls"], flag


@pytest.fixture(scope="module")
def scrape_jobs():
    with open(os.path.join(DEPLOY, "prometheus", "zerod-scrape.yaml")) as f:
        return {job["job_name"]: job for job in yaml.safe_load(f)["scrape_configs"]}


def test_every_scrape_job_sends_a_bearer_token_from_a_credentials_file(scrape_jobs):
    # zerod's HTTP listener answers 401 without the viewer or admin token.
    assert scrape_jobs
    for name, job in scrape_jobs.items():
        authorization = job["authorization"]
        assert authorization.get("type", "Bearer") == "Bearer", name
        assert authorization["credentials_file"].startswith("/"), name
        assert "credentials" not in authorization, f"{name}: a token written into the config"


def test_the_kubernetes_scrape_keeps_the_daemonsets_metrics_port_not_annotations(
        scrape_jobs, daemon):
    pod, container, args = daemon
    job = scrape_jobs["zerod-kubernetes"]
    assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    (keep,) = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert keep["source_labels"] == ["__meta_kubernetes_pod_label_app",
                                     "__meta_kubernetes_pod_container_port_name"]
    app, port_name = keep["regex"].split(";")
    assert pod["metadata"]["labels"]["app"] == app
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[port_name] == port_of(args["--http-listen"])
    # A scrape driven by the prometheus.io annotations sends no token: it would only collect 401s.
    annotations = pod["metadata"].get("annotations", {})
    assert "prometheus.io/scrape" not in annotations


def test_the_node_scrape_reads_the_token_the_unit_makes_for_prometheus(scrape_jobs):
    service = unit()["Service"]
    _, args = unit_exec_args()
    job = scrape_jobs["zerod"]
    token = args["--viewer-token-file"]
    assert job["authorization"]["credentials_file"] == token
    # In the runtime directory (0755), not the 0700 state directory Prometheus cannot enter.
    assert os.path.dirname(token) == "/run/" + service["RuntimeDirectory"]
    assert int(service["RuntimeDirectoryMode"], 8) & 0o005 == 0o005
    # zerod can give the file only to a group its (dynamic) user is in.
    assert args["--viewer-group"] in service["SupplementaryGroups"].split()
    with open(os.path.join(DEPLOY, "zerod.toml"), "rb") as f:
        http_listen = tomllib.load(f)["http-listen"]
    (target,) = job["static_configs"][0]["targets"]
    assert target == http_listen == "127.0.0.1:9464"


def pod_containers(pod):
    return pod["spec"].get("initContainers", []) + pod["spec"]["containers"]


def argv(container):
    return container.get("command", []) + container.get("args", [])


def secret_mount_paths(pod):
    secrets = {v["name"] for v in pod["spec"]["volumes"] if "secret" in v}
    return {m["mountPath"] for c in pod_containers(pod) for m in c.get("volumeMounts", [])
            if m["name"] in secrets}


def mount_of(container, path):
    """The volume mount `path` lies under (the longest), or None."""
    under = [m for m in container.get("volumeMounts", [])
             if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    return max(under, key=lambda m: len(m["mountPath"]), default=None)


def test_the_daemonset_reads_the_viewer_token_its_init_container_copies_from_the_secret(daemon):
    pod, container, args = daemon
    token = args["--viewer-token-file"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    writers = [c for c in pod["spec"].get("initContainers", []) if argv(c) and argv(c)[-1] == token]
    assert writers, f"no initContainer writes {token}"
    (init,) = writers
    # install -m 0600: a file of its own (zerod refuses links, others' files, and modes it cannot
    # fchmod), replacing whatever was there.
    assert argv(init)[:3] == ["install", "-m", "0600"]
    source = argv(init)[-2]
    source_mount = mount_of(init, source)
    assert "secret" in volumes[source_mount["name"]], f"{source} is not from a Secret"
    # The copy is on a volume both see at the same path, and which is no Secret.
    zerod_mount, init_mount = mount_of(container, token), mount_of(init, token)
    assert zerod_mount and init_mount, f"{token} is not on a volume of both containers"
    assert zerod_mount["name"] == init_mount["name"]
    assert zerod_mount["mountPath"] == init_mount["mountPath"]
    assert "secret" not in volumes[zerod_mount["name"]]
    assert not init_mount.get("readOnly")
    # The same user writes and reads it (zerod refuses a token file of another uid).
    run_as = [c.get("securityContext", {}).get("runAsUser") for c in (init, container)]
    assert run_as[0] == run_as[1], run_as


def test_no_container_points_the_viewer_token_file_at_a_secret_mount(daemon):
    pod, _, _ = daemon
    secret_mounts = secret_mount_paths(pod)
    assert secret_mounts
    for container in pod_containers(pod):
        words = argv(container)
        paths = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--viewer-token-file"]
        paths += [w.split("=", 1)[1] for w in words if w.startswith("--viewer-token-file=")]
        for path in paths:
            for mount in secret_mounts:
                assert not (path == mount or path.startswith(mount.rstrip("/") + "/")), (
                    f"{container['name']}: --viewer-token-file {path} is in the Secret mount "
                    f"{mount} (a link zerod refuses)")


def test_the_socket_directory_is_the_hosts_so_trainer_pods_share_it(daemon):
    pod, container, args = daemon
    socket_dir = os.path.dirname(args["--socket"])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert socket_dir in mounts, f"{socket_dir} is not mounted"
    assert volumes[mounts[socket_dir]]["hostPath"]["path"] == socket_dir
    # The state survives the pod too.
    state = volumes[mounts[args["--data-dir"]]]
    assert state["hostPath"]["path"] == args["--data-dir"]


def test_the_pod_has_resources_and_time_to_drain(daemon):
    pod, container, args = daemon
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), kind
    drain = int(args["--drain-timeout"].rstrip("s"))
    # The drain bound plus 5s for the state's last commits (server/service/drain_bound.h).
    assert pod["spec"]["terminationGracePeriodSeconds"] > drain + 5


def unit_file(name):
    """A systemd unit file of deploy/ as {section: {key: [its values, in order]}}."""
    sections = {}
    current = None
    with open(os.path.join(DEPLOY, name)) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                current = sections.setdefault(line.strip("[]"), {})
                continue
            key, _, value = line.partition("=")
            current.setdefault(key, []).append(value)
    return sections


def unit():
    return {section: {key: values[-1] for key, values in keys.items()}
            for section, keys in unit_file("zerod.service").items()}


def unit_exec_args():
    argv = shlex.split(unit()["Service"]["ExecStart"])
    return argv[0], flag_values(argv[1:])


def test_the_units_directories_are_the_ones_its_command_line_uses():
    service = unit()["Service"]
    _, args = unit_exec_args()
    assert args["--data-dir"] == "/var/lib/" + service["StateDirectory"]
    assert os.path.dirname(args["--socket"]) == "/run/" + service["RuntimeDirectory"]
    assert os.path.dirname(args["--config"]) == "/etc/" + service["ConfigurationDirectory"]


def test_every_argument_of_the_units_command_line_is_a_zerod_flag():
    _, args = unit_exec_args()
    unknown = set(args) - zerod_flags()
    assert not unknown, f"not zerod flags: {unknown}"


def test_the_unit_is_a_notify_service_with_a_watchdog_hardened_and_time_to_drain():
    service = unit()["Service"]
    assert service["Type"] == "notify"
    assert service["WatchdogSec"]
    assert service["ExecReload"].endswith("kill -HUP $MAINPID")
    for option in ("DynamicUser", "NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert service[option] == "yes", option
    assert service["ProtectSystem"] == "strict"
    with open(os.path.join(DEPLOY, "zerod.toml"), "rb") as f:
        drain = int(tomllib.load(f)["drain-timeout"].rstrip("s"))
    assert int(service["TimeoutStopSec"].rstrip("s")) > drain + 5


def test_every_key_of_the_example_config_is_a_zerod_flag():
    with open(os.path.join(DEPLOY, "zerod.toml"), "rb") as f:
        config = tomllib.load(f)
    flags = zerod_flags()
    unknown = [key for key in config if "--" + key not in flags]
    assert not unknown, f"keys that are no flags: {unknown}"
    assert all(not isinstance(v, dict) for v in config.values()), "zerod has no [sections]"


def test_the_container_runs_the_binary_the_manifest_and_unit_expect():
    with open(os.path.join(DEPLOY, "Containerfile")) as f:
        text = f.read()
    assert re.search(r"^FROM debian:12 AS build$", text, re.MULTILINE)
    assert re.search(r"^FROM debian:12-slim$", text, re.MULTILINE)
    assert "scripts/setup.sh" in text and "scripts/build.sh zerod" in text
    for source in re.findall(r"^COPY (?!--from)(\S+) /src", text, re.MULTILINE):
        assert os.path.exists(os.path.join(ROOT, source)), source
    entrypoint = re.search(r'^ENTRYPOINT \["([^"]+)"\]', text, re.MULTILINE).group(1)
    binary, _ = unit_exec_args()
    assert entrypoint == binary == "/usr/local/bin/zerod"
    cmd = flag_values(re.findall(r'"([^"]+)"', re.search(r"^CMD (.*)$", text, re.MULTILINE).group(1)))
    _, unit_args = unit_exec_args()
    for flag in ("--config", "--socket", "--data-dir"):
        assert cmd[flag] == unit_args[flag], flag


def systemd_verify(dropins=()):
    """`systemd-analyze verify` of the unit with the drop-ins named (files of deploy/, put in
    zerod.service.d/), ExecStart pointed at the built zerod (verify checks that it exists): its
    exit code and the lines about the unit."""
    built = os.path.abspath(ZEROD)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "zerod.service")
        files = [("zerod.service", path)]
        if dropins:
            os.mkdir(path + ".d")
            files += [(name, os.path.join(path + ".d", name)) for name in dropins]
        for name, target in files:
            with open(os.path.join(DEPLOY, name)) as f:
                text = f.read().replace("/usr/local/bin/zerod", built)
            with open(target, "w") as f:
                f.write(text)
        r = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True)
        complaints = [line for line in (r.stdout + r.stderr).splitlines() if "zerod.service" in line]
        return r.returncode, complaints, r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_finds_nothing_in_the_unit():
    code, complaints, out = systemd_verify()
    assert code == 0 and not complaints, out


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_static_scrape_config(scrape_jobs):
    # promtool checks that credentials_file exists: point it at a token here. Debian's Prometheus is
    # built without Kubernetes discovery, so the kubernetes_sd_configs job cannot be checked here.
    with tempfile.TemporaryDirectory() as tmp:
        token = os.path.join(tmp, "viewer.token")
        with open(token, "w") as f:
            f.write("0" * 64 + "\n")
        jobs = []
        for job in scrape_jobs.values():
            if "kubernetes_sd_configs" in job:
                continue
            job = dict(job, authorization=dict(job["authorization"], credentials_file=token))
            jobs.append(job)
        assert jobs
        path = os.path.join(tmp, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump({"scrape_configs": jobs}, f)
        r = subprocess.run(["promtool", "check", "config", path], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
