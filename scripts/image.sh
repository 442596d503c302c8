#!/usr/bin/env bash
# Build the smg container image with podman from a static binary and write it as
# an OCI archive. Usage: scripts/image.sh [OUT.tar]   (default bin/smg-image.tar)
# Env: IMAGE (default localhost/smg), VERSION (default `git describe`), COMMIT.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

if ! command -v podman >/dev/null; then
	echo "make image: podman is not installed (Debian: apt-get install -y podman runc)" >&2
	exit 1
fi
ca=/etc/ssl/certs/ca-certificates.crt
if [[ ! -s $ca ]]; then
	echo "make image: $ca is missing (Debian: apt-get install -y ca-certificates)" >&2
	exit 1
fi

image=${IMAGE:-localhost/smg}
version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
commit=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
out=${1:-bin/smg-image.tar}
# A tag may not contain '+' or start with '.'/'-'; git describe output is safe.
tag=${version}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT

echo "== static smg $version ($commit)"
CGO_ENABLED=0 go build -trimpath \
	-ldflags "-s -w -X github.com/smg-project/smg/internal/version.Version=$version -X github.com/smg-project/smg/internal/version.Commit=$commit" \
	-o "$ctx/smg" ./cmd/smg
cp "$ca" "$ctx/ca-certificates.crt"
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$ctx/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/group"
cp Containerfile "$ctx/Containerfile"

echo "== podman build $image:$tag"
podman build --quiet -f "$ctx/Containerfile" \
	--build-arg VERSION="$version" --build-arg REVISION="$commit" \
	--build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
	-t "$image:$tag" -t "$image:latest" "$ctx" >/dev/null

mkdir -p "$(dirname "$out")"
rm -f "$out"
podman save --quiet --format oci-archive -o "$out" "$image:$tag"
size=$(podman image inspect --format '{{.Size}}' "$image:$tag")
echo "image $image:$tag: $((size / 1024 / 1024)) MiB ($size bytes) uncompressed; OCI archive $out: $(du -h "$out" | cut -f1)"
