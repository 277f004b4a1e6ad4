/* checksum.c — SHA-256 through OpenSSL's EVP interface (checksum.h). */
#include "base/checksum.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ts_sha256 {
  EVP_MD_CTX *ctx; /* OpenSSL's running digest */
};

ts_status ts_sha256_new(ts_sha256 **out) {
  *out = NULL;
  ts_sha256 *h = calloc(1, sizeof *h);
  if (!h) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "sha256: no memory for a digest");
  h->ctx = EVP_MD_CTX_new();
  if (!h->ctx || EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) != 1) {
    EVP_MD_CTX_free(h->ctx);
    free(h);
    return ts_set_error(TS_ERR_INTERNAL, "sha256: OpenSSL could not start a digest");
  }
  *out = h;
  return TS_OK;
}

void ts_sha256_update(ts_sha256 *h, const void *data, size_t nbytes) {
  if (nbytes) EVP_DigestUpdate(h->ctx, data, nbytes);
}

void ts_sha256_final(ts_sha256 *h, char hex[TS_SHA256_HEX]) {
  if (!h) return;
  unsigned char md[32];
  unsigned int n = 0;
  EVP_DigestFinal_ex(h->ctx, md, &n);
  for (unsigned i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
  hex[64] = '\0';
  EVP_MD_CTX_free(h->ctx);
  free(h);
}

ts_status ts_sha256_bytes(const void *data, size_t nbytes, char hex[TS_SHA256_HEX]) {
  ts_sha256 *h;
  hex[0] = '\0';
  TS_CHECK(ts_sha256_new(&h));
  ts_sha256_update(h, data, nbytes);
  ts_sha256_final(h, hex);
  return TS_OK;
}

ts_status ts_sha256_file(const char *path, char hex[TS_SHA256_HEX], size_t *nbytes) {
  FILE *f = fopen(path, "rb");
  if (!f) return ts_set_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  enum { PIECE = 4 << 20 };
  char *buf = malloc(PIECE);
  ts_sha256 *h = NULL;
  ts_status st = buf ? ts_sha256_new(&h)
                     : ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: no memory to read it", path);
  size_t total = 0, n;
  while (st == TS_OK && (n = fread(buf, 1, PIECE, f)) > 0) {
    ts_sha256_update(h, buf, n);
    total += n;
  }
  if (st == TS_OK && ferror(f)) st = ts_set_error(TS_ERR_IO, "%s: read failed: %s", path, strerror(errno));
  fclose(f);
  free(buf);
  if (st != TS_OK) {
    char dummy[TS_SHA256_HEX];
    ts_sha256_final(h, dummy);
    return st;
  }
  ts_sha256_final(h, hex);
  if (nbytes) *nbytes = total;
  return TS_OK;
}
