/*
 * What the driver served, per entry point: counted so that a test can compare it with what the
 * hook intercepted (nothing may reach the driver around the hook).
 */
#ifndef SIMGPU_SERVED_H
#define SIMGPU_SERVED_H

/* Counts one call of the entry point `name` (its exported symbol name, e.g. "cuMemAlloc_v2"). */
void fake_count_served(const char *name);

/* At the top of every allocation, free and launch entry point. */
#define FAKE_SERVED() fake_count_served(__func__)

#endif
