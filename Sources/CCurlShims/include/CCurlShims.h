/*
 * Non-variadic C entry points for libcurl's variadic functions (curl_easy_setopt,
 * curl_easy_getinfo), which Swift cannot call directly. Every symbol is prefixed `cbroker_curl_`.
 */
#ifndef CCURL_SHIMS_H
#define CCURL_SHIMS_H

#include <stdint.h>
#include <curl/curl.h>

CURLcode cbroker_curl_setopt_long(CURL *_Nonnull handle, CURLoption option, long value);
CURLcode cbroker_curl_setopt_ptr(CURL *_Nonnull handle, CURLoption option, void *_Nullable value);
CURLcode cbroker_curl_setopt_string(CURL *_Nonnull handle, CURLoption option, const char *_Nullable value);
CURLcode cbroker_curl_setopt_off_t(CURL *_Nonnull handle, CURLoption option, int64_t value);
CURLcode cbroker_curl_setopt_write_function(CURL *_Nonnull handle, CURLoption option,
    size_t (*_Nullable callback)(char *_Nonnull, size_t, size_t, void *_Nullable));
CURLcode cbroker_curl_getinfo_long(CURL *_Nonnull handle, CURLINFO info, long *_Nonnull value);

#endif
