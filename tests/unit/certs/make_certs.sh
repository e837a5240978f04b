#!/usr/bin/env bash
# make_certs.sh - regenerates the TLS test certificates in this directory for
# tests/unit/test_rpc_server.c. Test-only keys: never use them anywhere else.
#
#   ca.pem                 test CA (its key is thrown away after signing)
#   server.pem/.key        signed by the CA, for DNS:localhost and IP:127.0.0.1
#   client.pem/.key        signed by the CA, for mutual TLS (clientAuth)
#   rogue.pem/.key         self-signed client certificate the CA never signed,
#                          which a mutual-TLS server must refuse
#
# ECDSA P-256 (small, fast handshakes). Validity is fixed, 2000-01-01 to
# 2124-12-31, rather than "now + N days", so the committed files work on a
# machine whose clock is behind the one that made them and never expire
# under the tests; `openssl ca` is used because it can set both dates.
# Needs the openssl CLI; run from anywhere.
set -euo pipefail
cd "$(dirname "$0")"
START=20000101000000Z
END=21241231235959Z
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

touch "$tmp/index.txt"
echo 1000 > "$tmp/serial"
cat > "$tmp/ca.cnf" <<CNF
[ca]
default_ca = test
[test]
database = $tmp/index.txt
new_certs_dir = $tmp
serial = $tmp/serial
default_md = sha256
policy = any
unique_subject = no
[any]
commonName = supplied
CNF

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# sign <out.pem> <csr> <extensions> <signer args...>
sign() {
  local out=$1 csr=$2 ext=$3
  shift 3
  printf '%s\n' "$ext" > "$tmp/ext"
  openssl ca -batch -notext -config "$tmp/ca.cnf" -startdate $START -enddate $END \
    -extfile "$tmp/ext" -in "$csr" -out "$out" "$@" 2>/dev/null
}

# the CA, self-signed
key "$tmp/ca.key"
openssl req -new -key "$tmp/ca.key" -subj "/CN=specd test CA" -out "$tmp/ca.csr"
sign ca.pem "$tmp/ca.csr" "basicConstraints=critical,CA:TRUE
keyUsage=critical,keyCertSign,cRLSign" -selfsign -keyfile "$tmp/ca.key"

# leaf <name> <subject CN> <extensions>
leaf() {
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$tmp/$1.csr"
  sign "$1.pem" "$tmp/$1.csr" "$3" -cert ca.pem -keyfile "$tmp/ca.key"
}
leaf server localhost "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1"
leaf client "specd test client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"

# a client certificate from nobody the server trusts (self-signed)
key rogue.key
openssl req -new -key rogue.key -subj "/CN=rogue client" -out "$tmp/rogue.csr"
sign rogue.pem "$tmp/rogue.csr" "extendedKeyUsage=clientAuth" -selfsign -keyfile rogue.key

chmod 644 ./*.pem ./*.key
echo "wrote ca.pem server.{pem,key} client.{pem,key} rogue.{pem,key} in $(pwd)"
