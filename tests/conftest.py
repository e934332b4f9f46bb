"""Settings shared by every test tier."""

from hypothesis import HealthCheck, settings

# The machines that run the tests are small and shared: no per-example deadline, and
# generation may be slow while other work (a control-plane build) takes the CPUs.
settings.register_profile("fastgshare", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fastgshare")
