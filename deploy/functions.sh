#!/usr/bin/env bash
# The serverless function components on their own: the FaSTFunc CRD, the function controller, the
# gateway (OpenFaaS provider API), NATS and the queue workers (asynchronous invocations), the
# function namespace fast-gshare-fn and its vGPU quota (function-quota.yaml), and the gateway's
# Secret basic-auth when absent (as deploy/install.sh makes it: user admin, a random password, never
# printed). deploy/install.sh installs them together with the rest of fastgshare; this adds or
# removes only them.
#
#   deploy/functions.sh install            apply them and wait until they are up
#   deploy/functions.sh uninstall          say what it will delete and ask
#   deploy/functions.sh uninstall --yes    delete without asking (scripts)
#
# uninstall deletes every FaSTFunc (its FaSTPods, pods and Service go with it), the gateway, the
# function controller, the queue workers and NATS (with the invocations still queued), and the
# FaSTFunc CRD. It keeps the namespace fast-gshare-fn and what else is in it (FaSTPods written as
# functions are yours), and the rest of fastgshare. Without --yes and without a terminal to ask on,
# it deletes nothing and exits 2.
#
# The functions below are also sourced by the tests (tests/unit/deploy/test_functions_script.py).
set -euo pipefail

CRD=fastfuncs.fastgshare.caps.in.tum
NAMESPACE=fastgshare-system
FUNCTION_NAMESPACE=fast-gshare-fn
COMPONENTS=(gateway/deployment.yaml gateway/rbac.yaml function-controller/deployment.yaml function-controller/rbac.yaml
            queue/worker.yaml queue/nats.yaml queue/networkpolicy.yaml queue/rbac.yaml)

die() {
    echo "functions.sh: $*" >&2
    exit 2
}

# fastfuncs: "NAMESPACE NAME" of every FaSTFunc, one a line (none when the CRD is not installed).
fastfuncs() {
    kubectl get crd "$CRD" >/dev/null 2>&1 || return 0
    kubectl get fastfuncs --all-namespaces --no-headers \
        -o custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name
}

confirmed() {
    [ "$1" = yes ] && return 0
    [ -t 0 ] || return 1
    local answer
    read -r -p "Delete all of this? [y/N] " answer || return 1
    [[ "$answer" =~ ^[Yy]([Ee][Ss])?$ ]]
}

install() {
    local here="$1" file
    kubectl get --raw /version >/dev/null 2>&1 ||
        die "cannot reach the cluster; check kubectl's context: kubectl config current-context"
    kubectl apply -f "$here/namespace.yaml" -f "$here/function-quota.yaml" -f "$here/crd/fastfuncs.yaml"
    kubectl wait --for condition=established --timeout=60s "crd/$CRD"
    # install.sh's own function, in a subshell: its temporary key material is removed when it ends
    (
        # shellcheck source=deploy/install.sh
        source "$here/install.sh"
        make_work_dir
        trap remove_work_dir EXIT
        ensure_gateway_auth
    )
    for file in "${COMPONENTS[@]}"; do
        kubectl apply -f "$here/$file"
    done
    kubectl -n "$NAMESPACE" rollout status deployment/fastgshare-function-controller --timeout="${FASTGSHARE_WAIT_TIMEOUT:-180s}"
    kubectl -n "$NAMESPACE" rollout status deployment/fastgshare-gateway --timeout="${FASTGSHARE_WAIT_TIMEOUT:-180s}"
    kubectl -n "$NAMESPACE" rollout status deployment/fastgshare-nats --timeout="${FASTGSHARE_WAIT_TIMEOUT:-180s}"
    echo "functions are installed: deploy with fastgshare fn deploy, or POST /system/functions on the gateway"
    echo "(service fastgshare-gateway.$NAMESPACE, port 8080; kubectl -n $NAMESPACE port-forward svc/fastgshare-gateway 8080)"
}

uninstall() {
    local here="$1" yes="$2" namespace name file listed
    listed=$(fastfuncs)
    echo "This deletes, in this order:"
    while read -r namespace name; do
        [ -n "$name" ] && echo "  - FaSTFunc $namespace/$name (and its FaSTPods, pods and Service)"
    done <<<"$listed"
    echo "  - the gateway and the function controller (deployments, service accounts, roles in $NAMESPACE"
    echo "    and $FUNCTION_NAMESPACE), NATS with the asynchronous invocations still queued, the queue"
    echo "    workers, and the FaSTFunc CRD $CRD"
    echo "It keeps the namespace $FUNCTION_NAMESPACE with anything else in it, and the rest of fastgshare."
    if ! confirmed "$yes"; then
        die "not confirmed, nothing deleted; run deploy/functions.sh uninstall --yes to delete the above"
    fi
    while read -r namespace name; do
        [ -n "$name" ] && kubectl -n "$namespace" delete fastfunc "$name" --wait=true
    done <<<"$listed"
    for file in "${COMPONENTS[@]}"; do
        kubectl delete -f "$here/$file" --ignore-not-found=true --wait=true
    done
    kubectl delete -f "$here/crd/fastfuncs.yaml" --ignore-not-found=true --wait=true
    echo "the function components are uninstalled."
}

main() {
    local here action="${1:-}" yes=no
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    command -v kubectl >/dev/null || die "kubectl is not on PATH; install kubectl 1.20 or newer"
    case "$action" in
        install) [ $# -eq 1 ] || die "usage: deploy/functions.sh install"; install "$here" ;;
        uninstall)
            shift
            for argument in "$@"; do
                case "$argument" in
                    --yes | -y) yes=yes ;;
                    *) die "unknown argument '$argument'; usage: deploy/functions.sh uninstall [--yes]" ;;
                esac
            done
            uninstall "$here" "$yes" ;;
        -h | --help) sed -n '2,17s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" ;;
        *) die "usage: deploy/functions.sh install | uninstall [--yes] (got '${action}')" ;;
    esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
