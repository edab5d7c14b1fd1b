/* Authentication: HMAC challenge-response and token loading. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <conflux/status.h>

#include "control/auth.h"
#include "test/common/testutil.h"

static char tmpfile_path[64];

static void setup(void)
{
    unsetenv("CFX_TOKEN");
    unsetenv("CFX_TOKEN_FILE");
    tmpfile_path[0] = '\0';
}

static void teardown(void)
{
    if (tmpfile_path[0])
        unlink(tmpfile_path);
}

TestSuite(auth, .init = setup, .fini = teardown);

static void write_token_file(const char *content, size_t len)
{
    snprintf(tmpfile_path, sizeof(tmpfile_path), "/tmp/cfx-token-XXXXXX");
    int fd = mkstemp(tmpfile_path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, content, len), (ssize_t)len);
    close(fd);
    setenv("CFX_TOKEN_FILE", tmpfile_path, 1);
}

Test(auth, mac_verifies_with_the_same_token)
{
    uint8_t sn[CFX_AUTH_NONCE_LEN], cn[CFX_AUTH_NONCE_LEN], mac[CFX_AUTH_MAC_LEN];
    cr_assert_eq(cfx__auth_nonce(sn, sizeof(sn)), CFX_OK);
    cr_assert_eq(cfx__auth_nonce(cn, sizeof(cn)), CFX_OK);
    cr_assert_neq(memcmp(sn, cn, sizeof(sn)), 0, "two nonces are equal");
    cr_assert_eq(cfx__auth_mac("s3cret", CFX_AUTH_CLIENT, sn, cn, mac), CFX_OK);
    cr_assert_eq(cfx__auth_verify("s3cret", CFX_AUTH_CLIENT, sn, cn, mac), CFX_OK);
}

Test(auth, mac_is_hmac_sha256_of_label_and_nonces)
{
    /* Known-answer test against libcrypto's HMAC computed independently via
     * the openssl command-line tool would need a shell; instead check that
     * the MAC is deterministic and depends on every input. */
    uint8_t sn[CFX_AUTH_NONCE_LEN] = { 0 }, cn[CFX_AUTH_NONCE_LEN] = { 0 };
    uint8_t a[CFX_AUTH_MAC_LEN], b[CFX_AUTH_MAC_LEN];
    cr_assert_eq(cfx__auth_mac("k", CFX_AUTH_CLIENT, sn, cn, a), CFX_OK);
    cr_assert_eq(cfx__auth_mac("k", CFX_AUTH_CLIENT, sn, cn, b), CFX_OK);
    cr_assert_arr_eq(a, b, sizeof(a));
    cr_assert_eq(cfx__auth_mac("k", CFX_AUTH_COORD, sn, cn, b), CFX_OK);
    cr_assert_arr_neq(a, b, sizeof(a), "client and coordinator MACs must differ");
    sn[31] = 1;
    cr_assert_eq(cfx__auth_mac("k", CFX_AUTH_CLIENT, sn, cn, b), CFX_OK);
    cr_assert_arr_neq(a, b, sizeof(a));
    sn[31] = 0;
    cn[0] = 1;
    cr_assert_eq(cfx__auth_mac("k", CFX_AUTH_CLIENT, sn, cn, b), CFX_OK);
    cr_assert_arr_neq(a, b, sizeof(a));
}

/* The binding bytes are under the MAC: another role, another node id, or
 * the two node ids swapped (connector and acceptor) give another MAC. */
Test(auth, bound_mac_depends_on_the_binding)
{
    uint8_t sn[CFX_AUTH_NONCE_LEN] = { 0 }, cn[CFX_AUTH_NONCE_LEN] = { 0 };
    uint8_t a[CFX_AUTH_MAC_LEN], b[CFX_AUTH_MAC_LEN];
    uint8_t b12[CFX_AUTH_DP_BIND_LEN], b21[CFX_AUTH_DP_BIND_LEN], b13[CFX_AUTH_DP_BIND_LEN];
    uint8_t role0 = 0, role1 = 1;
    cfx__auth_dp_bind(1, 2, b12);
    cfx__auth_dp_bind(2, 1, b21);
    cfx__auth_dp_bind(1, 3, b13);
    cr_assert_eq(cfx__auth_mac_bound("k", CFX_AUTH_DP_CONNECT, sn, cn, b12, 8, a), CFX_OK);
    cr_assert_eq(cfx__auth_verify_bound("k", CFX_AUTH_DP_CONNECT, sn, cn, b12, 8, a), CFX_OK);
    cr_assert_eq(cfx__auth_verify_bound("k", CFX_AUTH_DP_CONNECT, sn, cn, b21, 8, a),
                 CFX_ERR_AUTH);
    cr_assert_eq(cfx__auth_verify_bound("k", CFX_AUTH_DP_CONNECT, sn, cn, b13, 8, a),
                 CFX_ERR_AUTH);
    cr_assert_eq(cfx__auth_verify_bound("k", CFX_AUTH_DP_ACCEPT, sn, cn, b12, 8, a),
                 CFX_ERR_AUTH);
    cr_assert_eq(cfx__auth_verify("k", CFX_AUTH_DP_CONNECT, sn, cn, a), CFX_ERR_AUTH);
    cr_assert_eq(cfx__auth_mac_bound("k", CFX_AUTH_CLIENT, sn, cn, &role0, 1, a), CFX_OK);
    cr_assert_eq(cfx__auth_mac_bound("k", CFX_AUTH_CLIENT, sn, cn, &role1, 1, b), CFX_OK);
    cr_assert_arr_neq(a, b, sizeof(a));
    /* little-endian, connector first */
    cr_assert_eq(b12[0], 1);
    cr_assert_eq(b12[4], 2);
    uint8_t big[CFX_AUTH_BIND_MAX + 1] = { 0 };
    cr_assert_eq(cfx__auth_mac_bound("k", CFX_AUTH_CLIENT, sn, cn, big, sizeof(big), a),
                 CFX_ERR_INVALID);
}

Test(auth, wrong_token_or_tampered_mac_is_refused)
{
    uint8_t sn[CFX_AUTH_NONCE_LEN], cn[CFX_AUTH_NONCE_LEN], mac[CFX_AUTH_MAC_LEN];
    cfx__auth_nonce(sn, sizeof(sn));
    cfx__auth_nonce(cn, sizeof(cn));
    cr_assert_eq(cfx__auth_mac("right", CFX_AUTH_CLIENT, sn, cn, mac), CFX_OK);
    cr_assert_eq(cfx__auth_verify("wrong", CFX_AUTH_CLIENT, sn, cn, mac), CFX_ERR_AUTH);
    cr_assert_eq(cfx__auth_verify("righ", CFX_AUTH_CLIENT, sn, cn, mac), CFX_ERR_AUTH);
    /* A client MAC replayed as the coordinator's proof. */
    cr_assert_eq(cfx__auth_verify("right", CFX_AUTH_COORD, sn, cn, mac), CFX_ERR_AUTH);
    /* Swapped nonces. */
    cr_assert_eq(cfx__auth_verify("right", CFX_AUTH_CLIENT, cn, sn, mac), CFX_ERR_AUTH);
    for (unsigned i = 0; i < CFX_AUTH_MAC_LEN; i += 5) {
        mac[i] ^= 0x01;
        cr_assert_eq(cfx__auth_verify("right", CFX_AUTH_CLIENT, sn, cn, mac), CFX_ERR_AUTH);
        mac[i] ^= 0x01;
    }
    cr_assert_eq(cfx__auth_verify("right", CFX_AUTH_CLIENT, sn, cn, mac), CFX_OK);
    /* The error detail never contains the token. */
    cfx__auth_verify("wrong", CFX_AUTH_CLIENT, sn, cn, mac);
    cr_assert_null(strstr(cfx_last_error(), "wrong"));
    cr_assert_null(strstr(cfx_last_error(), "right"));
    cr_assert_eq(cfx__auth_mac("", CFX_AUTH_CLIENT, sn, cn, mac), CFX_ERR_INVALID);
}

Test(auth, token_explicit_wins)
{
    char buf[64];
    setenv("CFX_TOKEN", "from-env", 1);
    cr_assert_eq(cfx__token_load("explicit", buf, sizeof(buf)), CFX_OK);
    cr_assert_str_eq(buf, "explicit");
}

Test(auth, token_from_env)
{
    char buf[64];
    setenv("CFX_TOKEN", "from-env", 1);
    write_token_file("from-file\n", 10);
    cr_assert_eq(cfx__token_load(NULL, buf, sizeof(buf)), CFX_OK);
    cr_assert_str_eq(buf, "from-env");
    cr_assert_eq(cfx__token_load("", buf, sizeof(buf)), CFX_OK);
    cr_assert_str_eq(buf, "from-env");
}

Test(auth, token_from_file_trims_newline)
{
    char buf[64];
    write_token_file("tok-123\n", 8);
    cr_assert_eq(cfx__token_load(NULL, buf, sizeof(buf)), CFX_OK);
    cr_assert_str_eq(buf, "tok-123");
    unlink(tmpfile_path);
    write_token_file("tok-crlf\r\nsecond line\n", 22);
    cr_assert_eq(cfx__token_load(NULL, buf, sizeof(buf)), CFX_OK);
    cr_assert_str_eq(buf, "tok-crlf");
    unlink(tmpfile_path);
    write_token_file("no-newline", 10);
    cr_assert_eq(cfx__token_load(NULL, buf, sizeof(buf)), CFX_OK);
    cr_assert_str_eq(buf, "no-newline");
}

Test(auth, token_missing_says_what_to_set)
{
    char buf[64];
    cr_assert_eq(cfx__token_load(NULL, buf, sizeof(buf)), CFX_ERR_AUTH);
    cr_assert(strstr(cfx_last_error(), "CFX_TOKEN"));
    cr_assert(strstr(cfx_last_error(), "CFX_TOKEN_FILE"));
    setenv("CFX_TOKEN_FILE", "/nonexistent/cfx-token", 1);
    cr_assert_eq(cfx__token_load(NULL, buf, sizeof(buf)), CFX_ERR_AUTH);
    cr_assert(strstr(cfx_last_error(), "cannot read the cluster token file "
                                       "CFX_TOKEN_FILE=/nonexistent/cfx-token: "),
              "%s", cfx_last_error());
    /* a path from elsewhere (a tool's --token-file) is named as its caller says */
    cr_assert_eq(cfx__token_load_file("/nonexistent/cfx-token", "/nonexistent/cfx-token", buf,
                                      sizeof(buf)), CFX_ERR_AUTH);
    cr_assert(strstr(cfx_last_error(), "cannot read the cluster token file "
                                       "/nonexistent/cfx-token: ") &&
              !strstr(cfx_last_error(), "CFX_TOKEN_FILE"), "%s", cfx_last_error());
    /* a directory opens but does not read: the reason is named too */
    cr_assert_eq(cfx__token_load_file("/", "/", buf, sizeof(buf)), CFX_ERR_AUTH);
    cr_assert(strstr(cfx_last_error(), "cannot read the cluster token file /: Is a directory"),
              "%s", cfx_last_error());
    write_token_file("\n", 1);
    cr_assert_eq(cfx__token_load(NULL, buf, sizeof(buf)), CFX_ERR_AUTH);
}

/*
 * A token file that group or others may read is said so: whoever reads it
 * joins the cluster.  One line a process (every context loads the token),
 * naming the file, who may read it, its mode and the remedy; a private file
 * says nothing, and the token is taken either way.
 */
Test(auth, token_file_open_to_others_is_said_once)
{
    char logpath[] = "/tmp/cfx-test-tokmode-XXXXXX";
    int logfd, saved = cfx_test_stderr_to(logpath, &logfd);
    char buf[64], want[256];
    write_token_file("tok-mode\n", 9); /* mkstemp: 0600 */
    cr_assert_eq(cfx__token_load(NULL, buf, sizeof(buf)), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(chmod(tmpfile_path, 0644), 0);
    for (int i = 0; i < 2; i++) {
        memset(buf, 0, sizeof(buf));
        cr_assert_eq(cfx__token_load(NULL, buf, sizeof(buf)), CFX_OK, "%s", cfx_last_error());
        cr_assert_str_eq(buf, "tok-mode");
    }
    cfx_test_stderr_back(saved);
    close(logfd);
    snprintf(want, sizeof(want), "the cluster token file CFX_TOKEN_FILE=%s is open to other "
             "users (mode 644): whoever reads it can join the cluster; chmod 600 it",
             tmpfile_path);
    int n = cfx_test_lines_with(logpath, "chmod 600");
    bool named = cfx_test_file_contains(logpath, want);
    unlink(logpath);
    cr_assert_eq(n, 1, "%d lines about the token file's mode, not 1", n);
    cr_assert(named, "no line '%s'", want);
}

Test(auth, token_too_long)
{
    char buf[8];
    cr_assert_eq(cfx__token_load("123456789", buf, sizeof(buf)), CFX_ERR_TOO_BIG);
    cr_assert_eq(cfx__token_load("1234567", buf, sizeof(buf)), CFX_OK);
    cr_assert_str_eq(buf, "1234567");
}
