"""deploy/'s cluster-on-etcd variant checked by parsing it (docs/operators.md, "zerod on etcd"):
the Kubernetes manifests (kubernetes/zerod-etcd.yaml: cert-manager's CAs and certificates, etcd's
StatefulSet, the Job that turns etcd's authentication on, zerod's DaemonSet), the systemd drop-in
and config (zerod-etcd.conf, zerod-etcd.toml) and etcd's settings (etcd/etcd.env), against each
other, zerod's flags and etcd's. That every piece is secured is the point: TLS with client
certificates everywhere, keys mounted for their pod's user alone, a CA per kind of certificate.

ZEROD_BIN names the built zerod (ctest sets it)."""

import os
import re
import shlex
import shutil
import subprocess
import tomllib

import pytest
import yaml

from test_deploy import DEPLOY, flag_values, port_of, systemd_verify, unit_file, zerod_flags


@pytest.fixture(scope="module")
def docs():
    with open(os.path.join(DEPLOY, "kubernetes", "zerod-etcd.yaml")) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def named(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.fixture(scope="module")
def zerod_pod(docs):
    pod = named(docs, "DaemonSet")["zerod"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    return pod, container, flag_values(container["args"])


@pytest.fixture(scope="module")
def etcd_pod(docs):
    pod = named(docs, "StatefulSet")["zerod-etcd"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    return pod, container, flag_values(container["args"])


def secret_volumes(pod):
    return {v["name"]: v["secret"] for v in pod["spec"]["volumes"] if "secret" in v}


def secret_of(pod, container, path):
    """The Secret volume `path` is mounted from, and the file's name in it."""
    mounts = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert len(mounts) == 1, f"{path} is on no single mount"
    secret = secret_volumes(pod).get(mounts[0]["name"])
    assert secret is not None, f"{path} is not from a Secret"
    return secret, path[len(mounts[0]["mountPath"]) + 1:]


def issuer_ca(docs, certificate):
    """The CA Certificate whose Secret the issuer of `certificate` signs with."""
    issuer = named(docs, "Issuer")[certificate["spec"]["issuerRef"]["name"]]
    return issuer["spec"]["ca"]["secretName"]


def certificate_of_secret(docs, secret_name):
    (cert,) = [c for c in named(docs, "Certificate").values()
               if c["spec"]["secretName"] == secret_name]
    return cert


def test_every_daemonset_argument_is_a_zerod_flag_and_nothing_opens_the_cluster(zerod_pod):
    _, _, args = zerod_pod
    unknown = set(args) - zerod_flags()
    assert not unknown, f"not zerod flags: {unknown}"
    for flag in ("--no-auth", "--allow-plaintext-tcp", "--open-inspection",
                 "--allow-insecure-etcd"):
        assert flag not in args, flag
    assert args["--store"].startswith("etcd://")


def test_zerod_speaks_tls_to_etcd_as_the_user_the_auth_job_makes(docs, zerod_pod):
    pod, container, args = zerod_pod
    secret, _ = secret_of(pod, container, args["--etcd-cert"])
    for flag in ("--etcd-ca", "--etcd-key"):
        assert secret_of(pod, container, args[flag])[0] == secret, flag
    user = certificate_of_secret(docs, secret["secretName"])
    # The certificate's CN is etcd's user: the one the Job gives zerod's role.
    job = named(docs, "Job")["zerod-etcd-auth"]["spec"]["template"]["spec"]["containers"][0]
    script, prefix, role_user = job["command"][1:]
    assert user["spec"]["commonName"] == role_user
    url = re.fullmatch(r"etcd://([^,/]+):(\d+)(/.*/)", args["--store"])
    assert url, args["--store"]
    assert url.group(3) == prefix
    # The store's host is etcd's client Service, and its certificate names it.
    client = named(docs, "Service")[url.group(1)]
    assert [p["port"] for p in client["spec"]["ports"]] == [int(url.group(2))]
    member = certificate_of_secret(docs, "zerod-etcd-member")
    assert url.group(1) in member["spec"]["dnsNames"]
    env = {e["name"]: e.get("value") for e in job["env"]}
    assert env["ETCDCTL_ENDPOINTS"] == f"https://{url.group(1)}:{url.group(2)}"
    # The script the Job runs is where the image puts it.
    with open(os.path.join(DEPLOY, "Containerfile")) as f:
        assert f"COPY deploy/etcd/auth.sh {script}" in f.read()


def test_the_members_certificate_is_the_cluster_cas_and_the_clients_ca_is_another(docs, zerod_pod):
    pod, container, args = zerod_pod
    member_secret, _ = secret_of(pod, container, args["--tls-cert"])
    assert secret_of(pod, container, args["--tls-key"])[0] == member_secret
    ca_secret, ca_file = secret_of(pod, container, args["--cluster-ca"])
    assert ca_secret == member_secret and ca_file == "ca.crt"
    member = certificate_of_secret(docs, member_secret["secretName"])
    assert {"server auth", "client auth"} <= set(member["spec"]["usages"])
    cluster_ca = issuer_ca(docs, member)
    clients_secret, clients_file = secret_of(pod, container, args["--tls-client-ca"])
    # Only the clients' CA certificate is mounted, never its key; and it is not the members' CA.
    assert clients_secret["items"] == [{"key": "ca.crt", "path": clients_file}]
    assert clients_secret["secretName"] != cluster_ca
    issuers = {c["metadata"]["name"]: issuer_ca(docs, c) for c in named(docs, "Certificate").values()
               if "ca" in named(docs, "Issuer").get(c["spec"]["issuerRef"]["name"], {}).get("spec", {})}
    # The cluster's CA signs the members' certificate and nothing else.
    assert [name for name, ca in issuers.items() if ca == cluster_ca] == [member["metadata"]["name"]]


def test_every_key_is_mounted_for_its_pods_user_alone(docs):
    for kind in ("DaemonSet", "StatefulSet", "Job"):
        for name, workload in named(docs, kind).items():
            pod = workload["spec"]["template"]
            for volume, secret in secret_volumes(pod).items():
                if secret.get("items") == [{"key": "ca.crt", "path": "ca.crt"}]:
                    continue  # a CA certificate alone: public
                assert secret.get("defaultMode") == 0o400, f"{kind} {name}: {volume}"


def test_no_pod_mounts_a_cas_key(docs):
    cas = {c["spec"]["secretName"] for c in named(docs, "Certificate").values()
           if c["spec"].get("isCA")}
    for kind in ("DaemonSet", "StatefulSet", "Job"):
        for name, workload in named(docs, kind).items():
            for volume, secret in secret_volumes(workload["spec"]["template"]).items():
                if secret["secretName"] in cas:
                    assert secret.get("items") == [{"key": "ca.crt", "path": "ca.crt"}], (
                        f"{kind} {name} mounts the key of the CA {secret['secretName']}")


def test_every_secret_a_pod_mounts_is_made_here_or_named_in_the_instructions(docs):
    made = {c["spec"]["secretName"] for c in named(docs, "Certificate").values()}
    with open(os.path.join(DEPLOY, "kubernetes", "zerod-etcd.yaml")) as f:
        instructions = f.read().split("apiVersion:", 1)[0]
    for kind in ("DaemonSet", "StatefulSet", "Job"):
        for workload in named(docs, kind).values():
            for secret in secret_volumes(workload["spec"]["template"]).values():
                name = secret["secretName"]
                assert name in made or f"create secret generic {name} " in instructions, name


def test_etcd_takes_only_clients_and_peers_with_its_cas_certificates(docs, etcd_pod):
    pod, container, args = etcd_pod
    for flag in ("--client-cert-auth", "--peer-client-cert-auth"):
        assert args.get(flag) is True, flag
    for flag in ("--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls",
                 "--initial-advertise-peer-urls"):
        assert args[flag].startswith("https://"), flag
    for flag in ("--cert-file", "--key-file", "--trusted-ca-file", "--peer-cert-file",
                 "--peer-key-file", "--peer-trusted-ca-file"):
        secret, _ = secret_of(pod, container, args[flag])
        assert secret["secretName"] == "zerod-etcd-member", flag
    member = certificate_of_secret(docs, "zerod-etcd-member")
    assert {"server auth", "client auth"} <= set(member["spec"]["usages"])
    # Every peer named in the initial cluster is a pod of the StatefulSet its certificate names.
    statefulset = named(docs, "StatefulSet")["zerod-etcd"]
    peers = dict(p.split("=", 1) for p in args["--initial-cluster"].split(","))
    replicas = statefulset["spec"]["replicas"]
    assert sorted(peers) == [f"zerod-etcd-{i}" for i in range(replicas)]
    service = statefulset["spec"]["serviceName"]
    for name, url in peers.items():
        assert url == f"https://{name}.{service}:2380"
        assert f"*.{service}" in member["spec"]["dnsNames"]
    # Probes ask the metrics port, which holds no keys and needs no certificate.
    metrics = port_of(args["--listen-metrics-urls"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == metrics


@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd not installed")
def test_every_etcd_argument_and_setting_is_an_etcd_flag(etcd_pod):
    out = subprocess.run(["etcd", "--help"], capture_output=True, text=True).stdout
    flags = set(re.findall(r"^\s+(--[a-z0-9-]+)", out, re.MULTILINE))
    _, _, args = etcd_pod
    assert not set(args) - flags, set(args) - flags
    settings = etcd_env()
    as_flags = {"--" + key[len("ETCD_"):].lower().replace("_", "-") for key in settings}
    assert not as_flags - flags, as_flags - flags


def etcd_env():
    settings = {}
    with open(os.path.join(DEPLOY, "etcd", "etcd.env")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                settings[key] = value
    return settings


def test_the_etcd_settings_take_only_clients_and_peers_with_certificates():
    settings = etcd_env()
    assert settings["ETCD_CLIENT_CERT_AUTH"] == settings["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
    for key in ("ETCD_LISTEN_CLIENT_URLS", "ETCD_ADVERTISE_CLIENT_URLS", "ETCD_LISTEN_PEER_URLS",
                "ETCD_INITIAL_ADVERTISE_PEER_URLS"):
        assert all(u.startswith("https://") for u in settings[key].split(",")), key
    assert all(u.split("=", 1)[1].startswith("https://")
               for u in settings["ETCD_INITIAL_CLUSTER"].split(","))
    # Plain HTTP only for health and metrics, on loopback.
    assert settings["ETCD_LISTEN_METRICS_URLS"].startswith("http://127.")


def test_the_dropin_hands_each_private_key_to_zerod_as_a_credential():
    service = unit_file("zerod-etcd.conf")["Service"]
    # ExecStart= is reset, then set once: the unit's own command with the two key flags added, so
    # that the two do not drift apart.
    assert service["ExecStart"][0] == ""
    (command,) = service["ExecStart"][1:]
    argv = shlex.split(command)
    (base_command,) = unit_file("zerod.service")["Service"]["ExecStart"]
    base = shlex.split(base_command)
    assert argv[:len(base)] == base, (argv, base)
    assert set(flag_values(argv[len(base):])) == {"--etcd-key", "--tls-key"}, argv[len(base):]
    args = flag_values(argv[1:])
    assert not set(args) - zerod_flags(), set(args) - zerod_flags()
    credentials = dict(c.split(":", 1) for c in service["LoadCredential"])
    for flag in ("--etcd-key", "--tls-key"):
        directory, name = args[flag].split("/", 1)
        assert directory == "%d" and name in credentials, flag
        assert credentials[name].startswith("/etc/zerod/"), flag
    with open(os.path.join(DEPLOY, "zerod-etcd.toml"), "rb") as f:
        config = tomllib.load(f)
    # The files the config names sit beside the keys the drop-in loads.
    assert os.path.dirname(config["etcd-cert"]) == os.path.dirname(credentials["etcd.key"])
    assert os.path.dirname(config["tls-cert"]) == os.path.dirname(credentials["member.key"])


def test_every_key_of_the_etcd_config_is_a_zerod_flag_and_it_is_secured():
    with open(os.path.join(DEPLOY, "zerod-etcd.toml"), "rb") as f:
        config = tomllib.load(f)
    flags = zerod_flags()
    unknown = [key for key in config if "--" + key not in flags]
    assert not unknown, f"keys that are no flags: {unknown}"
    assert config["store"].startswith("etcd://")
    for key in ("etcd-ca", "etcd-cert", "tls-cert", "cluster-ca"):
        assert config[key].startswith("/etc/zerod/"), key
    for key in ("allow-insecure-etcd", "no-auth", "allow-plaintext-tcp", "etcd-key", "tls-key"):
        assert key not in config, key


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_finds_nothing_in_the_unit_with_the_dropin():
    code, complaints, out = systemd_verify(["zerod-etcd.conf"])
    assert code == 0 and not complaints, out


def test_the_etcd_scripts_are_sound_shell():
    for script in ("certs.sh", "auth.sh"):
        path = os.path.join(DEPLOY, "etcd", script)
        assert os.access(path, os.X_OK), script
        subprocess.run(["/bin/sh", "-n", path], check=True)
        if shutil.which("shellcheck"):
            r = subprocess.run(["shellcheck", path], capture_output=True, text=True)
            assert r.returncode == 0, r.stdout
