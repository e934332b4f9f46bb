/*
 * ipc_memory.h: what ipc_memory.c (cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle and
 * the shared IPC table) needs to hear from fake_memory.c.
 */
#ifndef SIMGPU_IPC_MEMORY_H
#define SIMGPU_IPC_MEMORY_H

#include <stdint.h>

/* cuMemFree has freed an exported allocation (its memory already unmapped here): its handles are
 * refused from now on, and its bytes are given back once no importer maps them. */
void fake_ipc_allocation_freed(uint64_t dptr);

#endif
