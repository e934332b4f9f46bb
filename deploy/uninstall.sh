#!/usr/bin/env bash
# Remove fastgshare from the cluster: every FaSTPod (its pods go with it), everything deploy/
# created (with the function namespace fast-gshare-fn and the functions in it), and the
# fastgshare/gpu_info and fastgshare/metrics_port annotations the node agent wrote on each GPU node.
#
#   deploy/uninstall.sh          says what it will delete and asks
#   deploy/uninstall.sh --yes    deletes without asking (scripts)
#
# Without --yes and without a terminal to ask on, it deletes nothing and exits 2. Pods you
# created yourself with the fastgshare.caps.in.tum/vgpu resource are not deleted. The kubelet drops
# the resource from the nodes' capacity a few minutes after the node agent is gone. On each GPU
# node the state directory /var/lib/fastgshare stays; remove it by hand if you want.
#
# The functions below are also sourced by the tests (tests/unit/deploy/test_uninstall_script.py).
set -euo pipefail

CRD=fastpods.fastgshare.caps.in.tum
NODE_ANNOTATION=fastgshare/gpu_info        # the inventory
METRICS_PORT_ANNOTATION=fastgshare/metrics_port  # where the agent serves /metrics
NAMESPACE=fastgshare-system

die() {
    echo "uninstall.sh: $*" >&2
    exit 2
}

# fastpods: "NAMESPACE NAME" of every FaSTPod, one a line (none when the CRD is not installed).
fastpods() {
    kubectl get crd "$CRD" >/dev/null 2>&1 || return 0
    kubectl get fastpods --all-namespaces --no-headers \
        -o custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name
}

# annotated_nodes: the names of the nodes that carry either annotation of the node agent.
annotated_nodes() {
    kubectl get nodes -o go-template="{{range .items}}{{\$name := .metadata.name}}{{with .metadata.annotations}}{{if or (index . \"$NODE_ANNOTATION\") (index . \"$METRICS_PORT_ANNOTATION\")}}{{\$name}}{{\"\\n\"}}{{end}}{{end}}{{end}}"
}

# remove_node_annotation NODE: drop the node agent's annotations, nothing else of the node.
remove_node_annotation() {
    kubectl annotate node "$1" "$NODE_ANNOTATION-" "$METRICS_PORT_ANNOTATION-"
}

# confirmed YES: true if --yes was given or the user answers yes on the terminal.
confirmed() {
    [ "$1" = yes ] && return 0
    [ -t 0 ] || return 1
    local answer
    read -r -p "Delete all of this? [y/N] " answer || return 1
    [[ "$answer" =~ ^[Yy]([Ee][Ss])?$ ]]
}

main() {
    local here yes=no argument namespace name node
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    for argument in "$@"; do
        case "$argument" in
            --yes | -y) yes=yes ;;
            -h | --help) sed -n '2,13s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; return 0 ;;
            *) die "unknown argument '$argument'; usage: deploy/uninstall.sh [--yes]" ;;
        esac
    done
    command -v kubectl >/dev/null || die "kubectl is not on PATH; install kubectl 1.20 or newer"
    local listed nodes
    listed=$(fastpods)
    nodes=$(annotated_nodes)
    echo "This deletes, in this order:"
    while read -r namespace name; do
        [ -n "$name" ] && echo "  - FaSTPod $namespace/$name (and its pods)"
    done <<<"$listed"
    echo "  - everything deploy/ created: namespace $NAMESPACE (controller, scheduler, node agent, MPS"
    echo "    daemon, function controller, gateway, NATS with the queued asynchronous invocations, queue"
    echo "    workers), namespace fast-gshare-fn with every function in it, the FaSTPod CRD $CRD"
    echo "    and the FaSTFunc CRD, and fastgshare's cluster roles and bindings"
    echo "    (deploy/functions.sh uninstall removes only the function components)"
    for node in $nodes; do
        echo "  - the $NODE_ANNOTATION and $METRICS_PORT_ANNOTATION annotations of node $node"
    done
    if ! confirmed "$yes"; then
        die "not confirmed, nothing deleted; run deploy/uninstall.sh --yes to delete the above"
    fi
    while read -r namespace name; do
        [ -n "$name" ] && kubectl -n "$namespace" delete fastpod "$name" --wait=true
    done <<<"$listed"
    # The node agent goes first: it would write the annotations again.
    kubectl delete -k "$here" --ignore-not-found=true --wait=true
    for node in $nodes; do
        remove_node_annotation "$node"
    done
    echo "fastgshare is uninstalled."
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
