#!/bin/sh
# Certificates for zerod on etcd, made with the openssl CLI (docs/operators.md, "zerod on etcd"):
#
#   deploy/etcd/certs.sh ca    DIR NAME              a CA: DIR/NAME.pem (0644), DIR/NAME.key (0600)
#   deploy/etcd/certs.sh issue DIR CA NAME CN [SANS] DIR/NAME.pem (0644) and DIR/NAME.key (0600),
#                                                    signed by the CA DIR/CA.pem
#
# SANS: comma-separated subjectAltName entries (DNS:node1,IP:10.0.0.1): the names a server is
# reached by. CN: the identity a client presents (etcd's --client-cert-auth takes it as the user:
# root, zerod). Every certificate issued may serve TLS and authenticate a TLS client, as etcd's
# members (client and peer ports) and zerod's members (listener, calls to the leader) both do.
# ECDSA P-256; valid DAYS days (default 825). Two CAs, never one: etcd's (its members, root, zerod)
# and the zerod cluster's (its members only: any holder of a certificate it signed is a member).
set -eu
days=${DAYS:-825}
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
usage() {
  echo "usage: $0 ca DIR NAME | $0 issue DIR CA NAME CN [SANS]" >&2
  exit 2
}
[ $# -ge 3 ] || usage
umask 077
case "$1" in
  ca)
    [ $# -eq 3 ] || usage
    dir=$2 name=$3
    mkdir -p "$dir"
    # shellcheck disable=SC2086
    openssl req -x509 $ec -keyout "$dir/$name.key" -out "$dir/$name.pem" -days "$days" \
      -subj "/CN=$name" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    ;;
  issue)
    [ $# -eq 5 ] || [ $# -eq 6 ] || usage
    dir=$2 ca=$3 name=$4 cn=$5 sans=${6:-}
    ext="$dir/$name.ext"
    {
      echo "basicConstraints=CA:FALSE"
      echo "keyUsage=critical,digitalSignature"
      echo "extendedKeyUsage=serverAuth,clientAuth"
      [ -z "$sans" ] || echo "subjectAltName=$sans"
    } >"$ext"
    # shellcheck disable=SC2086
    openssl req $ec -keyout "$dir/$name.key" -out "$dir/$name.csr" -subj "/CN=$cn" 2>/dev/null
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/$ca.pem" -CAkey "$dir/$ca.key" \
      -CAcreateserial -days "$days" -extfile "$ext" -out "$dir/$name.pem" 2>/dev/null
    rm -f "$dir/$name.csr" "$ext"
    ;;
  *) usage ;;
esac
chmod 0644 "$dir"/*.pem
