#!/usr/bin/env bash
# make image-test: run the image's sim, control plane, agent and router as
# containers on the host network; send a streaming request through the router;
# check /readyz, /metrics and a clean SIGTERM drain; remove what it started.
# Usage: scripts/image-test.sh [IMAGE]   (default localhost/smg:latest, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/scripts/image/containers.conf}

if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
	echo "image-test: needs podman and runc (Debian: apt-get install -y podman runc)" >&2
	exit 1
fi
image=${1:-localhost/smg:latest}
if ! podman image exists "$image"; then
	bash scripts/image.sh
fi

run_id=smg-it-$$
started=()
cleanup() {
	for c in "${started[@]}"; do podman rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

fail() {
	echo "image-test: FAIL: $*" >&2
	for c in "${started[@]}"; do echo "--- logs of $c" >&2; podman logs --tail 30 "$c" >&2 2>&1 || true; done
	exit 1
}

# Free loopback ports, chosen by the kernel.
ports=($(python3 - <<'PY'
import socket
socks=[socket.socket() for _ in range(5)]
for s in socks: s.bind(("127.0.0.1",0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
))
sim=${ports[0]} cphttp=${ports[1]} cpgrpc=${ports[2]} agent=${ports[3]} router=${ports[4]}

start() { # name, args...
	local name=$run_id-$1; shift
	podman run -d --name "$name" --network host --read-only --cap-drop ALL \
		--security-opt no-new-privileges "$image" "$@" >/dev/null || fail "podman run $name"
	started+=("$name")
}
wait_http() { # url, what
	for _ in $(seq 1 100); do
		if curl -fs -o /dev/null "$1"; then return 0; fi
		sleep 0.1
	done
	fail "$2 did not answer at $1 within 10 s"
}

echo "== user, version and labels"
user=$(podman image inspect --format '{{.Config.User}}' "$image")
[[ $user == 65532:65532 ]] || fail "image user is '$user', want 65532:65532 (non-root)"
podman run --rm --network none "$image" --version | grep -E '^smg .+ \(commit [0-9a-f]{7,}' || fail "smg --version is not stamped"
rev=$(podman image inspect --format '{{index .Labels "org.opencontainers.image.revision"}}' "$image")
[[ $rev =~ ^[0-9a-f]{40}$ ]] || fail "org.opencontainers.image.revision label is '$rev'"

echo "== start sim :$sim, control plane :$cphttp/:$cpgrpc, agent :$agent, router :$router"
start sim sim --host 127.0.0.1 --port "$sim" --count 1 --model sim-model
wait_http "http://127.0.0.1:$sim/health" "sim"
start cp controlplane --host 127.0.0.1 --port "$cphttp" --grpc-port "$cpgrpc" \
	--worker-urls "http://127.0.0.1:$sim"
wait_http "http://127.0.0.1:$cphttp/health" "control plane"
start agent agent --host 127.0.0.1 --port "$agent" --controlplane "127.0.0.1:$cpgrpc" \
	--engine-urls "http://127.0.0.1:$sim" --poll-interval 100ms
wait_http "http://127.0.0.1:$agent/health" "agent"
start router router --host 127.0.0.1 --port "$router" --controlplane "127.0.0.1:$cpgrpc" \
	--router-id image-test --shutdown-grace-secs 5
wait_http "http://127.0.0.1:$router/readyz" "router /readyz"

echo "== a streaming request through the router"
body='{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":8,"stream":true}'
ok=
for _ in $(seq 1 50); do # the router's first snapshot may still be on its way
	out=$(curl -sS -N --max-time 10 -H 'Content-Type: application/json' -d "$body" \
		"http://127.0.0.1:$router/v1/chat/completions" || true)
	if grep -q '^data: \[DONE\]' <<<"$out" && [[ $(grep -c '"content"' <<<"$out") -ge 1 ]]; then ok=1; break; fi
	sleep 0.2
done
[[ -n $ok ]] || fail "no full streamed answer through the router; last: $(head -c 400 <<<"$out")"

echo "== /metrics"
has_series() { # url, prefix: the page is read whole before grep (no SIGPIPE on curl)
	local page
	page=$(curl -fsS "$1") || return 1
	grep -q "^$2" <<<"$page"
}
has_series "http://127.0.0.1:$router/metrics" smg_ || fail "router /metrics has no smg_ series"
# The engine's load reaches the control plane's registry within a poll and a
# flush (100 ms + 250 ms) of the worker turning Ready; allow a few seconds.
engine_series=
for _ in $(seq 1 50); do
	if has_series "http://127.0.0.1:$cphttp/metrics" smg_engine_; then engine_series=1; break; fi
	sleep 0.1
done
[[ -n $engine_series ]] || fail "control plane /metrics has no smg_engine_ series within 5 s"
has_series "http://127.0.0.1:$agent/metrics" smg_ || fail "agent /metrics has no smg_ series"

echo "== SIGTERM drains the router: the stream in flight ends whole, then the router exits 0"
long='{"model":"sim-model","messages":[{"role":"user","content":"hello"}],"max_tokens":100,"stream":true}'
inflight=$(mktemp)
curl -sS -N --max-time 20 -H 'Content-Type: application/json' -d "$long" \
	"http://127.0.0.1:$router/v1/chat/completions" >"$inflight" &
curl_pid=$!
sleep 0.5 # the stream is under way (100 tokens at the simulator's 20 ms take 2 s)
podman kill --signal TERM "$run_id-router" >/dev/null
wait "$curl_pid" || fail "the in-flight stream failed during the drain"
grep -q '^data: \[DONE\]' "$inflight" || fail "the in-flight stream did not end whole: $(tail -c 300 "$inflight")"
grep -q 'router_shutting_down' "$inflight" && fail "the in-flight stream was cut inside the grace"
rm -f "$inflight"
podman logs "$run_id-router" 2>&1 | grep -q 'Draining' || fail "the router did not log its drain"

echo "== every container exits 0 on SIGTERM"
for c in router cp agent sim; do
	# The router has its SIGTERM already (above) and may have exited by now.
	[[ $c == router ]] || podman kill --signal TERM "$run_id-$c" >/dev/null
	code=$(timeout 20 podman wait "$run_id-$c") || fail "$c did not exit within 20 s of SIGTERM"
	[[ $code == 0 ]] || fail "$c exited $code after SIGTERM, want 0"
done
echo "image-test: ok"
