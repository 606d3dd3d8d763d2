#include "CMicroHTTPDShims.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <gnutls/gnutls.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

struct MHD_Daemon *cbroker_mhd_start(const cbroker_mhd_config *config) {
    struct MHD_OptionItem options[13];
    size_t n = 0;
    if (config->bind_address != NULL)
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, (void *)config->bind_address};
    if (config->thread_pool_size > 1)
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, config->thread_pool_size, NULL};
    if (config->connection_timeout > 0)
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, config->connection_timeout, NULL};
    if (config->connection_memory_limit > 0)
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)config->connection_memory_limit, NULL};
    if (config->connection_limit > 0)
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT, config->connection_limit, NULL};
    if (config->listen_backlog > 0)
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_LISTEN_BACKLOG_SIZE, config->listen_backlog, NULL};
    if (config->connection_notify != NULL)
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)config->connection_notify, config->connection_notify_cls};
    if (config->completed != NULL)
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)config->completed, config->completed_cls};
    if (config->tls_key_pem != NULL && config->tls_cert_pem != NULL) {
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)config->tls_key_pem};
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)config->tls_cert_pem};
    }
    options[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    _Static_assert(sizeof(options) / sizeof(options[0]) >= 11, "room for every option and the terminator");
    return MHD_start_daemon(config->flags, config->port, config->accept_policy, config->accept_policy_cls,
                            config->handler, config->handler_cls,
                            MHD_OPTION_ARRAY, options, MHD_OPTION_END);
}

uint16_t cbroker_mhd_bound_port(struct MHD_Daemon *daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info == NULL ? 0 : info->port;
}

int cbroker_mhd_connection_fd(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info == NULL ? -1 : (int)info->connect_fd;
}

int cbroker_mhd_client_address(struct MHD_Connection *connection, char *buffer, size_t length) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info == NULL || info->client_addr == NULL || length == 0) return -1;
    const struct sockaddr *sa = info->client_addr;
    const char *ok = NULL;
    if (sa->sa_family == AF_INET)
        ok = inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buffer, (socklen_t)length);
    else if (sa->sa_family == AF_INET6)
        ok = inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buffer, (socklen_t)length);
    return ok == NULL ? -1 : 0;
}

int cbroker_mhd_send_raw(struct MHD_Connection *connection, int tls, const void *data, size_t length, int timeout_ms) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info == NULL) return -1;
    const int fd = info->connect_fd;
    gnutls_session_t session = NULL;
    if (tls) {
        const union MHD_ConnectionInfo *tls_info =
            MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
        if (tls_info == NULL || tls_info->tls_session == NULL) return -1;
        session = (gnutls_session_t)tls_info->tls_session;
    }
    const char *next = data;
    size_t left = length;
    int waits = timeout_ms / 10 + 1;
    while (left > 0) {
        ssize_t sent;
        int again;
        if (session != NULL) {
            sent = gnutls_record_send(session, next, left);
            again = sent == GNUTLS_E_AGAIN || sent == GNUTLS_E_INTERRUPTED;
        } else {
            sent = send(fd, next, left, MSG_NOSIGNAL);
            again = sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
        }
        if (again) {
            // The socket is non-blocking (libmicrohttpd's); a small answer rarely waits. GnuTLS
            // takes a retry with the same arguments, as the loop makes it.
            if (--waits < 0) return -1;
            struct pollfd writable = {.fd = fd, .events = POLLOUT};
            (void)poll(&writable, 1, 10);
            continue;
        }
        if (sent <= 0) return -1;
        next += sent;
        left -= (size_t)sent;
    }
    return 0;
}
