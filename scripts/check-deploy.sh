#!/usr/bin/env bash
# Validate deploy/: Prometheus rules (promtool check/test rules), then the
# deploy/validate Go tests, which render the kustomizations and decode every
# object strictly with the Kubernetes API types, run each workload's args with
# the real smg binary on loopback (probes must pass, /metrics must satisfy
# `promtool check metrics`), and run the spec's PromQL queries against a real
# Prometheus scraping `smg launch`.
# Installs nothing: needs go, promtool and prometheus (Debian: apt-get install -y prometheus).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

missing=()
for t in go promtool prometheus; do
	command -v "$t" >/dev/null || missing+=("$t")
done
if ((${#missing[@]})); then
	echo "check-deploy: missing ${missing[*]} (promtool and prometheus: apt-get install -y prometheus)" >&2
	exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== promtool check rules"
promtool check rules deploy/prometheus/alerts.yaml

echo "== promtool test rules"
(cd deploy/prometheus && promtool test rules alerts_test.yaml)

echo "== build smg"
go build -o "$work/smg" ./cmd/smg

echo "== deploy/validate (manifests, probes on loopback, promtool check metrics, PromQL on Prometheus)"
# The tests start and stop their own processes (bounded waits, killed on exit);
# the timeout bounds the whole run.
(cd deploy/validate && SMG_BIN="$work/smg" SMG_REQUIRE_TOOLS=1 go test -race -count=1 -timeout 3m ./...)
