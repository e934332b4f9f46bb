"""The node agent (``fastgshare-node-agent``), one per GPU node.

It will own: the kubelet device plugin for ``fastgshare.caps.in.tum/vgpu``, GPU discovery
and health (NVML or a simulated inventory), the node inventory annotation, the arbiter the
hooks talk to, and MPS control. Built in issues 4 and 5; only the package boundary exists now.
"""
