#!/usr/bin/env bash
# Remove fastgshare: FaSTPods first (their pods are garbage-collected with them), then everything
# deploy/ created. Nothing is left in the cluster.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if kubectl get crd fastpods.fastgshare.caps.in.tum >/dev/null 2>&1; then
    kubectl delete fastpods --all --all-namespaces --wait=true
fi
kubectl delete -k "$here" --ignore-not-found=true --wait=true
