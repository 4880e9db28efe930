#!/usr/bin/env bash
# Generates a throw-away certificate authority and certificates signed by it, for the tests and services that
# speak TLS on loopback (Kafka's SASL_SSL listener, etcd with client certificates, `walctl serve` over HTTPS).
#
# usage: scripts/certs.sh DIR
#   DIR/ca.pem, DIR/ca.key            the authority (self-signed, 2 days)
#   DIR/server.pem, DIR/server.key    a server certificate for localhost and 127.0.0.1
#   DIR/client.pem, DIR/client.key    a client certificate (CN walctl), for servers that ask for one
#   DIR/other-ca.pem                  an authority that signed none of them (for "untrusted certificate" tests)
# Keys are unencrypted PKCS#8 PEM. An existing complete set in DIR is kept (so a restarted service keeps them).
set -euo pipefail

dir=${1:?usage: scripts/certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
if [[ -s ca.pem && -s server.pem && -s server.key && -s client.pem && -s client.key && -s other-ca.pem ]]; then
  exit 0
fi

quiet() { "$@" >/dev/null 2>&1 || { echo "[certs] error: $* failed" >&2; "$@" >&2; exit 1; }; }

authority() { # name subject
  quiet openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$2" \
    -keyout "$1.key" -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}

leaf() { # name subject extensions
  quiet openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$1.key" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  quiet openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile "$1.ext" -out "$1.pem"
  rm -f "$1.csr" "$1.ext"
}

authority ca "remote-wal test authority"
authority other-ca "an authority nobody trusts"
rm -f other-ca.key
leaf server localhost "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:localhost,IP:127.0.0.1"
leaf client walctl "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
chmod 600 ./*.key
