/* redis_tls.c -- TLS for redis.c's connections: OpenSSL over memory BIOs.
 *
 * The socket stays redis.c's (a uv_tcp_t on the loop); OpenSSL only turns
 * bytes into bytes: what the server sent goes into the session's read BIO,
 * what OpenSSL has to send comes out of its write BIO into r->out, which
 * redis.c writes. Commands staged during a loop turn are encrypted together
 * (mj__tls_encrypt), so TLS adds no write to a turn.
 *
 * What is checked, always (there is no switch to turn it off): the server's
 * certificate chain against the CAs trusted (ca=, else the system's trust
 * store), and that the certificate is for r->servername (the URL's host by
 * default): a DNS name against its DNS names (no partial wildcards), an IP
 * address against its IP addresses. A server name is sent (SNI) unless it
 * is an IP address. TLS 1.2 at least. A server that does not answer in TLS
 * is never spoken to in plaintext.
 *
 * The client contexts (SSL_CTX: the CAs trusted, a client certificate and
 * its key) are made once per (ca, cert, key) and loop context, and reused by
 * every connection; one whose files changed on disk since (a certificate
 * renewed) is made again for the connections that follow. A file that cannot
 * be used is said at once, when a connection is asked for.
 *
 * A connection its owner closes ends its session with a close_notify (best
 * effort: written if the socket takes it at once).
 *
 * Renegotiation is refused (SSL_OP_NO_RENEGOTIATION: TLS 1.3 has none, and
 * a server asking for one mid-stream is answered with a no_renegotiation
 * alert; a server that then ends the connection is an ordinary connection
 * loss, reconnected as any other).
 *
 * Errors say what to do: a message that begins with "TLS: " is one a person
 * must act on (a file, a CA, a name, a certificate, a handshake the server
 * refuses); lua/moonjob/redis/client.lua tells them apart so. A session that
 * fails once up (a corrupt record, an alert) is an ordinary connection loss,
 * without that prefix.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "moonjob.h"

/* --------------------------------------------------- client contexts --- */

enum { CA, CERT, KEY, NFILES };
static const char *const file_option[NFILES] = {"ca", "cert", "key"};

typedef struct {
  mj_list_t link;                      /* on ctx->tls */
  SSL_CTX *ssl_ctx;
  char *paths[NFILES];                 /* as given; NULL: none */
  struct stat seen[NFILES];            /* the files when they were read */
} tls_context_t;

static int same_path(const char *a, const char *b) {
  return a == b || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static int unchanged(const char *path, const struct stat *seen) {
  struct stat now;
  if (path == NULL) return 1;
  if (stat(path, &now) != 0) return 0;
  return now.st_dev == seen->st_dev && now.st_ino == seen->st_ino && now.st_size == seen->st_size
         && now.st_mtim.tv_sec == seen->st_mtim.tv_sec && now.st_mtim.tv_nsec == seen->st_mtim.tv_nsec;
}

static void forget(tls_context_t *t) {
  mj__list_unlink(&t->link);
  SSL_CTX_free(t->ssl_ctx); /* connections keep their own reference */
  for (int i = 0; i < NFILES; i++) free(t->paths[i]);
  free(t);
}

/* The loop is closed: every connection is gone. */
void mj__tls_forget_all(mj_ctx_t *ctx) {
  MJ_LIST_EACH_SAFE(it, &ctx->tls) {
    forget(MJ_LIST_ITEM(it, tls_context_t, link));
  }
}

/* OpenSSL's reason for its last error, and its queue emptied. */
static const char *reason(char *buf, size_t n) {
  unsigned long e = ERR_peek_last_error();
  const char *text = e ? ERR_reason_error_string(e) : NULL;
  if (text != NULL) snprintf(buf, n, "%s", text);
  else if (e != 0) snprintf(buf, n, "OpenSSL error %lx", e);
  else snprintf(buf, n, "unknown error");
  ERR_clear_error();
  return buf;
}

/* The server asks for a client certificate and none was given: noted for
 * the message when it then ends the connection (TLS 1.3 finishes the
 * handshake first, and the server's refusal may come as a bare reset). */
static int no_certificate(SSL *ssl, X509 **cert, EVP_PKEY **key) {
  mj_redis_t *r = SSL_get_app_data(ssl);
  (void) cert, (void) key;
  if (r != NULL) r->tls_asked = 1;
  return 0;
}

/* A key with a passphrase: never asked for on a terminal (a worker has none). */
static int no_passphrase(char *buf, int size, int rwflag, void *data) {
  (void) buf, (void) size, (void) rwflag, (void) data;
  return 0;
}

/* Whether the option's file can be read at all (a ca= may be a hashed directory). */
static int readable(int which, const char *path, struct stat *st, char *why, size_t n) {
  int err = 0;
  if (stat(path, st) != 0) {
    err = errno;
  } else if (S_ISDIR(st->st_mode)) {
    if (which == CA) return 0;
    err = EISDIR;
  } else {
    FILE *f = fopen(path, "r");
    if (f == NULL) err = errno;
    else fclose(f);
  }
  if (err == 0) return 0;
  snprintf(why, n, "TLS: cannot read %s= file '%s': %s", file_option[which], path, strerror(err));
  return -1;
}

static int load_ca(SSL_CTX *c, const char *ca, const struct stat *st, char *why, size_t n) {
  char text[120];
  int ok = ca == NULL             ? SSL_CTX_set_default_verify_paths(c)
           : S_ISDIR(st->st_mode) ? SSL_CTX_load_verify_locations(c, NULL, ca)
                                  : SSL_CTX_load_verify_locations(c, ca, NULL);
  if (ok == 1) return 0;
  if (ca == NULL) snprintf(why, n, "TLS: cannot read the system's trust store: %s", reason(text, sizeof text));
  else snprintf(why, n, "TLS: ca= file '%s' holds no certificate OpenSSL can read (%s)", ca, reason(text, sizeof text));
  return -1;
}

static int load_client(SSL_CTX *c, const char *cert, const char *key, char *why, size_t n) {
  char text[120];
  if (SSL_CTX_use_certificate_chain_file(c, cert) != 1) {
    snprintf(why, n, "TLS: cert= file '%s' holds no certificate OpenSSL can read (%s)", cert, reason(text, sizeof text));
    return -1;
  }
  if (SSL_CTX_use_PrivateKey_file(c, key ? key : cert, SSL_FILETYPE_PEM) != 1) {
    if (key) snprintf(why, n, "TLS: key= file '%s' holds no private key OpenSSL can read (%s; a key with a"
                      " passphrase cannot be used)", key, reason(text, sizeof text));
    else snprintf(why, n, "TLS: cert= file '%s' holds no private key: give key=", cert);
    return -1;
  }
  if (SSL_CTX_check_private_key(c) != 1) {
    snprintf(why, n, "TLS: key= file '%s' is not the key of the certificate in cert= (%s)", key ? key : cert,
             reason(text, sizeof text));
    return -1;
  }
  return 0;
}

static SSL_CTX *make_context(const char *const paths[NFILES], const struct stat seen[NFILES], char *why, size_t n) {
  char text[120];
  ERR_clear_error();
  SSL_CTX *c = SSL_CTX_new(TLS_client_method());
  if (c == NULL) {
    snprintf(why, n, "TLS: cannot make a client context: %s", reason(text, sizeof text));
    return NULL;
  }
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION);
  /* a write OpenSSL could not do yet (WANT_READ) is tried again from a
   * buffer that may have moved (more commands staged meanwhile) */
  SSL_CTX_set_mode(c, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER, NULL);
  SSL_CTX_set_default_passwd_cb(c, no_passphrase);
  if (paths[CERT] == NULL) SSL_CTX_set_client_cert_cb(c, no_certificate);
  if (load_ca(c, paths[CA], &seen[CA], why, n) != 0
      || (paths[CERT] != NULL && load_client(c, paths[CERT], paths[KEY], why, n) != 0)) {
    SSL_CTX_free(c);
    return NULL;
  }
  return c;
}

/* The client context for o's files, made or found again; *out gets a
 * reference of its own. 0, or -1 with why. */
int mj__tls_context(mj_ctx_t *ctx, const mj_redis_tls_options_t *o, SSL_CTX **out, char *why, size_t n) {
  const char *paths[NFILES] = {o->ca, o->cert, o->key};
  MJ_LIST_EACH_SAFE(it, &ctx->tls) {
    tls_context_t *t = MJ_LIST_ITEM(it, tls_context_t, link);
    int same = 1, fresh = 1;
    for (int i = 0; i < NFILES; i++) {
      same = same && same_path(t->paths[i], paths[i]);
      fresh = fresh && unchanged(paths[i], &t->seen[i]);
    }
    if (!same) continue;
    if (fresh) {
      SSL_CTX_up_ref(t->ssl_ctx);
      *out = t->ssl_ctx;
      return 0;
    }
    forget(t); /* a file changed: read again below */
    break;
  }
  if (o->key != NULL && o->cert == NULL) {
    snprintf(why, n, "TLS: key= needs cert= (the client certificate whose key it is)");
    return -1;
  }
  struct stat seen[NFILES];
  memset(seen, 0, sizeof seen);
  for (int i = 0; i < NFILES; i++)
    if (paths[i] != NULL && readable(i, paths[i], &seen[i], why, n) != 0) return -1;
  tls_context_t *t = calloc(1, sizeof *t);
  SSL_CTX *c = t ? make_context(paths, seen, why, n) : NULL;
  if (c == NULL) {
    if (t == NULL) snprintf(why, n, "TLS: out of memory");
    free(t);
    return -1;
  }
  t->ssl_ctx = c;
  for (int i = 0; i < NFILES; i++) {
    t->paths[i] = paths[i] ? strdup(paths[i]) : NULL;
    t->seen[i] = seen[i];
  }
  mj__list_push(&ctx->tls, &t->link);
  SSL_CTX_up_ref(c);
  *out = c;
  return 0;
}

/* -------------------------------------------------------------- errors --- */

/* The server's certificate was refused: why, and what to check. */
static void verify_failed(mj_redis_t *r, long v, char *why, size_t n) {
  if (v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH)
    snprintf(why, n, "TLS: the server's certificate is not for '%.80s': give servername= the name it was"
             " issued to (by default the URL's host is checked)", r->servername);
  else
    snprintf(why, n, "TLS: certificate verify failed (%s): %s", X509_verify_cert_error_string(v),
             r->tls_ca ? "is ca= the CA that signed the server's certificate?"
                       : "the system's trust store has no CA that signed it: give its CA with ca= (or MOONJOB_REDIS_CA)");
}

static const char REQUIRED[] = "TLS: the server requires a client certificate: give cert= and key= (or"
                               " MOONJOB_REDIS_CERT and MOONJOB_REDIS_KEY)";

/* The socket ended (reset, closed) before any reply, on a session whose
 * server asked for the client certificate it was not given: that is why.
 * 1 with why written, else 0. */
int mj__tls_unwelcome(mj_redis_t *r, char *why, size_t n) {
  if (r->ssl == NULL || !r->tls_asked || r->tls_cert || r->replied) return 0;
  snprintf(why, n, "%s", REQUIRED);
  return 1;
}

static int refuses_certificate(int code) {
  return code == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE || code == SSL_R_TLSV1_ALERT_UNKNOWN_CA
         || code == SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN || code == SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE
         || code == SSL_R_TLSV1_ALERT_ACCESS_DENIED;
}

/* The session failed: down, saying why. The server's word on the client
 * certificate may come once the handshake ended (TLS 1.3), before any
 * reply; past that, a failure is the link's, not the settings'. */
static void failed(mj_redis_t *r, int ssl_error) {
  char why[sizeof r->why], text[120];
  unsigned long e = ERR_peek_last_error();
  long v = SSL_get_verify_result(r->ssl);
  int code = ERR_GET_REASON(e);
  int handshake = r->state == MJ_REDIS_CONNECTING, settings = handshake || !r->replied;
  reason(text, sizeof text);
  if (handshake && v != X509_V_OK) {
    verify_failed(r, v, why, sizeof why);
  } else if (settings && (code == SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED
                          || (!r->tls_cert && code == SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE))) {
    snprintf(why, sizeof why, "%s (%s)", REQUIRED, text);
  } else if (settings && r->tls_cert && refuses_certificate(code)) {
    snprintf(why, sizeof why, "TLS: the server refused our client certificate (%s): is cert= a client"
             " certificate signed by a CA the server trusts (its tls-ca-cert-file)?", text);
  } else if (handshake && ssl_error == SSL_ERROR_SSL) {
    snprintf(why, sizeof why, "TLS: %s", text);
  } else if (ssl_error == SSL_ERROR_SSL) {
    snprintf(why, sizeof why, "the TLS session failed: %s", text);
  } else {
    snprintf(why, sizeof why, "the TLS session failed (OpenSSL error %d: %s)", ssl_error, text);
  }
  mj__redis_fail(r, why);
}

/* The server's first bytes are no TLS record: a plaintext port. */
static void not_tls(mj_redis_t *r, const char *data, size_t len) {
  char shown[44], why[240];
  size_t k = 0;
  for (size_t i = 0; i < len && k < 40 && data[i] != '\r' && data[i] != '\n'; i++)
    shown[k++] = data[i] >= 0x20 && data[i] < 0x7f && data[i] != '"' ? data[i] : '?';
  shown[k] = '\0';
  snprintf(why, sizeof why, "TLS: the server did not answer in TLS (it sent \"%s\"): its port is a plaintext"
           " one? rediss:// is for a TLS port, redis:// for a plaintext one", shown);
  mj__redis_fail(r, why);
}

/* For the watchdog, after `ms` of connecting: why the handshake did not
 * end, in why; 0 when it had not begun. */
int mj__tls_silence(mj_redis_t *r, uint64_t ms, char *why, size_t n) {
  if (r->ssl == NULL) return 0;
  if (!r->tls_heard)
    snprintf(why, n, "the server did not answer in TLS within %llu ms: is its port a TLS port? (rediss:// is"
             " for a TLS port, redis:// for a plaintext one)", (unsigned long long) ms);
  else
    snprintf(why, n, "the TLS handshake did not end within %llu ms", (unsigned long long) ms);
  return 1;
}

/* ----------------------------------------------------------- sessions --- */

/* What OpenSSL has to send goes to r->out, read out of its write BIO (a
 * memory BIO's reset would clear its whole capacity, however little it
 * holds: after one big command, every small one would pay for it). 0, or
 * -1 (down). */
static int drain(mj_redis_t *r, const char **why) {
  BIO *wbio = SSL_get_wbio(r->ssl);
  size_t len;
  while ((len = BIO_ctrl_pending(wbio)) > 0) {
    int want = len < INT_MAX ? (int) len : INT_MAX;
    char *room = mj__redis_out_room(r, (size_t) want);
    int n = room != NULL ? BIO_read(wbio, room, want) : -1;
    if (n <= 0) {
      *why = room != NULL ? "cannot read OpenSSL's output" : "out of memory";
      return -1;
    }
    r->out_len += (size_t) n;
  }
  return 0;
}

static int take_output(mj_redis_t *r) {
  const char *why;
  if (drain(r, &why) == 0) return 0;
  mj__redis_fail(r, why);
  return -1;
}

static void handshake(mj_redis_t *r) {
  ERR_clear_error();
  int rc = SSL_do_handshake(r->ssl);
  int e = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(r->ssl, rc);
  if (take_output(r) != 0) return;
  mj__redis_send(r);
  if (r->state != MJ_REDIS_CONNECTING) return;
  if (rc == 1) mj__redis_up(r);
  else if (e != SSL_ERROR_WANT_READ) failed(r, e);
}

/* Connected: a session for the address, and its handshake begun. 0, or -1
 * with r->last_error. */
int mj__tls_start(mj_redis_t *r) {
  unsigned char ip[16];
  const char *name = r->servername;
  ERR_clear_error();
  SSL *ssl = SSL_new(r->tls);
  BIO *rbio = BIO_new(BIO_s_mem()), *wbio = BIO_new(BIO_s_mem());
  int ok = ssl != NULL && rbio != NULL && wbio != NULL;
  if (ok) {
    BIO_set_mem_eof_return(rbio, -1); /* empty: wait for more, not the end */
    SSL_set_bio(ssl, rbio, wbio);
    rbio = wbio = NULL;
    SSL_set_connect_state(ssl);
    if (inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1) {
      ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1;
    } else {
      SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      ok = SSL_set_tlsext_host_name(ssl, name) == 1 && SSL_set1_host(ssl, name) == 1;
    }
  }
  if (!ok) {
    char text[120];
    snprintf(r->last_error, sizeof r->last_error, "TLS: cannot start a session for '%.80s': %s", name,
             reason(text, sizeof text));
    BIO_free(rbio);
    BIO_free(wbio);
    SSL_free(ssl);
    return -1;
  }
  SSL_set_app_data(ssl, r);
  r->ssl = ssl;
  r->tls_heard = r->tls_asked = 0;
  handshake(r);
  return 0;
}

/* Decrypts what the session holds, and hands it to redis.c's reader. */
static void read_clear(mj_redis_t *r) {
  for (;;) {
    ERR_clear_error();
    int n = SSL_read(r->ssl, r->ctx->scratch, (int) sizeof r->ctx->scratch);
    if (n > 0) {
      mj__redis_feed(r, r->ctx->scratch, (size_t) n);
      if (r->state != MJ_REDIS_UP) return;
      continue;
    }
    int e = SSL_get_error(r->ssl, n);
    if (take_output(r) != 0) return; /* (a key update answered) */
    if (r->tls_blocked && r->state == MJ_REDIS_UP) (void) mj__tls_encrypt(r); /* the session went on */
    mj__redis_send(r);
    if (r->state != MJ_REDIS_UP || e == SSL_ERROR_WANT_READ) return;
    if (e == SSL_ERROR_ZERO_RETURN) mj__redis_fail(r, "Server closed the connection");
    else failed(r, e);
    return;
  }
}

/* Bytes from the socket (in the context's scratch buffer: copied into the
 * session before it is used again). */
void mj__tls_received(mj_redis_t *r, const char *data, size_t len) {
  if (r->ssl == NULL) return;
  if (!r->tls_heard) {
    r->tls_heard = 1;
    if (data[0] != 0x16 && data[0] != 0x15) { /* a handshake record, or an alert */
      not_tls(r, data, len);
      return;
    }
  }
  if (BIO_write(SSL_get_rbio(r->ssl), data, (int) len) != (int) len) {
    mj__redis_fail(r, "out of memory");
    return;
  }
  if (r->state == MJ_REDIS_CONNECTING) handshake(r);
  if (r->state == MJ_REDIS_UP) read_clear(r);
}

/* The commands staged, encrypted into r->out, a piece at a time (OpenSSL's
 * write BIO stays small). A session that must read first (WANT_READ)
 * keeps the rest in r->plain, encrypted once bytes came (read_clear).
 * 0, or -1 (down). */
int mj__tls_encrypt(mj_redis_t *r) {
  enum { PIECE = 256 * 1024 };
  size_t done = 0;
  if (r->ssl == NULL) return -1;
  r->tls_blocked = 0;
  while (done < r->plain_len) {
    size_t piece = r->plain_len - done < PIECE ? r->plain_len - done : PIECE;
    ERR_clear_error();
    int n = SSL_write(r->ssl, r->plain + done, (int) piece);
    int e = n > 0 ? SSL_ERROR_NONE : SSL_get_error(r->ssl, n);
    if (take_output(r) != 0) return -1;
    if (e == SSL_ERROR_WANT_READ) {
      r->tls_blocked = 1;
      break;
    }
    if (n <= 0) {
      failed(r, e);
      return -1;
    }
    done += (size_t) n;
  }
  if (done > 0 && done < r->plain_len) memmove(r->plain, r->plain + done, r->plain_len - done);
  r->plain_len -= done;
  return 0;
}

/* The owner closes a connection that was up: a close_notify alert, so that
 * the server sees an orderly end rather than a truncation; best effort,
 * written now if the socket takes it, never waited for. */
void mj__tls_goodbye(mj_redis_t *r) {
  const char *why;
  if (r->ssl == NULL || !SSL_is_init_finished(r->ssl) || !r->tcp_open) return; /* (after a failure: not) */
  ERR_clear_error();
  int rc = SSL_shutdown(r->ssl);
  ERR_clear_error();
  if (rc < 0 || drain(r, &why) != 0 || r->out_len == 0) return;
  uv_buf_t buf = uv_buf_init(r->out, (unsigned) (r->out_len < INT_MAX ? r->out_len : INT_MAX));
  (void) uv_try_write((uv_stream_t *) &r->tcp, &buf, 1); /* (fails while a write is in flight: so be it) */
}

/* The session ends (the next address is tried, or the connection is freed);
 * for good: the client context's reference too. */
void mj__tls_end(mj_redis_t *r, int for_good) {
  SSL_free(r->ssl);
  r->ssl = NULL;
  if (for_good && r->tls != NULL) {
    SSL_CTX_free(r->tls);
    r->tls = NULL;
  }
}
