#!/usr/bin/env bash
# Installs every Debian package zerod builds, tests or runs with. Idempotent: packages already
# installed are skipped, and `apt-get update` runs only when something is missing and the package
# lists are absent or older than a day.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config clang-format
  # the clang build (-Wthread-safety) and its ThreadSanitizer runtime, libFuzzer (scripts/fuzz.sh)
  # and symbolizer
  clang libclang-rt-14-dev llvm
  # control plane: gRPC 1.51 + protobuf 3.21 (with codegen), abseil
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  # job tokens (SHA-256, constant-time compare) and the auth tests' certificates
  libssl-dev openssl
  # logging, flags, JSON, HTTP, checksums
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libcpp-httplib-dev libxxhash-dev
  # state: SQLite (embedded default) and etcd (clusters)
  libsqlite3-dev sqlite3 etcd-server
  # etcdctl: etcd's users and roles for zerod (deploy/etcd/auth.sh), and the tests that run it
  etcd-client
  # collectives on host memory
  libgloo-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev googletest libbenchmark-dev python3
  # the torch reference for the Adam vectors (scripts/make_adam_vectors.py, /usr/bin/python3)
  python3-torch
  # the PyTorch front end (python/zerod): its tests, the torchvision example
  python3-pytest python3-torchvision python3-numpy python3-pyflakes
  # pip install --no-build-isolation . (pyproject.toml, setup.py) in a venv, and its test
  python3-venv python3-pip python3-setuptools python3-wheel
  # zerod's HTTP listener (/metrics) and its test against a real Prometheus (prometheus, promtool);
  # curl asks it as another user (runuser) in tests/integration/metrics_test
  libmicrohttpd-dev prometheus curl
  # zerod as a systemd service (sd_notify, watchdog), and its manifests' test (python3-yaml)
  libsystemd-dev python3-yaml
  # the status page's test drives a real headless browser (tests/integration/status_page_test)
  chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# etcd's .proto files (for server/state/etcd_kv_store) come from golang-etcd-server-dev, extracted
# into .deps/etcd/ (git-ignored) rather than installed: installing it pulls in 137 Go packages.
# The build generates C++ from them (proto/etcd/CMakeLists.txt).
fetch_etcd_protos() {
  local root
  root="$(cd "$(dirname "$0")/.." && pwd)/.deps/etcd"
  [ -f "$root/usr/share/gocode/src/go.etcd.io/etcd/etcdserver/etcdserverpb/rpc.proto" ] && return 0
  local tmp
  tmp=$(mktemp -d)
  if ! (cd "$tmp" && apt-get download -qq golang-etcd-server-dev >/dev/null 2>&1); then
    $SUDO apt-get update -qq
    (cd "$tmp" && apt-get download -qq golang-etcd-server-dev) || {
      echo "setup: could not download golang-etcd-server-dev (etcd's .proto files)" >&2; exit 1; }
  fi
  mkdir -p "$root"
  dpkg-deb -x "$tmp"/golang-etcd-server-dev_*.deb "$root"
  rm -rf "$tmp"
  echo "setup: etcd's .proto files in $root"
}

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

if [ ${#missing[@]} -eq 0 ]; then
  fetch_etcd_protos
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi

lists_fresh() {
  local newest
  newest=$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -n 1)
  [ -n "$newest" ]
}

# Refresh the lists only when a missing package is not known to apt or the lists are stale.
need_update=0
lists_fresh || need_update=1
for p in "${missing[@]}"; do
  apt-cache show "$p" >/dev/null 2>&1 || need_update=1
done
if [ $need_update -eq 1 ]; then
  echo "setup: apt-get update"
  $SUDO apt-get update -qq
fi

for p in "${missing[@]}"; do
  if ! apt-cache show "$p" >/dev/null 2>&1; then
    echo "setup: Debian package '$p' is not available from the configured apt sources" >&2
    exit 1
  fi
done

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/zerod-setup-apt.log 2>&1; then
  tail -n 20 /tmp/zerod-setup-apt.log >&2
  echo "setup: apt-get install failed for: ${missing[*]} (full log: /tmp/zerod-setup-apt.log)" >&2
  exit 1
fi
# etcd-server's package starts a system etcd; zerod's tests start their own on loopback ports.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
  $SUDO systemctl stop etcd || true
fi
fetch_etcd_protos
echo "setup: done"
