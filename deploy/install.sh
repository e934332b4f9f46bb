#!/usr/bin/env bash
# Install fastgshare: kubectl apply -k deploy/, with the kube-scheduler configuration and image
# that the cluster's Kubernetes version runs, then wait until the components are up.
#
#   deploy/install.sh [--rotate-webhook-cert]
#
# Before applying anything it asks the API server for its version and stops at once if it cannot
# be reached or is older than 1.20. kube-scheduler reads kubescheduler.config.k8s.io/v1 from 1.25,
# v1beta2 on 1.22-1.24 and v1beta1 on 1.20-1.21; all three forms are in the ConfigMap and the
# scheduler is pointed at the one its version reads. If a component is not ready in time, the
# script prints the namespace's pods, the logs of those not ready and the recent events, and
# exits non-zero.
#
# The admission webhook's TLS: a CA and a serving certificate for
# fastgshare-webhook.fastgshare-system.svc, made with openssl and kept in the Secret
# fastgshare-webhook-tls; the CA goes into the caBundle of every webhook (the Validating- and the
# MutatingWebhookConfiguration: render fills each `caBundle: ""` line). A re-run
# keeps them while the certificate is valid for 30 more days and renews them otherwise, or always
# with --rotate-webhook-cert. On renewal the caBundle holds the new CA and the previous one, so
# the API server trusts the extender across the minute the kubelet takes to update the mounted
# Secret (the extender reloads the files on its next connection; no restart).
#
# Secrets it creates in fastgshare-system when absent (an existing one is kept; no value is ever
# printed or passed on a command line):
#   basic-auth                 the gateway's credentials, as OpenFaaS names them: basic-auth-user
#                              (admin) and basic-auth-password (random); read the password with
#                              kubectl -n fastgshare-system get secret basic-auth \
#                                -o jsonpath='{.data.basic-auth-password}' | base64 -d
#   fastgshare-assignment-key  key: 32 random bytes in hex, the key the extender signs assignments with
#                              and the node agents verify them with
# Key material is made in one private temporary directory, removed on every exit (success,
# failure or Ctrl-C).
#
# Environment:
#   FASTGSHARE_IMAGE            our image, for every component (default: the one deploy/ names,
#                               ghcr.io/fastgshare/fastgshare:0.1.0). An upgrade is a re-run with
#                               the new tag: the node agent's DaemonSet rolls one node at a time,
#                               and running GPU pods keep their shares (their hooks reconnect).
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
SHIPPED_PROJECT_IMAGE=ghcr.io/fastgshare/fastgshare:0.1.0

WEBHOOK_SECRET=fastgshare-webhook-tls
WEBHOOK_SERVICE=fastgshare-webhook
WEBHOOK_DAYS=365
WEBHOOK_RENEW_BEFORE_S=$((30 * 24 * 3600))

GATEWAY_AUTH_SECRET=basic-auth
GATEWAY_USER=admin
ASSIGNMENT_KEY_SECRET=fastgshare-assignment-key
WORK_DIR=""

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
# Served API versions, from kube-scheduler's published types: v1beta1 1.20-1.22, v1beta2 1.22-1.27,
# v1beta3 1.23-1.28, v1 from 1.25. Each minor gets the newest one we ship that it serves;
# tests/unit/deploy/test_scheduler_config_schemas.py checks every pick for 1.20-1.36.
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

# render CONFIG IMAGE [CA_BUNDLE [PROJECT_IMAGE]]: the kustomize output on stdin with the
# scheduler's --config and image set, the webhook's caBundle (base64) if given, and our image
# replaced by PROJECT_IMAGE if given.
render() {
    sed -e "s#--config=$CONFIG_DIR/$SHIPPED_CONFIG#--config=$CONFIG_DIR/$1#" \
        -e "s#$SHIPPED_IMAGE_PATTERN#image: $2#" \
        -e "s#caBundle: \"\"#caBundle: \"${3:-}\"#" \
        -e "s#image: $SHIPPED_PROJECT_IMAGE\$#image: ${4:-$SHIPPED_PROJECT_IMAGE}#"
}

# webhook_cert_valid CERT_BASE64: whether the PEM certificate is valid for 30 more days.
webhook_cert_valid() {
    [ -n "$1" ] && printf '%s' "$1" | base64 -d 2>/dev/null |
        openssl x509 -noout -checkend "$WEBHOOK_RENEW_BEFORE_S" >/dev/null 2>&1
}

# make_webhook_cert DIR: ca.crt, tls.crt and tls.key in DIR, for the webhook's Service.
make_webhook_cert() {
    local dir=$1 dns="$WEBHOOK_SERVICE.$NAMESPACE.svc"
    openssl req -x509 -newkey rsa:2048 -nodes -days "$WEBHOOK_DAYS" -subj "/CN=fastgshare-webhook-ca" \
        -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$dns" -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
    printf 'subjectAltName=DNS:%s,DNS:%s.%s,DNS:%s.cluster.local\nextendedKeyUsage=serverAuth\n' \
        "$dns" "$WEBHOOK_SERVICE" "$NAMESPACE" "$dns" >"$dir/ext"
    openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
        -days "$WEBHOOK_DAYS" -extfile "$dir/ext" -out "$dir/tls.crt" 2>/dev/null
}

# make_work_dir: WORK_DIR, a private temporary directory for key material, removed on every exit of
# the script (remove_work_dir is the EXIT trap main sets; INT and TERM exit through it).
make_work_dir() {
    WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/fastgshare-install.XXXXXX") || die "cannot make a temporary directory"
    chmod 700 "$WORK_DIR"
}

remove_work_dir() {
    [ -z "$WORK_DIR" ] || rm -rf -- "$WORK_DIR"
}

# secret_exists NAME: whether Secret NAME is in the namespace.
secret_exists() {
    kubectl -n "$NAMESPACE" get secret "$1" -o name >/dev/null 2>&1
}

# create_secret_from DIR NAME: Secret NAME with one key per file in DIR (values never on a command
# line); an existing one (made meanwhile) is kept.
create_secret_from() {
    local dir=$1 name=$2 file args=()
    for file in "$dir"/*; do args+=("--from-file=$file"); done
    if ! kubectl -n "$NAMESPACE" create secret generic "$name" "${args[@]}" >/dev/null; then
        secret_exists "$name" || die "cannot create Secret $NAMESPACE/$name"
    fi
    rm -rf -- "$dir"
}

# random_password: 32 characters from /dev/urandom (letters and digits).
random_password() {
    local password=""
    while [ "${#password}" -lt 32 ]; do
        password+=$(head -c 48 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')
    done
    printf '%s' "${password:0:32}"
}

# ensure_gateway_auth: Secret basic-auth (user admin, a random password) unless there is one.
ensure_gateway_auth() {
    local dir="$WORK_DIR/$GATEWAY_AUTH_SECRET"
    if secret_exists "$GATEWAY_AUTH_SECRET"; then
        echo "gateway credentials: kept (Secret $NAMESPACE/$GATEWAY_AUTH_SECRET)"
        return
    fi
    mkdir -m 700 "$dir"
    printf '%s' "$GATEWAY_USER" >"$dir/basic-auth-user"
    random_password >"$dir/basic-auth-password"
    create_secret_from "$dir" "$GATEWAY_AUTH_SECRET"
    echo "gateway credentials: new Secret $NAMESPACE/$GATEWAY_AUTH_SECRET, user $GATEWAY_USER; the password:"
    echo "  kubectl -n $NAMESPACE get secret $GATEWAY_AUTH_SECRET -o jsonpath='{.data.basic-auth-password}' | base64 -d"
}

# ensure_assignment_key: Secret fastgshare-assignment-key (key: 32 random bytes in hex) unless there is one.
ensure_assignment_key() {
    local dir="$WORK_DIR/$ASSIGNMENT_KEY_SECRET"
    if secret_exists "$ASSIGNMENT_KEY_SECRET"; then
        echo "assignment key: kept (Secret $NAMESPACE/$ASSIGNMENT_KEY_SECRET)"
        return
    fi
    mkdir -m 700 "$dir"
    # 32 random bytes as 64 hex characters: a text key has no whitespace for a reader to trim
    head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n' >"$dir/key"
    create_secret_from "$dir" "$ASSIGNMENT_KEY_SECRET"
    echo "assignment key: new Secret $NAMESPACE/$ASSIGNMENT_KEY_SECRET"
}

# webhook_ca_bundle ROTATE: make sure the Secret holds a certificate valid for 30 more days (a new
# one when it does not, or when ROTATE is 1); print the caBundle (base64) the API server needs.
webhook_ca_bundle() {
    local cert old_ca dir bundle
    cert=$(kubectl -n "$NAMESPACE" get secret "$WEBHOOK_SECRET" -o 'jsonpath={.data.tls\.crt}' 2>/dev/null || true)
    old_ca=$(kubectl -n "$NAMESPACE" get secret "$WEBHOOK_SECRET" -o 'jsonpath={.data.ca\.crt}' 2>/dev/null || true)
    if [ "$1" != 1 ] && [ -n "$old_ca" ] && webhook_cert_valid "$cert"; then
        echo "webhook certificate: kept (valid for more than 30 days; --rotate-webhook-cert renews it)" >&2
        echo "$old_ca"
        return
    fi
    command -v openssl >/dev/null || die "openssl is not on PATH; install.sh makes the webhook's certificate with it"
    if [ -z "$WORK_DIR" ]; then  # called on its own (sourced); main made it and removes it on exit
        make_work_dir
        trap remove_work_dir EXIT
    fi
    dir="$WORK_DIR/webhook"
    mkdir -m 700 "$dir"
    make_webhook_cert "$dir" || die "openssl could not make the webhook's certificate"
    kubectl -n "$NAMESPACE" create secret generic "$WEBHOOK_SECRET" --from-file="$dir/ca.crt" \
        --from-file="$dir/tls.crt" --from-file="$dir/tls.key" --dry-run=client -o yaml | kubectl apply -f - >&2 ||
        die "cannot store the webhook's certificate in Secret $NAMESPACE/$WEBHOOK_SECRET"
    bundle=$( { cat "$dir/ca.crt"; printf '%s' "$old_ca" | base64 -d 2>/dev/null || true; } | base64 | tr -d '\n')
    rm -rf -- "$dir"
    echo "webhook certificate: new, valid $WEBHOOK_DAYS days (Secret $NAMESPACE/$WEBHOOK_SECRET)" >&2
    echo "$bundle"
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

# seconds_of DURATION: 90, 90s or 3m in seconds.
seconds_of() {
    case "$1" in
        *m) echo $((${1%m} * 60)) ;;
        *s) echo "${1%s}" ;;
        *) echo "$1" ;;
    esac
}

# daemonset_current NAME: whether every node the DaemonSet wants runs a Ready pod of its current
# template (pod-template-generation = the DaemonSet's generation). kubectl rollout status alone
# can report a rollout done while the replaced pod is not created yet (seen on 1.20).
daemonset_current() {
    local generation desired ready
    generation=$(kubectl -n "$NAMESPACE" get daemonset "$1" -o 'jsonpath={.metadata.generation}') || return 1
    desired=$(kubectl -n "$NAMESPACE" get daemonset "$1" -o 'jsonpath={.status.desiredNumberScheduled}') || return 1
    ready=$(kubectl -n "$NAMESPACE" get pods -l "app.kubernetes.io/name=$1,pod-template-generation=$generation" \
        -o 'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c '^True$' || true)
    [ -n "$desired" ] && [ "$ready" -ge "$desired" ]
}

# wait_ready TARGET: kubectl rollout status (for a DaemonSet, until daemonset_current too), or
# the report and exit 1.
wait_ready() {
    local timeout=${FASTGSHARE_WAIT_TIMEOUT:-180s} deadline
    deadline=$((SECONDS + $(seconds_of "$timeout")))
    kubectl -n "$NAMESPACE" rollout status "$1" --timeout="$timeout" || {
        report_not_ready "$1" "$timeout"
        exit 1
    }
    if [[ "$1" == daemonset/* ]]; then
        until daemonset_current "${1#daemonset/}"; do
            if ((SECONDS >= deadline)); then
                report_not_ready "$1" "$timeout"
                exit 1
            fi
            sleep 2
        done
    fi
}

main() {
    local here version config image ca_bundle rotate=0
    for arg in "$@"; do
        case "$arg" in
            --rotate-webhook-cert) rotate=1 ;;
            *) die "unknown argument '$arg'; allowed: --rotate-webhook-cert" ;;
        esac
    done
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    command -v kubectl >/dev/null || die "kubectl is not on PATH; install kubectl 1.20 or newer (kustomize is built in)"
    version=$(server_version)
    config=$(scheduler_config_for "$version")
    image=${FASTGSHARE_SCHEDULER_IMAGE:-registry.k8s.io/kube-scheduler:v$version}
    echo "Kubernetes $version: kube-scheduler $image with scheduler/$config"
    kubectl apply -f "$here/namespace.yaml"
    make_work_dir
    trap remove_work_dir EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    ensure_gateway_auth
    ensure_assignment_key
    ca_bundle=$(webhook_ca_bundle "$rotate")
    [ -z "${FASTGSHARE_IMAGE:-}" ] || echo "fastgshare image: $FASTGSHARE_IMAGE"
    kubectl kustomize "$here" | render "$config" "$image" "$ca_bundle" "${FASTGSHARE_IMAGE:-}" | kubectl apply -f -
    kubectl wait --for=condition=Established crd/fastpods.fastgshare.caps.in.tum --timeout=60s
    wait_ready deployment/fastgshare-controller
    wait_ready deployment/fastgshare-scheduler
    wait_ready daemonset/fastgshare-node-agent
    wait_ready deployment/fastgshare-function-controller
    wait_ready deployment/fastgshare-gateway
    # The queue workers are Ready once they reach NATS by its Service's name; not waited for, so that a
    # cluster without DNS or kube-proxy (fastgshare cluster up --from-manifests) still installs.
    wait_ready deployment/fastgshare-nats
    echo "fastgshare is installed; try: kubectl apply -f $here/examples/testfastpod.yaml && kubectl get fstp"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
