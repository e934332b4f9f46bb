"""Every name that crosses a component boundary, in one place.

Annotation and label keys, the extended resource, the CRD identity, the scheduler name,
the environment variables the node agent hands to containers, and defaults that more than
one component must agree on. No other module spells these strings.
"""

from __future__ import annotations

from typing import Final

# --- API group and prefixes ------------------------------------------------------------
API_GROUP: Final = "fastgshare.caps.in.tum"
ANNOTATION_PREFIX: Final = "fastgshare/"

# --- the extended resource the node agent advertises -----------------------------------
VGPU_RESOURCE: Final = f"{API_GROUP}/vgpu"
DEFAULT_SLOTS_PER_GPU: Final = 16

# --- the share a user asks for (FaSTPod and Pod annotations) ---------------------------
GPU_QUOTA_REQUEST: Final = f"{ANNOTATION_PREFIX}gpu_quota_request"
GPU_QUOTA_LIMIT: Final = f"{ANNOTATION_PREFIX}gpu_quota_limit"
GPU_SM_PARTITION: Final = f"{ANNOTATION_PREFIX}gpu_sm_partition"
GPU_MEM: Final = f"{ANNOTATION_PREFIX}gpu_mem"
SHARE_ANNOTATIONS: Final = (GPU_QUOTA_REQUEST, GPU_QUOTA_LIMIT, GPU_SM_PARTITION, GPU_MEM)

# Optional: the containers that use the GPU, comma-separated names (default: all containers).
GPU_CONTAINERS_ANNOTATION: Final = f"{ANNOTATION_PREFIX}gpu_containers"
# Optional per-pod override of the extender's placement policy ("binpack" or "spread").
SCHEDULING_POLICY_ANNOTATION: Final = f"{ANNOTATION_PREFIX}scheduling_policy"
# Model sharing (fastgshare.model): the function's model, JSON {"function", "name", "bytes", "path"},
# written by the function controller on its pods from FaSTFunc spec.model. The pod's GPU holds the
# weights once (the node's model store); the pod maps them through the hook (fastgshare_model_open).
MODEL_ANNOTATION: Final = f"{ANNOTATION_PREFIX}model"

# --- what the components write for each other ------------------------------------------
# Node: the node agent's GPU inventory (versioned JSON, see fastgshare.codec).
NODE_GPU_INFO_ANNOTATION: Final = f"{ANNOTATION_PREFIX}gpu_info"
# The port of the node agent's /metrics on the node's address (read through the API server's node proxy).
NODE_METRICS_PORT_ANNOTATION: Final = f"{ANNOTATION_PREFIX}metrics_port"
DEFAULT_NODE_METRICS_PORT: Final = 9401
# Pod: the extender's GPU assignment, written by bind before the Binding is created.
POD_ASSIGNMENT_ANNOTATION: Final = f"{ANNOTATION_PREFIX}assignment"
# Pod: set by the node agent once kubelet's Allocate has been answered for the pod.
POD_ALLOCATED_ANNOTATION: Final = f"{ANNOTATION_PREFIX}allocated"
# Pod: the extender's signature over its assignment (HMAC-SHA256 with the assignment key, which
# only the extender and the node agents can read), bound to the pod's uid, node, GPU and share.
POD_ASSIGNMENT_SIGNATURE_ANNOTATION: Final = f"{ANNOTATION_PREFIX}assignment-signature"
# What only our components may write (the admission webhook refuses anyone else, admins included).
SYSTEM_POD_ANNOTATIONS: Final = (POD_ASSIGNMENT_ANNOTATION, POD_ASSIGNMENT_SIGNATURE_ANNOTATION,
                                 POD_ALLOCATED_ANNOTATION)
SYSTEM_NODE_ANNOTATIONS: Final = (NODE_GPU_INFO_ANNOTATION, NODE_METRICS_PORT_ANNOTATION)

# --- FaSTPod custom resource -----------------------------------------------------------
FASTPOD_GROUP: Final = API_GROUP
FASTPOD_VERSION: Final = "v1"
FASTPOD_KIND: Final = "FaSTPod"
FASTPOD_PLURAL: Final = "fastpods"
FASTPOD_SINGULAR: Final = "fastpod"
FASTPOD_SHORT_NAME: Final = "fstp"
FASTPOD_CRD_NAME: Final = f"{FASTPOD_PLURAL}.{FASTPOD_GROUP}"
FASTPOD_API_VERSION: Final = f"{FASTPOD_GROUP}/{FASTPOD_VERSION}"
# Label the controller puts on the pods it owns (value: the FaSTPod's name).
FASTPOD_NAME_LABEL: Final = f"{API_GROUP}/fastpod"
# Pod label: a hash of what the controller built the pod from; a changed spec makes it outdated.
REVISION_LABEL: Final = f"{API_GROUP}/revision"

# --- FaSTFunc custom resource: a serverless function on shared GPUs (docs/functions.md) -----
FASTFUNC_GROUP: Final = API_GROUP
FASTFUNC_VERSION: Final = "v1"
FASTFUNC_KIND: Final = "FaSTFunc"
FASTFUNC_PLURAL: Final = "fastfuncs"
FASTFUNC_SINGULAR: Final = "fastfunc"
FASTFUNC_SHORT_NAME: Final = "fstf"
FASTFUNC_CRD_NAME: Final = f"{FASTFUNC_PLURAL}.{FASTFUNC_GROUP}"
FASTFUNC_API_VERSION: Final = f"{FASTFUNC_GROUP}/{FASTFUNC_VERSION}"
# Label on a function's FaSTPods and pods (value: the function's name); the gateway routes by it.
FUNCTION_LABEL: Final = f"{API_GROUP}/function"
# OpenFaaS's own label for a function's pods, for its tooling.
OPENFAAS_FUNCTION_LABEL: Final = "faas_function"
# Label on a function's FaSTPod and pods naming the (quota, SM) configuration, e.g. "q40-s12".
FUNCTION_CONFIG_LABEL: Final = f"{API_GROUP}/config"
# Annotation on a function's parked FaSTPod (time quota 0/0) that the gateway woke (an RFC 3339 time):
# it tells the function controller to take the woken pods as its own. Not copied to the pods (so it
# is no part of the FaSTPod's revision).
FASTPOD_WOKEN_ANNOTATION: Final = f"{API_GROUP}/woken"
# OpenFaaS scale labels (on a FaSTPod written as a function, and in a FunctionDeployment).
OPENFAAS_SCALE_MIN_LABEL: Final = "com.openfaas.scale.min"
OPENFAAS_SCALE_MAX_LABEL: Final = "com.openfaas.scale.max"
DEFAULT_FUNCTION_NAMESPACE: Final = "fast-gshare-fn"
# Node label that makes a node without NVIDIA GPUs run the node agent on simulated GPUs (to try
# fastgshare, and in our real-node tests); its value is a GPU spec written label-safe, with "_"
# for ":" (e.g. "2x16GiB_80sm"). The node agent's DaemonSet runs on nodes with this label, the MPS
# DaemonSet does not (simulated GPUs model MPS themselves). Ignored where NVML finds GPUs.
SIMULATED_GPUS_LABEL: Final = f"{API_GROUP}/simulated-gpus"
FUNCTION_PORT: Final = 8080  # what a function's container serves (the of-watchdog contract)
DEFAULT_GATEWAY_PORT: Final = 8080

# --- scheduling and deployment ---------------------------------------------------------
SCHEDULER_NAME: Final = "fastgshare-scheduler"
SYSTEM_NAMESPACE: Final = "fastgshare-system"
# Who may write SYSTEM_POD_ANNOTATIONS / SYSTEM_NODE_ANNOTATIONS: the extender's and the node agent's
# service accounts (the webhook's default; the extender's --system-writers changes it).
SCHEDULER_SERVICE_ACCOUNT: Final = "fastgshare-scheduler"
NODE_AGENT_SERVICE_ACCOUNT: Final = "fastgshare-node-agent"
# The gateway's credentials, as OpenFaaS names them: Secret `basic-auth` in the gateway's namespace
# (SYSTEM_NAMESPACE), mounted as files named after its keys (the gateway's --basic-auth-dir).
BASIC_AUTH_SECRET: Final = "basic-auth"
BASIC_AUTH_USER_KEY: Final = "basic-auth-user"
BASIC_AUTH_PASSWORD_KEY: Final = "basic-auth-password"
# The key the extender signs assignments with and the node agents verify them with: Secret in
# SYSTEM_NAMESPACE, key ASSIGNMENT_KEY_SECRET_KEY, a file for --assignment-key-file.
ASSIGNMENT_KEY_SECRET: Final = "fastgshare-assignment-key"
ASSIGNMENT_KEY_SECRET_KEY: Final = "key"
# Who may read every component's /metrics (fastgshare_kube.metrics_access): under --metrics-auth
# kubernetes (the default) a bearer token the API server authenticates, of a user it allows get on
# the non-resource URL /metrics. The token may come in METRICS_TOKEN_HEADER instead of
# Authorization, which the API server removes before it proxies a request to a pod or node.
# `fastgshare inspect` reads as METRICS_READER_SERVICE_ACCOUNT (in SYSTEM_NAMESPACE) where the
# caller's own kubeconfig has no token.
METRICS_AUTH_KUBERNETES: Final = "kubernetes"
METRICS_AUTH_NONE: Final = "none"
METRICS_AUTH_CHOICES: Final = (METRICS_AUTH_KUBERNETES, METRICS_AUTH_NONE)
METRICS_TOKEN_HEADER: Final = "X-Fastgshare-Authorization"
METRICS_READER_SERVICE_ACCOUNT: Final = "fastgshare-metrics-reader"

# --- environment handed to GPU containers by the node agent ----------------------------
ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_MPS_THREAD_PERCENTAGE: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_PIPE_DIRECTORY: Final = "CUDA_MPS_PIPE_DIRECTORY"
ENV_LD_PRELOAD: Final = "LD_PRELOAD"
ENV_ARBITER_SOCKET: Final = "FASTGSHARE_ARBITER_SOCKET"
ENV_POD: Final = "FASTGSHARE_POD"  # "<namespace>/<name>", for logs and the trusted-env demo mode
ENV_GPU_UUID: Final = "FASTGSHARE_GPU_UUID"
# The node agent's model socket in the container (the hook's fastgshare_model_open connects to it).
ENV_MODEL_SOCKET: Final = "FASTGSHARE_MODEL_SOCKET"
# Downward-API env the controller gives GPU containers (the pod's own name and namespace).
ENV_POD_NAME: Final = "FASTGSHARE_POD_NAME"
ENV_POD_NAMESPACE: Final = "FASTGSHARE_POD_NAMESPACE"
# Settings the hook reads (all optional): see vgpu_hook/README.md.
ENV_HOOK_SYNC_AT_TOKEN_END: Final = "FASTGSHARE_SYNC_AT_TOKEN_END"
ENV_HOOK_REPLY_TIMEOUT_MS: Final = "FASTGSHARE_HOOK_REPLY_TIMEOUT_MS"
ENV_HOOK_LOG: Final = "FASTGSHARE_HOOK_LOG"
ENV_HOOK_RECONNECT_S: Final = "FASTGSHARE_HOOK_RECONNECT_S"  # after losing the arbiter, reconnect this long
# The fake GPU driver of the tests and the demo: its shared device directory and memory size.
ENV_FAKE_GPU_DIR: Final = "FASTGSHARE_FAKE_GPU_DIR"
ENV_FAKE_GPU_MEMORY: Final = "FASTGSHARE_FAKE_GPU_MEMORY"

# --- paths inside GPU containers (the node agent mounts host paths there) --------------
CONTAINER_HOOK_PATH: Final = "/usr/local/fastgshare/lib/libfastgshare-hook.so"
CONTAINER_RUN_DIR: Final = "/var/run/fastgshare"
ARBITER_SOCKET_NAME: Final = "arbiter.sock"
# The node agent's model socket (pods ask it for their model's IPC handle), next to the arbiter's.
MODEL_SOCKET_NAME: Final = "model.sock"
DEFAULT_MPS_PIPE_DIRECTORY: Final = "/tmp/nvidia-mps"
# The MPS control daemon's pipe in its pipe directory: there while the daemon runs (node agent, simgpu/mps.py).
MPS_CONTROL_PIPE: Final = "control"
# With simulated GPUs, Allocate mounts the simulated driver where the NVIDIA container toolkit
# mounts the real one, and the simulated GPU's shared state directory.
CONTAINER_DRIVER_DIR: Final = "/usr/lib/x86_64-linux-gnu"
CUDA_DRIVER_LIBRARY: Final = "libcuda.so.1"
NVML_LIBRARY: Final = "libnvidia-ml.so.1"
CONTAINER_FAKE_GPU_DIR: Final = "/usr/local/fastgshare/fake-gpu"

# --- the kubelet device plugin ----------------------------------------------------------
DEVICE_PLUGIN_SOCKET: Final = "fastgshare-vgpu.sock"  # file name inside the device-plugin dir
SLOT_ID_SEPARATOR: Final = "::"  # slot device ID = "<gpu uuid>::<slot>", as NVIDIA's replicas

# --- the 2-D bin every GPU is, in the core's integer units -----------------------------
TIME_UNITS: Final = 1000  # the scheduling window in permille
SM_UNITS: Final = 100  # SM partition in percent
