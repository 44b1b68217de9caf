#!/bin/sh
# Run once by the compose file's `keys` service: CURVE key pairs for the broker, the gateways
# and the workers, in the `curve-keys` volume (mounted at /etc/tritium/keys):
#
#   broker/broker.key_secret     the broker's secret key   (broker: --curve-secret-key)
#   broker/broker.key            its public key            (gateways, workers: --curve-server-key)
#   gateway/gateway.key_secret   the gateways' pair        (gateways: --curve-secret-key)
#   worker/worker.key_secret     the workers' pair         (workers: --curve-secret-key)
#   authorized/*.key             the public keys the broker lets in (--curve-authorized-keys)
#
# A pair already there is kept, so `docker compose up` again changes no key. To make new ones:
# `docker compose down --volumes`. KEYS_DIR names another folder (the test suite's).
set -eu
cd "${KEYS_DIR:-/etc/tritium/keys}"
mkdir -p authorized
for name in broker gateway worker; do
  if [ ! -f "$name/$name.key_secret" ]; then
    tritium keys generate "$name" --name "$name"
  fi
done
cp gateway/gateway.key worker/worker.key authorized/
