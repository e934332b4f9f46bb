"""The FaSTPod controller (``fastgshare-controller``): turns each FaSTPod into its pods.

The shape is Kubernetes' sample-controller: watch-fed caches (:class:`fastgshare_kube.store.Store`, fed by
:class:`fastgshare_kube.reflector.Reflector`) only enqueue keys into a deduplicating, rate-limited work queue
(:class:`fastgshare_kube.workqueue.WorkQueue`); workers call one level-triggered, idempotent ``reconcile(key)``
(:mod:`.controller`) that reads the caches and converges. The decisions are pure functions:
the FaSTPod's spec is validated into a desired state (:mod:`.spec`), pods are built from the
whole podSpec (:mod:`.builder`), the creates and deletes are planned (:mod:`.plan`) and the
status is computed (:mod:`.status`). :mod:`.kube` is the only module that reaches
the API, through the shared Kubernetes layer (:mod:`fastgshare_kube`), whose
:mod:`~fastgshare_kube.leader` keeps one active replica through a Lease; :mod:`.main` wires it.
"""
