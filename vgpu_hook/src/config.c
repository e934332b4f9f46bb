/* config.c: reads the hook's environment once (see config.h for the variables). */
#define _GNU_SOURCE
#include "config.h"

#include "fastgshare_protocol.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Copies an optional variable; a value that does not fit is a configuration error. */
static void copy_env(struct fgs_config *cfg, const char *name, char *dest, size_t size)
{
    const char *value = getenv(name);
    dest[0] = '\0';
    if (value == NULL)
        return;
    if (strlen(value) >= size) {
        if (cfg->error[0] == '\0')
            snprintf(cfg->error, sizeof cfg->error, "%s is longer than %zu bytes", name, size - 1);
        return;
    }
    memcpy(dest, value, strlen(value) + 1);
}

/* On by default: on a real GPU launches return before their kernels end, and without the sync
 * the work queued under an expiring token runs into the next holder's time. */
static void read_sync_flag(struct fgs_config *cfg)
{
    const char *value = getenv(FGS_ENV_SYNC_AT_TOKEN_END);
    if (value == NULL || strcmp(value, "") == 0 || strcmp(value, "1") == 0 || strcmp(value, "true") == 0)
        cfg->sync_at_token_end = 1;
    else if (strcmp(value, "0") == 0 || strcmp(value, "false") == 0)
        cfg->sync_at_token_end = 0;
    else if (cfg->error[0] == '\0')
        snprintf(cfg->error, sizeof cfg->error, FGS_ENV_SYNC_AT_TOKEN_END "=%.64s is not 0 or 1", value);
}

static void read_timeout(struct fgs_config *cfg)
{
    const char *value = getenv(FGS_ENV_REPLY_TIMEOUT_MS);
    cfg->reply_timeout_ms = FGS_DEFAULT_REPLY_TIMEOUT_MS;
    if (value == NULL || *value == '\0')
        return;
    char *end;
    errno = 0;
    long ms = strtol(value, &end, 10);
    if (errno != 0 || *end != '\0' || ms <= 0 || ms > 24L * 3600 * 1000) {
        if (cfg->error[0] == '\0')
            snprintf(cfg->error, sizeof cfg->error, FGS_ENV_REPLY_TIMEOUT_MS "=%.64s is not a positive "
                     "number of milliseconds", value);
        return;
    }
    cfg->reply_timeout_ms = (int)ms;
}

static void read_reconnect(struct fgs_config *cfg)
{
    const char *value = getenv(FGS_ENV_RECONNECT_S);
    cfg->reconnect_ms = FGS_DEFAULT_RECONNECT_S * 1000;
    if (value == NULL || *value == '\0')
        return;
    char *end;
    errno = 0;
    double seconds = strtod(value, &end);
    if (errno != 0 || *end != '\0' || !(seconds >= 0) || seconds > 24.0 * 3600) {
        if (cfg->error[0] == '\0')
            snprintf(cfg->error, sizeof cfg->error, FGS_ENV_RECONNECT_S "=%.64s is not a number of seconds "
                     "from 0 to 86400", value);
        return;
    }
    cfg->reconnect_ms = (int)(seconds * 1000);
}

static void read_log_level(struct fgs_config *cfg)
{
    const char *value = getenv(FGS_ENV_HOOK_LOG);
    cfg->log_level = FGS_LOG_ERROR;
    if (value == NULL || *value == '\0' || strcmp(value, "error") == 0)
        return;
    if (strcmp(value, "info") == 0)
        cfg->log_level = FGS_LOG_INFO;
    else if (strcmp(value, "debug") == 0)
        cfg->log_level = FGS_LOG_DEBUG;
    else
        snprintf(cfg->warning, sizeof cfg->warning, FGS_ENV_HOOK_LOG "=%.64s is not error, info or debug; "
                 "logging errors only", value);
}

void fgs_config_from_env(struct fgs_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    copy_env(cfg, FGS_ENV_ARBITER_SOCKET, cfg->socket_path, sizeof cfg->socket_path);
    copy_env(cfg, FGS_ENV_POD, cfg->pod, sizeof cfg->pod);
    copy_env(cfg, FGS_ENV_GPU_UUID, cfg->gpu_uuid, sizeof cfg->gpu_uuid);
    read_sync_flag(cfg);
    read_timeout(cfg);
    read_reconnect(cfg);
    read_log_level(cfg);
}
