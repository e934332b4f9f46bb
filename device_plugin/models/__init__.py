"""The node's model store (model sharing, docs/node-agent.md "Model store"): one worker process per
GPU holds each function's weights once and exports them through CUDA IPC; the node agent decides
what each GPU holds and hands pods the handle of their own function's model.

- :mod:`.protocol`: the two wire formats (pod -> agent, agent -> worker), parsed and answered; pure;
- :mod:`.plan`: which models each GPU needs (from the agent's pod records) and when an unneeded one
  is freed (the grace period); pure;
- :mod:`.worker`: the per-GPU worker process (``python -m device_plugin.models.worker``), CUDA
  through ctypes;
- :mod:`.store`: the agent's side: starting and adopting workers, loading, freeing, what each GPU
  holds (for the inventory and the metrics);
- :mod:`.access`: the pod-facing socket ``model.sock``.
"""
