/*
 * Non-variadic C entry points for libmicrohttpd's variadic functions, which Swift cannot
 * call directly ("Variadic function is unavailable"). Every symbol is prefixed `cbroker_mhd_`.
 */
#ifndef CMICROHTTPD_SHIMS_H
#define CMICROHTTPD_SHIMS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <microhttpd.h>

/// Everything `cbroker_mhd_start` passes to `MHD_start_daemon`.
typedef struct {
    unsigned int flags;
    uint16_t port;
    /// Address to bind; NULL binds every interface on `port`.
    const struct sockaddr *_Nullable bind_address;
    /// 0 means no thread pool (one polling thread).
    unsigned int thread_pool_size;
    /// Seconds of inactivity before a connection is closed; 0 = never.
    unsigned int connection_timeout;
    /// Per-connection memory for headers and buffering; 0 = MHD default.
    size_t connection_memory_limit;
    /// Maximum concurrent connections; 0 = MHD default.
    unsigned int connection_limit;
    /// listen(2) backlog; 0 = MHD default.
    unsigned int listen_backlog;
    /// Asked before a connection is accepted (the per-address cap, IPv6 per /64); may be NULL.
    MHD_AcceptPolicyCallback _Nullable accept_policy;
    void *_Nullable accept_policy_cls;
    MHD_AccessHandlerCallback _Nonnull handler;
    void *_Nullable handler_cls;
    MHD_RequestCompletedCallback _Nullable completed;
    void *_Nullable completed_cls;
    /// Called when a connection opens and closes (MHD_OPTION_NOTIFY_CONNECTION); may be NULL.
    MHD_NotifyConnectionCallback _Nullable connection_notify;
    void *_Nullable connection_notify_cls;
    /// PEM strings for TLS; both NULL for plain HTTP.
    const char *_Nullable tls_key_pem;
    const char *_Nullable tls_cert_pem;
} cbroker_mhd_config;

/// Starts a daemon; NULL on failure (errno may say why).
struct MHD_Daemon *_Nullable cbroker_mhd_start(const cbroker_mhd_config *_Nonnull config);

/// The port the daemon listens on (useful after binding port 0), or 0.
uint16_t cbroker_mhd_bound_port(struct MHD_Daemon *_Nonnull daemon);

/// Writes the client's IP address as text into `buffer`; returns 0 on success.
int cbroker_mhd_client_address(struct MHD_Connection *_Nonnull connection, char *_Nonnull buffer, size_t length);

/// The socket of a connection, or -1.
int cbroker_mhd_connection_fd(struct MHD_Connection *_Nonnull connection);

/// Writes a whole serialized response on the connection's socket (through its GnuTLS session
/// when `tls` is set), waiting at most `timeout_ms` for room; returns 0 when all was written.
/// For an answer libmicrohttpd cannot queue: it refuses a response while a body is arriving
/// (MHD_queue_response wants HEADERS_PROCESSED or FULL_REQ_RECEIVED). Call only from the
/// connection's own access handler, then return MHD_NO so that libmicrohttpd closes it.
int cbroker_mhd_send_raw(struct MHD_Connection *_Nonnull connection, int tls, const void *_Nonnull data, size_t length,
                         int timeout_ms);

#endif
