/*
 * The hook <-> arbiter protocol, version 1: the C side.
 *
 * Defined twice, here and in fastgshare/protocol.py; tests/unit/core/test_protocol_header.py
 * parses this header and fails if the two disagree. Change both together.
 *
 * Transport: a SOCK_STREAM unix socket. Every message is one frame, all integers
 * little-endian (explicitly encoded, never memcpy'd structs):
 *
 *   offset size field
 *   0      4    length      bytes that follow this field (FGS_HEADER_SIZE - 4 + payload)
 *   4      2    version     FGS_PROTOCOL_VERSION
 *   6      2    type        FGS_MSG_*
 *   8      4    request_id  echoed in the reply
 *   12     ...  payload     per type, below
 *
 * A reply has type (request type | FGS_REPLY_BIT), or FGS_MSG_ERROR. Frames longer than
 * FGS_MAX_FRAME are a protocol error; both sides read until a whole frame has arrived.
 *
 * Payloads (u16 strings are a u16 byte count followed by UTF-8 bytes, no NUL):
 *   HELLO          u32 pid, str pod ("namespace/name", trusted mode only, else empty),
 *                  str gpu_uuid
 *   HELLO reply    u32 window_us, u32 request_permille, u32 limit_permille, u32 sm_percent,
 *                  u64 memory_limit_bytes, u32 min_token_us
 *   TOKEN          u64 used_ns (GPU time used of the previous token; 0 on the first request)
 *   TOKEN reply    u64 token_ns (how long the client may launch from now)
 *   MEM_RESERVE    u64 bytes
 *   MEM_RESERVE r. u32 granted (1 or 0), u64 pod_used_bytes, u64 pod_limit_bytes
 *   MEM_RELEASE    u64 bytes
 *   MEM_RELEASE r. u64 pod_used_bytes
 *   MEM_RESTORE    u64 bytes: after a reconnect, what this process still holds (reserved before the
 *                  arbiter restarted); charged without the limit check, at most once per
 *                  connection and before any MEM_RESERVE or MEM_RELEASE on it
 *   MEM_RESTORE r. as MEM_RESERVE reply (granted 1)
 *   PING           empty (needs no HELLO: the node agent's liveness probe)
 *   PING reply     empty
 *   ERROR          u32 code (FGS_ERR_*), str message
 */
#ifndef FASTGSHARE_PROTOCOL_H
#define FASTGSHARE_PROTOCOL_H

#define FGS_PROTOCOL_VERSION 1
#define FGS_HEADER_SIZE 12
#define FGS_MAX_FRAME 4096

#define FGS_MSG_HELLO 1
#define FGS_MSG_TOKEN 2
#define FGS_MSG_MEM_RESERVE 3
#define FGS_MSG_MEM_RELEASE 4
#define FGS_MSG_MEM_RESTORE 5
#define FGS_MSG_PING 6
#define FGS_MSG_ERROR 127
#define FGS_REPLY_BIT 128

#define FGS_ERR_BAD_FRAME 1
#define FGS_ERR_VERSION 2
#define FGS_ERR_UNKNOWN_CLIENT 3
#define FGS_ERR_NOT_REGISTERED 4
#define FGS_ERR_UNKNOWN_TYPE 5

#define FGS_ENV_ARBITER_SOCKET "FASTGSHARE_ARBITER_SOCKET"
#define FGS_ENV_POD "FASTGSHARE_POD"
#define FGS_ENV_GPU_UUID "FASTGSHARE_GPU_UUID"

#endif
