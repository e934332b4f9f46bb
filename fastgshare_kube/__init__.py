"""The Kubernetes layer the services share: for now, how each of them loads its API client.

Only a service's own Kubernetes adapter (its ``kube.py``) imports this package; the rest of the
layer (one informer, leader election, events, one API error type) is issue 15's next step.
"""
