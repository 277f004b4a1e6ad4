/*
 * checksum.h — SHA-256 (FIPS 180-4) of bytes and of files, through
 * OpenSSL's libcrypto (EVP): the checksum each checkpoint file carries in
 * its index, computed while the file is written and checked before a load
 * reads it. Host memory only; digests print as 64 lowercase hex digits.
 */
#ifndef TS_BASE_CHECKSUM_H
#define TS_BASE_CHECKSUM_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Hex digits of a digest plus the NUL. */
#define TS_SHA256_HEX 65

/* A running SHA-256 (opaque; owned by its creator until ts_sha256_final). */
typedef struct ts_sha256 ts_sha256;

/* A new running digest; TS_ERR_OUT_OF_MEMORY or TS_ERR_INTERNAL (OpenSSL
 * refused) with *out NULL. */
ts_status ts_sha256_new(ts_sha256 **out);

/* Adds nbytes from data (host). */
void ts_sha256_update(ts_sha256 *h, const void *data, size_t nbytes);

/* Writes the digest of everything added as hex into hex (TS_SHA256_HEX
 * bytes) and frees h. NULL h is a no-op. */
void ts_sha256_final(ts_sha256 *h, char hex[TS_SHA256_HEX]);

/* The digest of nbytes of data (host) into hex: new, update, final in one
 * call. TS_ERR_OUT_OF_MEMORY, TS_ERR_INTERNAL (hex then ""). */
ts_status ts_sha256_bytes(const void *data, size_t nbytes, char hex[TS_SHA256_HEX]);

/* The digest of the whole file at path into hex, and its size in bytes
 * into *nbytes (NULL: not wanted). Reads 4 MiB at a time. TS_ERR_IO
 * ("PATH: cannot open: ..." / "PATH: read failed: ..."),
 * TS_ERR_OUT_OF_MEMORY. */
ts_status ts_sha256_file(const char *path, char hex[TS_SHA256_HEX], size_t *nbytes);

#ifdef __cplusplus
}
#endif

#endif /* TS_BASE_CHECKSUM_H */
