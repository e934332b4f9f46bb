"""A whole fastgshare cluster on one Linux machine, the way ``kind`` runs Kubernetes: a v1.20
control plane, containerd with a CNI bridge, a real kubelet, our extender, controller and node
agent with simulated GPUs, and locally built images (``fastgshare cluster up | down | status``).

It runs our services as processes and imports none of them. The cluster test tier uses the
same code.
"""
