"""The kube-scheduler extender (``fastgshare-extender``): filter, prioritize and bind.

Built in issue 7 on the core's ledger and placement policies; only the package boundary
exists now.
"""
