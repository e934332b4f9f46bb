/*
 * fastgshare_model.h: the model API of the fastgshare hook (libfastgshare-hook.so, LD_PRELOADed in
 * every GPU container of a fastgshare node). A function maps the weights its FaSTFunc declares
 * (spec.model) from the node's model store instead of loading its own copy: every pod on the GPU
 * maps the same bytes, and the GPU holds them once.
 *
 * The functions are exported by the hook, not by a library a program links: find them at run time,
 *   C:      open_fn = (int (*)(const char *, CUdeviceptr *, size_t *))dlsym(RTLD_DEFAULT, "fastgshare_model_open");
 *   Python: hook = ctypes.CDLL(None); hook.fastgshare_model_open(...)
 * (NULL / AttributeError: the process runs without the hook, e.g. not on a fastgshare node.)
 *
 * fastgshare_model_open(name, &ptr, &bytes)
 *   needs a current CUDA context on the calling thread (on the GPU of the pod). It asks the node
 *   agent over $FASTGSHARE_MODEL_SOCKET (default /var/run/fastgshare/model.sock; Allocate sets it)
 *   for the pod's model: one JSON request, one answer line of at most 4096 bytes, within
 *   $FASTGSHARE_MODEL_TIMEOUT_MS (default 5000) for connecting and the answer together. The agent
 *   loads the model on the GPU if no pod there has yet (the first call of a cold GPU waits for the
 *   file to be read and copied) and answers its CUDA IPC handle; the hook maps it with the real
 *   driver's cuIpcOpenMemHandle (_v2 where the driver has it), flag
 *   CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS. On success *ptr is the device address of the weights and
 *   *bytes their size.
 *   name: NULL or "" for the pod's model (the fastgshare/model annotation of its pod, from its
 *   FaSTFunc's spec.model); otherwise it must equal that model's name, else the agent refuses.
 *   Charged: nothing to the pod. The weights are the store's allocation (the node charges each
 *   model once per GPU, beside the pods' gpu_mem); the hook does not count IPC imports.
 *   Read-only by convention: the bytes are every pod's on the GPU; writing them changes them for all.
 *   Each successful open needs one fastgshare_model_close. Opening again in the same process gives
 *   the same address (the driver counts the opens).
 *
 * fastgshare_model_close(ptr)
 *   the real driver's cuIpcCloseMemHandle(ptr), with the context the mapping was made in current.
 *   The store frees the weights once no pod on the GPU declares the model any more (after a grace
 *   period), not when a process closes them.
 *
 * fastgshare_model_error()
 *   the calling thread's last failure of either function, one line without a newline (e.g.
 *   "model socket /var/run/fastgshare/model.sock: connection refused (is the node agent running
 *   with the model store?)", or "node agent: " and the agent's own reason); "" when the thread's
 *   last call succeeded or it made none. Valid until the thread's next call of either function.
 *
 * All three are thread-safe: calls on different threads do not share state.
 */
#ifndef FASTGSHARE_MODEL_H
#define FASTGSHARE_MODEL_H

#include <cuda.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return values of fastgshare_model_open and fastgshare_model_close. */
#define FASTGSHARE_MODEL_OK 0
#define FASTGSHARE_MODEL_EINVAL 1   /* a bad argument (NULL ptr or bytes, a name over 255 bytes) or setting
                                       (FASTGSHARE_MODEL_SOCKET too long, FASTGSHARE_MODEL_TIMEOUT_MS) */
#define FASTGSHARE_MODEL_EAGENT 2   /* the node agent could not be reached or did not answer in time */
#define FASTGSHARE_MODEL_EPROTO 3   /* the agent's answer was malformed (too long, not the format) */
#define FASTGSHARE_MODEL_EREFUSED 4 /* the agent refused ({"ok": false}): no model for this pod, another
                                       name, the file missing or of another size, no memory left... */
#define FASTGSHARE_MODEL_EDRIVER 5  /* the driver could not be loaded, or cuIpcOpenMemHandle or
                                       cuIpcCloseMemHandle failed (no current context, a stale handle) */

int fastgshare_model_open(const char *name, CUdeviceptr *ptr, size_t *bytes);
int fastgshare_model_close(CUdeviceptr ptr);
const char *fastgshare_model_error(void);

#ifdef __cplusplus
}
#endif

#endif
