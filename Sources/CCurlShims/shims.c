#include "CCurlShims.h"

CURLcode cbroker_curl_setopt_long(CURL *handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}
CURLcode cbroker_curl_setopt_ptr(CURL *handle, CURLoption option, void *value) {
    return curl_easy_setopt(handle, option, value);
}
CURLcode cbroker_curl_setopt_string(CURL *handle, CURLoption option, const char *value) {
    return curl_easy_setopt(handle, option, value);
}
CURLcode cbroker_curl_setopt_off_t(CURL *handle, CURLoption option, int64_t value) {
    return curl_easy_setopt(handle, option, (curl_off_t)value);
}
CURLcode cbroker_curl_setopt_write_function(CURL *handle, CURLoption option,
                                            size_t (*callback)(char *, size_t, size_t, void *)) {
    return curl_easy_setopt(handle, option, callback);
}
CURLcode cbroker_curl_getinfo_long(CURL *handle, CURLINFO info, long *value) {
    return curl_easy_getinfo(handle, info, value);
}
