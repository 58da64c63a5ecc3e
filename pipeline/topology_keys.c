/* CURVE keys for the topology (pipeline/topology.h): Z85 checks, secret key files and key
 * pairs, through libzmq (which holds the CURVE implementation the links use). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "pipeline/topology.h"
#include "seqflow/error.h"

/* ---- Z85 keys --------------------------------------------------------------------------------- */

static const char z85_alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

int sf_z85_key_check(const char *text, const char *what)
{
    if (!what) what = "key";
    if (!text) return sf_error(SF_E_INVAL, "%s: missing", what);
    size_t n = strlen(text);
    if (n != SF_Z85_KEY_LEN)
        return sf_error(SF_E_INVAL, "%s: a CURVE key is %d Z85 characters, not %zu", what, SF_Z85_KEY_LEN, n);
    for (size_t g = 0; g < n; g += 5) {
        uint64_t value = 0;
        for (size_t i = g; i < g + 5; i++) {
            const char *at = text[i] ? strchr(z85_alphabet, text[i]) : NULL;
            if (!at)
                return sf_error(SF_E_INVAL, "%s: character %zu ('%c') is not in the Z85 alphabet", what, i + 1,
                                text[i] >= 32 && text[i] < 127 ? text[i] : '?');
            value = value * 85 + (uint64_t)(at - z85_alphabet);
        }
        if (value > 0xFFFFFFFFu)
            return sf_error(SF_E_INVAL, "%s: characters %zu..%zu do not encode 4 bytes (not a Z85 key)", what, g + 1, g + 5);
    }
    return SF_OK;
}

int sf_topology_read_key(const char *path, char out[SF_Z85_KEY_LEN + 1])
{
    if (!path || !out) return sf_error(SF_E_INVAL, "sf_topology_read_key: NULL argument");
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sf_error(SF_E_IO, "key file %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return sf_error(SF_E_IO, "key file %s: %s", path, strerror(e));
    }
    if (sb.st_mode & 077) {
        close(fd);
        return sf_error(SF_E_IO, "key file %s can be read by others (mode %03o): a secret key must be private "
                                 "(chmod 600 %s)", path, (unsigned)(sb.st_mode & 0777), path);
    }
    char buf[SF_Z85_KEY_LEN + 64];
    ssize_t n = 0, got;
    while (n < (ssize_t)sizeof buf && (got = read(fd, buf + n, sizeof buf - (size_t)n)) != 0) {
        if (got < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            return sf_error(SF_E_IO, "key file %s: %s", path, strerror(e));
        }
        n += got;
    }
    close(fd);
    /* the key, then only whitespace (a newline) */
    ssize_t len = 0;
    while (len < n && buf[len] != ' ' && buf[len] != '\t' && buf[len] != '\n' && buf[len] != '\r') len++;
    for (ssize_t i = len; i < n; i++)
        if (buf[i] != ' ' && buf[i] != '\t' && buf[i] != '\n' && buf[i] != '\r')
            return sf_error(SF_E_INVAL, "key file %s: expected one Z85 key and nothing else", path);
    if (len > SF_Z85_KEY_LEN) return sf_error(SF_E_INVAL, "key file %s: a CURVE key is %d Z85 characters, not %zd", path,
                                              SF_Z85_KEY_LEN, len);
    char key[SF_Z85_KEY_LEN + 1];
    memcpy(key, buf, (size_t)len);
    key[len] = '\0';
    char what[300];
    snprintf(what, sizeof what, "key file %s", path);
    int rc = sf_z85_key_check(key, what);
    if (rc == SF_OK) memcpy(out, key, sizeof key);
    memset(buf, 0, sizeof buf);
    memset(key, 0, sizeof key);
    return rc;
}

int sf_curve_public_key(const char *secret, char out[SF_Z85_KEY_LEN + 1])
{
    int rc = sf_z85_key_check(secret, "secret key");
    if (rc != SF_OK) return rc;
    if (!zmq_has("curve")) return sf_error(SF_E_UNSUPPORTED, "this libzmq has no CURVE support");
    if (zmq_curve_public(out, secret) != 0)
        return sf_error(SF_E_INVAL, "secret key: %s", zmq_strerror(zmq_errno()));
    return SF_OK;
}

int sf_curve_keypair(char public_key[SF_Z85_KEY_LEN + 1], char secret_key[SF_Z85_KEY_LEN + 1])
{
    if (!zmq_has("curve")) return sf_error(SF_E_UNSUPPORTED, "this libzmq has no CURVE support");
    if (zmq_curve_keypair(public_key, secret_key) != 0)
        return sf_error(SF_E_UNSUPPORTED, "making a CURVE key pair: %s", zmq_strerror(zmq_errno()));
    return SF_OK;
}
