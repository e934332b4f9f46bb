"""Cluster test tier: a real etcd, kube-apiserver, kube-scheduler (see docs/cluster-tier.md)."""
