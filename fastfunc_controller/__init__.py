"""The FaSTFunc controller (``fastgshare-function-controller``): a serverless function on shared GPUs.

Each FaSTFunc (``fastfuncs.fastgshare.caps.in.tum``) is reconciled into one child FaSTPod per
(quota, SM) configuration, named ``<fn>-q<quota%>-s<sm%>``, a ClusterIP Service ``<fn>`` and its
status. ``policy: fixed`` runs the share and replica count in ``spec.fixed``; the autoscaling
policies ``rpr`` and ``hpa`` scale the configurations from the profile ConfigMap and the gateways'
request rates (``ProfileMissing`` and the fixed configuration when the profile cannot be used,
``MetricsUnavailable`` when no rate can be read). ``Unschedulable`` says when a pod of the function
cannot be placed, with the scheduler's reason. ``spec.model`` (model sharing) is written on every
child as the ``fastgshare/model`` annotation and counted once per GPU by the autoscaler.

- :mod:`.spec`: the FaSTFunc validated into a :class:`~.spec.FunctionSpec` (pure);
- :mod:`.plan`: the desired children, the actions that converge them and the status (pure);
- :mod:`.autoscale`: the profile's configurations and the scaler's step per interval (pure);
- :mod:`.rates`: request rates from the gateways' counters (pure);
- :mod:`.metrics_source`: the one adapter to the gateways' ``/metrics`` (HTTP);
- :mod:`.kube`: the one adapter to the API (through :mod:`fastgshare_kube`);
- :mod:`.controller`: caches, the work loop and ``reconcile(key)``;
- :mod:`.main`: flags, leader election, health, signals.
"""
