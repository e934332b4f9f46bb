# One image for every Python component (node agent, extender, controller, the fastgshare
# command), with the CUDA hook built inside. Build from the repository root:
#   docker build -t ghcr.io/fastgshare/fastgshare:0.1.0 .
# The node agent installs the hook (and, on nodes with simulated GPUs, the simulated driver) from
# /usr/lib/fastgshare into the node's state directory.

# --- build: the hook (C, against cuda.h from the CUDA runtime wheel) and the Python wheel ---
FROM python:3.11.10-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir nvidia-cuda-runtime==13.0.96 \
 && make -C vgpu_hook PYTHON=python build/libfastgshare-hook.so \
 && make -C simgpu PYTHON=python build/libcuda.so.1 build/libnvidia-ml.so.1 \
 && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- runtime ------------------------------------------------------------------------------
FROM python:3.11.10-slim-bookworm
LABEL org.opencontainers.image.title="fastgshare" \
      org.opencontainers.image.description="Spatio-temporal GPU sharing for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Debian's NATS server: the store of asynchronous invocations (deploy/queue/nats.yaml runs it from
# this image, so one image still serves every component).
RUN apt-get update \
 && apt-get install -y --no-install-recommends nats-server \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/vgpu_hook/build/libfastgshare-hook.so /usr/lib/fastgshare/libfastgshare-hook.so
# The simulated driver (libcuda, NVML) a node without GPUs runs on when it carries the label
# fastgshare.caps.in.tum/simulated-gpus: Allocate mounts it into GPU pods there; unused elsewhere.
COPY --from=build /src/simgpu/build/libcuda.so.1 /src/simgpu/build/libnvidia-ml.so.1 \
     /usr/lib/fastgshare/fake/
# The extender and the controller run as this user; the node agent runs as root (it serves
# sockets in kubelet's device-plugin directory): its DaemonSet sets runAsUser: 0.
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin fastgshare
USER 10001
ENTRYPOINT []
CMD ["fastgshare", "--help"]
