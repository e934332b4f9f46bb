"""Generated gRPC code of the kubelet device plugin API (``deviceplugin.proto``).

The ``*_pb2*.py`` modules are produced by the build (``setup.py`` runs grpcio-tools) and are
not committed. Only :mod:`device_plugin.servicer` and :mod:`device_plugin.registration`
import them.
"""
