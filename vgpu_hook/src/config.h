/*
 * config.h: the hook's settings, read from the environment once at init (never on the hot path)
 * and copied, so a later setenv() in the application cannot change or free them.
 *
 *   FASTGSHARE_ARBITER_SOCKET          unix socket of the node's arbiter (required to launch)
 *   FASTGSHARE_POD                     "namespace/name", sent in HELLO (trusted-env mode only)
 *   FASTGSHARE_GPU_UUID                the GPU this container was given, sent in HELLO
 *   FASTGSHARE_SYNC_AT_TOKEN_END       1 (default): cuCtxSynchronize before returning an expired token;
 *                                      0: return it at once (queued kernels may outlive the token)
 *   FASTGSHARE_HOOK_REPLY_TIMEOUT_MS   how long to wait for any arbiter reply (default 30000)
 *   FASTGSHARE_HOOK_RECONNECT_S        after losing a registered connection (the node agent restarts),
 *                                      how long to reconnect before failing closed (default 120; 0: never)
 *   FASTGSHARE_HOOK_LOG                error | info | debug (default error)
 */
#ifndef FASTGSHARE_HOOK_CONFIG_H
#define FASTGSHARE_HOOK_CONFIG_H

#include "log.h"

#define FGS_ENV_SYNC_AT_TOKEN_END "FASTGSHARE_SYNC_AT_TOKEN_END"
#define FGS_ENV_REPLY_TIMEOUT_MS "FASTGSHARE_HOOK_REPLY_TIMEOUT_MS"
#define FGS_ENV_HOOK_LOG "FASTGSHARE_HOOK_LOG"
#define FGS_DEFAULT_REPLY_TIMEOUT_MS 30000
#define FGS_ENV_RECONNECT_S "FASTGSHARE_HOOK_RECONNECT_S"
/* Long enough for a DaemonSet rolling update of the node agent: up to Kubernetes 1.21 (no maxSurge
 * for DaemonSets) the new pod starts about a minute after the old one terminates
 * (kubernetes#94270; 73 s measured on our real node). */
#define FGS_DEFAULT_RECONNECT_S 120

struct fgs_config {
    char socket_path[108]; /* "" when unset; sized like sockaddr_un.sun_path */
    char pod[320];
    char gpu_uuid[128];
    int sync_at_token_end;
    int reply_timeout_ms;
    int reconnect_ms; /* 0: a lost connection fails closed at once */
    enum fgs_log_level log_level;
    char error[256];   /* why a setting is unusable ("" when all are fine): launches fail closed */
    char warning[256]; /* a setting ignored with a default used instead ("" when none) */
};

void fgs_config_from_env(struct fgs_config *cfg);

#endif
