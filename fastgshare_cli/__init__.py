"""The ``fastgshare`` command for users: check manifests and plan GPU packing offline.

It reads files and prints tables; every decision comes from the core (:mod:`fastgshare`).
"""
