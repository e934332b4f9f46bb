"""Generated gRPC code of two kubelet APIs: the device plugin API (``deviceplugin.proto``) and
the PodResources API (``podresources.proto``).

The ``*_pb2*.py`` modules are produced by the build (``setup.py`` runs grpcio-tools) and are
not committed. Only :mod:`device_plugin.servicer`, :mod:`device_plugin.registration` and
:mod:`device_plugin.pod_resources` import them.
"""
