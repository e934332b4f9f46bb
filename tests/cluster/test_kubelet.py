"""The opt-in kubelet tier: a real kubelet registers its node and serves the device-plugin socket."""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.cluster.controlplane import wait_until
from tests.cluster.kubelet import KubeletNode

pytestmark = pytest.mark.kubelet


def test_kubelet_registers_node_and_serves_device_plugin_socket(
        kubelet_node: KubeletNode, core: kubernetes.client.CoreV1Api) -> None:
    def registered() -> bool:
        try:
            core.read_node(kubelet_node.name)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    wait_until(registered, what=f"node {kubelet_node.name} to register", timeout_s=120,
               watched=kubelet_node.process)
    assert core.read_node(kubelet_node.name).status.node_info.kubelet_version == "v1.20.2"
    wait_until(kubelet_node.kubelet_socket.is_socket, what=f"{kubelet_node.kubelet_socket}", timeout_s=60,
               watched=kubelet_node.process)
