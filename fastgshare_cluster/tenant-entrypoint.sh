#!/bin/sh
# Entrypoint of fastgshare/tenant:local: runs the tenant program against the GPU the pod was
# given, configured from the environment.
#   TENANT_PATTERN    saturating (default), or ON_MS:OFF_MS for bursts
#   TENANT_KERNEL_US  length of each kernel in microseconds (default 2000)
#   TENANT_MEMORY     GPU memory to allocate at start, bytes or with K/M/G(i) suffix (default 0)
#   TENANT_SECONDS    how long to run; 0 runs until stopped (default 0)
# Prints one JSON line per second with its launches and errors; a refused allocation is printed
# with its CUDA error and the tenant keeps running. Extra arguments go to the tenant program.
set -e
pattern=${TENANT_PATTERN:-saturating}
set -- --report-interval-s 1 --keep-going --duration-us "${TENANT_KERNEL_US:-2000}" \
       --seconds "${TENANT_SECONDS:-0}" "$@"
case "$pattern" in
    saturating) ;;
    *:*) set -- --burst-on-ms "${pattern%%:*}" --burst-off-ms "${pattern#*:}" "$@" ;;
    *) echo "TENANT_PATTERN=$pattern: expected saturating or ON_MS:OFF_MS (e.g. 50:150)" >&2; exit 64 ;;
esac
if [ -n "${TENANT_MEMORY:-}" ] && [ "$TENANT_MEMORY" != 0 ]; then
    set -- --alloc "$TENANT_MEMORY" "$@"
fi
exec /opt/fastgshare/bin/tenant "$@"
