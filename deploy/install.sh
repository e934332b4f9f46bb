#!/usr/bin/env bash
# Install fastgshare: kubectl apply -k deploy/, then wait until the components are up.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
kubectl apply -k "$here"
kubectl wait --for=condition=Established crd/fastpods.fastgshare.caps.in.tum --timeout=60s
kubectl -n fastgshare-system rollout status deployment/fastgshare-controller --timeout=180s
kubectl -n fastgshare-system rollout status deployment/fastgshare-scheduler --timeout=180s
kubectl -n fastgshare-system rollout status daemonset/fastgshare-node-agent --timeout=300s
echo "fastgshare is installed; try: kubectl apply -f $here/examples/testfastpod.yaml && kubectl get fstp"
