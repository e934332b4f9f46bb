#!/usr/bin/env bash
# FaST-GShare's install command for serverless functions (there: helm install fast-gshare), for
# fastgshare: runs deploy/install.sh, which installs the function controller and the gateway (an
# OpenFaaS provider API) together with what functions run on (the FaSTPod controller, the
# scheduler, the node agent). Functions live in the namespace fast-gshare-fn, as there. Arguments
# and environment are deploy/install.sh's. To add or remove only the function components on an
# installed fastgshare: deploy/functions.sh install | uninstall.
#
#   bash ./install/install_fast-gshare-fn.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec bash "$root/deploy/install.sh" "$@"
