#!/usr/bin/env bash
# Runs an agent on this machine with embedded defaults: generated certificates and
# token, an export root in a temporary directory, HTTPS on 127.0.0.1:8443. Creates a
# demo volume through the API, prints how to talk to the agent, and stops on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

port="${NFSPROV_PORT:-8443}"
work="$(mktemp -d -t nfsprov-quickstart.XXXXXX)"
agent_pid=""
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

command -v curl >/dev/null || { echo "quickstart: curl is needed (apt-get install curl)" >&2; exit 1; }
cargo build --release --locked -p nfsprov-agent
bin=target/release/nfsprov-agent
mkdir -p "$work/export"
"$bin" init --dir "$work/etc" --export-root "$work/export" --hostname localhost --ip 127.0.0.1 \
  --listen "127.0.0.1:$port" --name local >"$work/secret.yaml" 2>"$work/init.log"

"$bin" run --config "$work/etc/agent.toml" &
agent_pid=$!
ca="$work/etc/ca.pem"
until curl -fsS --cacert "$ca" "https://localhost:$port/healthz" >/dev/null 2>&1; do
  kill -0 "$agent_pid" 2>/dev/null || { echo "quickstart: the agent exited" >&2; exit 1; }
  sleep 0.2
done

auth="Authorization: Bearer $(cat "$work/etc/token")"
echo
echo "== health:  curl --cacert $ca https://localhost:$port/healthz"
curl -sS --cacert "$ca" "https://localhost:$port/healthz"; echo
echo "== create a demo volume"
curl -sS --cacert "$ca" -H "$auth" -H 'Content-Type: application/json' -X PUT \
  -d '{"mode":"0775","capacity_bytes":1073741824,"owner":{"pvc_namespace":"default","pvc_name":"demo"}}' \
  "https://localhost:$port/v1/volumes/default-demo"; echo
echo "== the directory on disk"
ls -ld "$work/export/default-demo"
cat <<INFO

The agent serves https://localhost:$port with export root $work/export.
  token:  export TOKEN=\$(cat $work/etc/token)
  list:   curl --cacert $ca -H "Authorization: Bearer \$TOKEN" https://localhost:$port/v1/volumes
  info:   curl --cacert $ca -H "Authorization: Bearer \$TOKEN" https://localhost:$port/v1/info
The controller's Secret for this agent is in $work/secret.yaml.
Press Ctrl-C to stop (everything under $work is removed).
INFO
wait "$agent_pid"
