#!/usr/bin/env bash
# FaST-GShare's uninstall command for serverless functions (there: helm uninstall fast-gshare), for
# fastgshare: runs deploy/uninstall.sh --yes, which deletes every FaSTPod (the functions' and
# yaml/fastpod/test-fastgshare-fn.yaml's too), the namespace fast-gshare-fn and everything else
# deploy/ created. It does not ask, as helm uninstall did not; run deploy/uninstall.sh without
# --yes to be asked first, or deploy/functions.sh uninstall to remove only the function components.
#
#   bash ./install/uninstall_fast-gshare-fn.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec bash "$root/deploy/uninstall.sh" --yes "$@"
