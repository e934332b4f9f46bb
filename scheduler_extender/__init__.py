"""The kube-scheduler extender (``fastgshare-extender``): filter, prioritize and bind for GPU shares.

A kube-scheduler profile named ``fastgshare-scheduler`` calls it over HTTP for every pod that
requests ``fastgshare.caps.in.tum/vgpu``. It keeps a watch-fed cache of the nodes' GPU
inventories and the pods' GPU assignments, judges nodes with the core's ledgers and placement
policies, and binds a pod by writing its GPU assignment and then the Binding.

Modules: ``main`` (flags, wiring), ``services`` (what the edges call, and its wiring), ``verbs``
(filter, prioritize and bind, one function each), ``http`` (the HTTP edge: servers, apps, routes,
the webhook and its TLS; its docstring says why there are two servers), ``wire`` (the extender
JSON), ``records`` (what is read from Pod/Node JSON), ``decisions`` (filter, prioritize),
``binder`` (bind), ``admission`` (the webhook's validate and mutate), ``state``, ``nodes`` and
``placements`` (the cache), ``kube`` (the only module that imports ``kubernetes``), ``ports``
(what bind needs from the API), ``metrics``, ``inspection`` (the ``/inspect`` view), ``config``.
"""
