#!/bin/sh
# etcd's authentication for zerod (docs/operators.md, "zerod on etcd"), with etcdctl (Debian's
# etcd-client) as etcd's root user. Idempotent: run it again after adding a cluster prefix.
#
#   ETCDCTL_ENDPOINTS=https://e1:2379,... ETCDCTL_CACERT=etcd-ca.pem \
#   ETCDCTL_CERT=root.pem ETCDCTL_KEY=root.key deploy/etcd/auth.sh [PREFIX [USER]]
#
# Makes the users root (the root role) and USER (default zerod; no password: it authenticates by
# its certificate's CN, etcd's --client-cert-auth), a role USER with read and write on what zerod
# keeps on PREFIX (default /zerod/): the prefix, its claim (/zerod.claim) and its commit markers
# (/zerod.commit/), and turns authentication on. From then on nothing is read or written without a
# user: an anonymous client (no certificate) gets nothing, another user nothing under PREFIX.
set -eu
prefix=${1:-/zerod/}
user=${2:-zerod}
case "$prefix" in
  /*/) ;;
  *) echo "auth.sh: PREFIX must start and end with /, as in --store etcd://.../zerod/" >&2; exit 2 ;;
esac
base=${prefix%/}
# A step already done says so; anything else stops the script.
step() {
  out=$("$@" 2>&1) && return 0
  case "$out" in
    *"already exists"* | *"already granted"* | *"already enabled"*) return 0 ;;
  esac
  echo "auth.sh: $*: $out" >&2
  exit 1
}
step etcdctl user add root --no-password
step etcdctl user grant-role root root
step etcdctl role add "$user"
step etcdctl role grant-permission "$user" readwrite --prefix=true "$prefix"
step etcdctl role grant-permission "$user" readwrite "$base.claim"
step etcdctl role grant-permission "$user" readwrite --prefix=true "$base.commit/"
step etcdctl user add "$user" --no-password
step etcdctl user grant-role "$user" "$user"
step etcdctl auth enable
echo "auth.sh: etcd user $user may read and write $prefix, $base.claim and $base.commit/; authentication is on"
