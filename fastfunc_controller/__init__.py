"""The FaSTFunc controller (``fastgshare-function-controller``): a serverless function on shared GPUs.

Each FaSTFunc (``fastfuncs.fastgshare.caps.in.tum``) is reconciled into one child FaSTPod per
(quota, SM) configuration, named ``<fn>-q<quota%>-s<sm%>``, a ClusterIP Service ``<fn>`` and its
status. This version runs ``policy: fixed`` (the share and replica count in ``spec.fixed``); the
autoscaling policies ``rpr`` and ``hpa`` run the same fixed configuration until the autoscaler
exists (``ProfileMissing`` says so when there is no profile). ``Unschedulable`` says when a pod of
the function cannot be placed, with the scheduler's reason.

- :mod:`.spec`: the FaSTFunc validated into a :class:`~.spec.FunctionSpec` (pure);
- :mod:`.plan`: the desired children, the actions that converge them and the status (pure);
- :mod:`.kube`: the one adapter to the API (through :mod:`fastgshare_kube`);
- :mod:`.controller`: caches, the work loop and ``reconcile(key)``;
- :mod:`.main`: flags, leader election, health, signals.
"""
