#!/usr/bin/env bash
# The whole system on this machine with embedded defaults: an NFS server (nfs-ganesha)
# exporting a temporary root on 127.0.0.1, an agent with generated certificates, the
# controller, and the Kubernetes API simulator (or the cluster of $KUBECONFIG when set).
# Provisions a demo claim, prints its PV, the NFS URL and how to write to it (nfs-cp over
# NFSv3, for which rpcbind must run: started here when it does not).
# Ctrl-C stops everything. Needs root (the NFS server and the agent's chown).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v ganesha.nfsd >/dev/null || missing+=(nfs-ganesha)
ls /usr/lib/*/ganesha/libfsalvfs.so >/dev/null 2>&1 || missing+=(nfs-ganesha-vfs)
command -v nfs-cp >/dev/null || missing+=(libnfs-utils)
# nfs-cp writes a file of more than about 4 KB only over NFSv3, which ganesha serves only
# when it can register it with rpcbind.
command -v rpcbind >/dev/null || [ -x /usr/sbin/rpcbind ] || [ -x /sbin/rpcbind ] || missing+=(rpcbind)
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "quickstart: missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"; }
  apt_install "${missing[@]}" || apt_install "${missing[@]}"
fi

if ! (exec 3<>/dev/tcp/127.0.0.1/111) 2>/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "quickstart: rpcbind is not running; start it (rpcbind -w) or run as root" >&2
    exit 1
  fi
  PATH=$PATH:/usr/sbin:/sbin rpcbind -w
fi

cargo build --locked --workspace --bins
NFSPROV_BIN_DIR="$PWD/target/debug" exec target/debug/nfsprov-demo
