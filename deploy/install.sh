#!/usr/bin/env bash
# Install fastgshare: kubectl apply -k deploy/, with the kube-scheduler configuration and image
# that the cluster's Kubernetes version runs, then wait until the components are up.
#
#   deploy/install.sh
#
# Before applying anything it asks the API server for its version and stops at once if it cannot
# be reached or is older than 1.20. kube-scheduler reads kubescheduler.config.k8s.io/v1 from 1.25,
# v1beta2 on 1.22-1.24 and v1beta1 on 1.20-1.21; all three forms are in the ConfigMap and the
# scheduler is pointed at the one its version reads. If a component is not ready in time, the
# script prints the namespace's pods, the logs of those not ready and the recent events, and
# exits non-zero.
#
# Environment:
#   FASTGSHARE_SCHEDULER_IMAGE  the kube-scheduler image (default: registry.k8s.io/kube-scheduler
#                               at the cluster's own version, e.g. v1.20.2)
#   FASTGSHARE_WAIT_TIMEOUT     how long to wait for each component (default: 180s)
#
# The functions below are also sourced by the tests (tests/unit/deploy/test_install_script.py).
set -euo pipefail

NAMESPACE=fastgshare-system
CONFIG_DIR=/etc/fastgshare
SHIPPED_CONFIG=kube-scheduler-config.yaml
SHIPPED_IMAGE_PATTERN='image: registry.k8s.io/kube-scheduler:.*'

die() {
    echo "install.sh: $*" >&2
    exit 1
}

# version_from_json JSON: MAJOR.MINOR.PATCH of the gitVersion in the API server's /version
# document (a vendor suffix such as -eks-2d98532 or +k3s2 is dropped).
version_from_json() {
    local version
    version=$(printf '%s' "$1" | tr -d '\n' |
        sed -n 's/.*"gitVersion"[[:space:]]*:[[:space:]]*"v\{0,1\}\([0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*\)[^"]*".*/\1/p')
    [ -n "$version" ] || die "cannot read the server's version from its /version answer: $1"
    echo "$version"
}

# server_version: the API server's version, MAJOR.MINOR.PATCH; dies at once if it cannot be asked.
server_version() {
    local answer
    answer=$(kubectl get --raw /version 2>&1) ||
        die "cannot reach the cluster (kubectl get --raw /version: $answer); check kubectl's context: kubectl config current-context"
    version_from_json "$answer"
}

# scheduler_config_for VERSION: the file in deploy/scheduler/ that kube-scheduler VERSION reads.
scheduler_config_for() {
    local major minor rest
    IFS=. read -r major minor rest <<<"$1"
    [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] || die "not a Kubernetes version: '$1'"
    if ((major > 1 || minor >= 25)); then
        echo kube-scheduler-config.yaml
    elif ((minor >= 22)); then
        echo kube-scheduler-config.v1beta2.yaml
    elif ((minor >= 20)); then
        echo kube-scheduler-config.v1beta1.yaml
    else
        die "Kubernetes $1 is too old: fastgshare needs 1.20 or newer"
    fi
}

# render CONFIG IMAGE: the kustomize output on stdin with the scheduler's --config and image set.
render() {
    sed -e "s#--config=$CONFIG_DIR/$SHIPPED_CONFIG#--config=$CONFIG_DIR/$1#" \
        -e "s#$SHIPPED_IMAGE_PATTERN#image: $2#"
}

# report_not_ready TARGET TIMEOUT: what the cluster says about the namespace's pods, on stderr.
report_not_ready() {
    {
        echo "install.sh: $1 is not ready after $2. Pods in $NAMESPACE:"
        kubectl -n "$NAMESPACE" get pods -o wide || true
        local pod ready status
        kubectl -n "$NAMESPACE" get pods --no-headers 2>/dev/null |
            while read -r pod ready status _; do
                if [ "${ready%%/*}" != "${ready##*/}" ] || [ "$status" != Running ]; then
                    echo "--- logs of $pod ($status), last lines of each container:"
                    kubectl -n "$NAMESPACE" logs "$pod" --all-containers --prefix --tail=15 || true
                fi
            done
        echo "--- recent events in $NAMESPACE:"
        kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp | tail -n 20 || true
    } >&2
}

# wait_ready TARGET: kubectl rollout status, or the report and exit 1.
wait_ready() {
    local timeout=${FASTGSHARE_WAIT_TIMEOUT:-180s}
    kubectl -n "$NAMESPACE" rollout status "$1" --timeout="$timeout" || {
        report_not_ready "$1" "$timeout"
        exit 1
    }
}

main() {
    local here version config image
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    command -v kubectl >/dev/null || die "kubectl is not on PATH; install kubectl 1.20 or newer (kustomize is built in)"
    version=$(server_version)
    config=$(scheduler_config_for "$version")
    image=${FASTGSHARE_SCHEDULER_IMAGE:-registry.k8s.io/kube-scheduler:v$version}
    echo "Kubernetes $version: kube-scheduler $image with scheduler/$config"
    kubectl kustomize "$here" | render "$config" "$image" | kubectl apply -f -
    kubectl wait --for=condition=Established crd/fastpods.fastgshare.caps.in.tum --timeout=60s
    wait_ready deployment/fastgshare-controller
    wait_ready deployment/fastgshare-scheduler
    wait_ready daemonset/fastgshare-node-agent
    echo "fastgshare is installed; try: kubectl apply -f $here/examples/testfastpod.yaml && kubectl get fstp"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
