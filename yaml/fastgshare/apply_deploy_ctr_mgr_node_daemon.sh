#!/usr/bin/env bash
# FaST-GShare's install command, for fastgshare: runs deploy/install.sh (the FaSTPod controller,
# the scheduler with its extender, the node agent DaemonSet, the MPS daemon, the function
# controller and the gateway; it waits until they are up). Arguments and environment are
# deploy/install.sh's (e.g. --rotate-webhook-cert, FASTGSHARE_IMAGE).
#
#   bash ./yaml/fastgshare/apply_deploy_ctr_mgr_node_daemon.sh
#
# Unlike the original it needs no ConfigMap of your kubeconfig, copies nothing onto the nodes and
# labels no node: docs/install.md says what a GPU node needs.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exec bash "$root/deploy/install.sh" "$@"
