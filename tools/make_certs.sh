#!/usr/bin/env bash
# Makes a local certificate authority and the certificates ringlane's daemons
# use for mutual TLS (--tls_ca, --tls_cert, --tls_key), with Debian's openssl:
#
#   DIR/ca.pem                    the CA every daemon trusts (its key: DIR/ca.key)
#   DIR/node.pem, DIR/node.key    a daemon's certificate: server and client use
#                                 (workers serve and call their rendezvous; the
#                                 router calls workers); SAN 127.0.0.1, localhost
#                                 and every extra SAN given
#   DIR/client.pem, DIR/client.key  client use only (tools, tests)
#
#   tools/make_certs.sh DIR [SAN ...]     (a SAN is an IP address or a DNS name)
#
# Idempotent: certificates that still verify against the CA, hold the same
# SANs and stay valid for a day are kept, so running it before every
# `make serve` costs nothing; otherwise all of them are made anew (a new CA
# too, so certificates of an earlier CA stop working together).
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [SAN ...]" >&2
  exit 2
fi
dir=$1
shift
command -v openssl >/dev/null || { echo "make_certs: openssl is not installed (apt-get install openssl)" >&2; exit 1; }

sans="IP:127.0.0.1,DNS:localhost"
for s in "$@"; do
  if [[ $s =~ ^[0-9.]+$ || $s == *:* ]]; then sans+=",IP:$s"; else sans+=",DNS:$s"; fi
done

mkdir -p "$dir"
files=(ca.pem ca.key node.pem node.key client.pem client.key sans.txt)
current() {
  for f in "${files[@]}"; do [ -s "$dir/$f" ] || return 1; done
  [ "$(cat "$dir/sans.txt")" = "$sans" ] || return 1
  openssl verify -CAfile "$dir/ca.pem" "$dir/node.pem" "$dir/client.pem" >/dev/null 2>&1 || return 1
  for c in ca node client; do
    openssl x509 -checkend 86400 -noout -in "$dir/$c.pem" >/dev/null 2>&1 || return 1
  done
}
if current; then
  echo "make_certs: the certificates in $dir are current" >&2
  exit 0
fi

# Made in a scratch directory and moved in at the end, so an interrupted run
# never leaves a CA that does not match its certificates.
tmp=$(mktemp -d "$dir/.make_certs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
umask 077

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
serial() { echo "0x$(openssl rand -hex 16)"; }

newkey "$tmp/ca.key"
openssl req -x509 -new -key "$tmp/ca.key" -sha256 -days 3650 -subj "/CN=ringlane local CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -set_serial "$(serial)" -out "$tmp/ca.pem"

# $1: name, $2: CN, $3: extended key usage, $4: SANs (may be empty)
leaf() {
  newkey "$tmp/$1.key"
  openssl req -new -key "$tmp/$1.key" -subj "/CN=$2" -out "$tmp/$1.csr"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$3"
    [ -z "$4" ] || echo "subjectAltName=$4"
  } >"$tmp/$1.ext"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -sha256 -days 825 \
    -set_serial "$(serial)" -extfile "$tmp/$1.ext" -out "$tmp/$1.pem" 2>/dev/null
}
leaf node "ringlane node" "serverAuth,clientAuth" "$sans"
leaf client "ringlane client" "clientAuth" ""
echo "$sans" >"$tmp/sans.txt"
chmod 644 "$tmp"/*.pem "$tmp/sans.txt"
for f in "${files[@]}"; do mv -f "$tmp/$f" "$dir/$f"; done
echo "make_certs: a new CA and certificates in $dir (SAN $sans)" >&2
