#!/usr/bin/env bash
# Build the Kubernetes v1.20.2 binaries used by the cluster test tier.
#
# kube-apiserver, kube-scheduler, kube-controller-manager and kubelet are built
# offline from Debian bookworm's `kubernetes` source package (the full upstream
# tree with vendor/) and copied to
#     ${FASTGSHARE_K8S_CACHE:-$HOME/.cache/fastgshare/k8s-1.20.2}/bin/
# etcd comes from Debian's etcd-server package.  When all four binaries are
# already cached and etcd is on PATH the script returns at once.
#
# Environment:
#   FASTGSHARE_K8S_CACHE          cache directory (default above)
#   FASTGSHARE_K8S_KEEP_GOCACHE=1 keep the Go build cache in $CACHE/go-build for faster
#                                 rebuilds (by default it goes with the build tree)
#
# Needs root (or sudo) for apt-get; takes about 5 minutes on 2 cores when cold.
set -Eeuo pipefail

CACHE="${FASTGSHARE_K8S_CACHE:-$HOME/.cache/fastgshare/k8s-1.20.2}"
BIN="$CACHE/bin"
WORK="$CACHE/work"
K8S_VERSION="v1.20.2"
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubelet)
BUILD_PACKAGES=(dpkg-dev golang-go rsync jq golang-github-modern-go-reflect2-dev)
RUNTIME_PACKAGES=(etcd-server openssl curl)

current_step="start"
trap 'echo "build-control-plane: FAILED in step: ${current_step} (exit $?)" >&2' ERR

step() {
    current_step="$*"
    echo "==> $* [${SECONDS}s]"
}

as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "build-control-plane: '$*' needs root and sudo is not available" >&2
        return 1
    fi
}

apt_install() {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

binaries_cached() {
    local name
    for name in "${BINARIES[@]}"; do
        [[ -x "$BIN/$name" ]] || return 1
    done
}

ensure_deb_src() {
    if grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        return 0
    fi
    printf '%s\n' 'Types: deb-src' 'URIs: http://deb.debian.org/debian' \
        'Suites: bookworm bookworm-updates' 'Components: main' \
        'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
        as_root tee /etc/apt/sources.list.d/debian-src.sources >/dev/null
}

if binaries_cached; then
    if ! command -v etcd >/dev/null; then
        step "installing runtime packages (${RUNTIME_PACKAGES[*]})"
        as_root apt-get update -q
        apt_install "${RUNTIME_PACKAGES[@]}"
    fi
    echo "==> using cached binaries in $BIN (etcd: $(command -v etcd)) [${SECONDS}s]"
    exit 0
fi

step "adding Debian deb-src entries"
ensure_deb_src

step "installing build and runtime packages"
as_root apt-get update -q
apt_install "${BUILD_PACKAGES[@]}" "${RUNTIME_PACKAGES[@]}"

step "fetching the kubernetes source package into $WORK"
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
apt-get source -q kubernetes
src_dir=$(find "$WORK" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' -print -quit)
[[ -n "$src_dir" ]] || { echo "no kubernetes-* directory after apt-get source" >&2; false; }
cd "$src_dir"

step "replacing vendored modern-go/reflect2 1.0.1 (crashes under Go >= 1.18) with Debian's"
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2

step "building ${BINARIES[*]} (GOPATH mode, CGO_ENABLED=0)"
mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
if [[ "${FASTGSHARE_K8S_KEEP_GOCACHE:-0}" == 1 ]]; then
    gocache="$CACHE/go-build"
else
    gocache="$WORK/go-build"
fi
what=""
for name in "${BINARIES[@]}"; do what+="cmd/$name "; done
GOPATH="$PWD/.go" GOCACHE="$gocache" CGO_ENABLED=0 \
    KUBE_GIT_VERSION="$K8S_VERSION" KUBE_GIT_TREE_STATE=clean \
    make WHAT="${what% }"

step "copying binaries to $BIN"
mkdir -p "$BIN"
for name in "${BINARIES[@]}"; do
    install -m 0755 "_output/bin/$name" "$BIN/$name.tmp"
    mv -f "$BIN/$name.tmp" "$BIN/$name"
done

step "removing the source and build tree"
cd "$CACHE"
rm -rf "$WORK"

"$BIN/kube-apiserver" --version
echo "==> done: ${BINARIES[*]} in $BIN [${SECONDS}s]"
