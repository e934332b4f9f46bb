#!/usr/bin/env bash
# FaST-GShare's clean-up command, for fastgshare: runs deploy/uninstall.sh --yes (every FaSTPod,
# then everything deploy/ created, then the node agent's node annotations), then deletes the
# namespace fast-gshare if yaml/fastpod/testfastpod.yaml made it (it carries the label
# app.kubernetes.io/part-of=fastgshare). It does not ask, as the original did not; run
# deploy/uninstall.sh without --yes to be asked first.
#
#   bash ./yaml/fastgshare/clean_deploy_ctr_mgr_node_daemon.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SAMPLE_NAMESPACE=fast-gshare
PART_OF=fastgshare

case "${1:-}" in
    "") ;;
    -h | --help) sed -n '2,8s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "clean_deploy_ctr_mgr_node_daemon.sh: unknown argument '$1'; it takes none (-h for help)" >&2; exit 2 ;;
esac
bash "$root/deploy/uninstall.sh" --yes
part_of=$(kubectl get namespace "$SAMPLE_NAMESPACE" --ignore-not-found \
    -o 'jsonpath={.metadata.labels.app\.kubernetes\.io/part-of}')
if [ "$part_of" = "$PART_OF" ]; then
    echo "deleting namespace $SAMPLE_NAMESPACE (made by yaml/fastpod/testfastpod.yaml)"
    kubectl delete namespace "$SAMPLE_NAMESPACE" --ignore-not-found=true --wait=true
fi
