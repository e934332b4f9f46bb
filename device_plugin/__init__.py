"""The node agent (``fastgshare-node-agent``), one per GPU node: the kubelet device plugin for
``fastgshare.caps.in.tum/vgpu`` (``servicer.py``, ``registration.py``), GPU discovery and health
(``discovery.py``, ``nvml.py``), the node inventory annotation, Allocate (``allocation.py``), MPS
that comes and goes (``mps.py``, ``mps_watch.py``), the Kubernetes adapter (``kube.py``) and the
arbiter the hooks talk to (``arbiter/``). docs/node-agent.md is its manual.
"""
