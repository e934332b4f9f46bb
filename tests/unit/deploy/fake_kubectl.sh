#!/usr/bin/env bash
# A stand-in for kubectl in the install and uninstall script tests. It logs each call to
# $FAKE_LOG and answers from the environment:
#   FAKE_VERSION       the server's gitVersion (/version), or FAKE_UNREACHABLE=1
#   FAKE_STUCK         a rollout target (e.g. deployment/fastgshare-scheduler) that times out
#   FAKE_FASTPODS      lines "NAMESPACE NAME" of the FaSTPods that exist
#   FAKE_FASTFUNCS     lines "NAMESPACE NAME" of the FaSTFuncs that exist (the FaSTFunc CRD is there if set)
#   FAKE_ANNOTATED     node names carrying the fastgshare/gpu_info annotation
#   FAKE_SECRET_CERT, FAKE_SECRET_CA  the webhook Secret's tls.crt and ca.crt (base64), if any
#   FAKE_DS_STALE      1: the DaemonSet's pod of its current template is not there (yet)
# kubectl apply -f - stores what it was given in $FAKE_LOG.applied.
set -u
echo "kubectl $*" >>"$FAKE_LOG"
case "$*" in
  "get --raw /version")
    if [ "${FAKE_UNREACHABLE:-}" = 1 ]; then
      echo "The connection to the server localhost:8080 was refused - did you specify the right host or port?" >&2
      exit 1
    fi
    printf '{\n  "major": "1",\n  "minor": "x",\n  "gitVersion": "%s",\n  "platform": "linux/amd64"\n}\n' "$FAKE_VERSION" ;;
  kustomize*)
    cat <<'YAML'
kind: Deployment
spec:
  template:
    spec:
      containers:
        - name: kube-scheduler
          image: registry.k8s.io/kube-scheduler:v1.30.6
          command:
            - kube-scheduler
            - --config=/etc/fastgshare/kube-scheduler-config.yaml
YAML
    ;;
  "apply -f -") cat >"$FAKE_LOG.applied" ;;
  *"rollout status ${FAKE_STUCK:-none}"*)
    echo "error: timed out waiting for the condition" >&2; exit 1 ;;
  *"get daemonset"*"metadata.generation"*) printf 3 ;;
  *"get daemonset"*"desiredNumberScheduled"*) printf 1 ;;
  *"get pods -l"*"pod-template-generation=3"*)
    [ "${FAKE_DS_STALE:-}" = 1 ] || printf 'True\n' ;;
  *"get pods"*"-o wide"*)
    echo "NAME                                   READY   STATUS             RESTARTS   AGE"
    echo "fastgshare-scheduler-7d9c8b6f5-abcde   1/2     CrashLoopBackOff   5          3m" ;;
  *"get pods"*"--no-headers"*)
    echo "fastgshare-controller-5c7f9d-xyz12    1/1   Running            0   3m"
    echo "fastgshare-scheduler-7d9c8b6f5-abcde  1/2   CrashLoopBackOff   5   3m" ;;
  *"get events"*)
    echo "3m  Warning  BackOff  pod/fastgshare-scheduler-7d9c8b6f5-abcde  Back-off restarting failed container" ;;
  *"logs"*)
    echo "[kube-scheduler] no kind \"KubeSchedulerConfiguration\" is registered for version \"kubescheduler.config.k8s.io/v1\"" ;;
  *"get secret"*'tls\.crt'*) printf '%s' "${FAKE_SECRET_CERT:-}" ;;
  *"get secret"*'ca\.crt'*) printf '%s' "${FAKE_SECRET_CA:-}" ;;
  *"get crd fastfuncs"*)
    [ -n "${FAKE_FASTFUNCS+x}" ] || exit 1 ;;
  *"get crd"*)
    [ -n "${FAKE_FASTPODS+x}" ] || exit 1 ;;
  *"get fastfuncs"*)
    printf '%s\n' "${FAKE_FASTFUNCS:-}" | sed '/^$/d' ;;
  *"get fastpods"*)
    printf '%s\n' "${FAKE_FASTPODS:-}" | sed '/^$/d' ;;
  *"get nodes"*)
    for node in ${FAKE_ANNOTATED:-}; do echo "$node"; done ;;
  *) ;;
esac
exit 0
