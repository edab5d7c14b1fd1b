/* dataplane/common/util.c: size and address parsing, environment helpers. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/common/util.h"

static void clear_error(void)
{
    cfx__err_clear();
}

TestSuite(util, .init = clear_error);

/* ---- cfx__parse_size ------------------------------------------------------- */

Test(util, parse_size_plain_and_suffixes)
{
    static const struct {
        const char *in;
        size_t want;
    } ok[] = {
        { "0", 0 },
        { "1", 1 },
        { "4096", 4096 },
        { "4k", 4096 },
        { "4K", 4096 },
        { "4KB", 4096 },
        { "4KiB", 4096 },
        { "4kib", 4096 },
        { "64m", 64ull << 20 },
        { "256M", 256ull << 20 },
        { "2G", 2ull << 30 },
        { "1GiB", 1ull << 30 },
        { "18446744073709551615", (size_t)18446744073709551615ull },
    };

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        size_t v = 12345;
        cr_assert_eq(cfx__parse_size(ok[i].in, &v), CFX_OK, "'%s' rejected", ok[i].in);
        cr_assert_eq(v, ok[i].want, "'%s' -> %zu, want %zu", ok[i].in, v, ok[i].want);
    }
}

Test(util, parse_size_rejects_garbage)
{
    static const char *const bad[] = {
        "",
        "-1",
        "-0",
        "abc",
        "K",
        "4X",
        "4KK",
        "4MG",
        "1.5M",
        "4 K",
        "4K ",
        "0x10",
        "18446744073709551616", /* 2^64 */
        "17179869184G",         /* 2^34 GiB = 2^64 */
        "18014398509481984K",   /* 2^54 KiB = 2^64 */
        " -1",                  /* strtoull skips space and takes a sign */
        "+5",
        " 4K",
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t v = 777;
        cr_assert_eq(cfx__parse_size(bad[i], &v), CFX_ERR_INVALID, "'%s' accepted", bad[i]);
        cr_assert_eq(v, 777, "'%s' wrote the result on failure", bad[i]);
    }
    size_t v;
    cr_assert_eq(cfx__parse_size(NULL, &v), CFX_ERR_INVALID);
}

Test(util, parse_size_largest_shifted)
{
    size_t v;
    /* The largest value that still fits after the shift. */
    cr_assert_eq(cfx__parse_size("17179869183G", &v), CFX_OK);
    cr_assert_eq(v, 17179869183ull << 30);
}

/* ---- cfx__parse_hostport ------------------------------------------------------ */

Test(util, parse_hostport_ipv4)
{
    struct sockaddr_in sa;

    memset(&sa, 0xff, sizeof(sa));
    cr_assert_eq(cfx__parse_hostport("127.0.0.1:4321", &sa), CFX_OK);
    cr_assert_eq(sa.sin_family, AF_INET);
    cr_assert_eq(ntohs(sa.sin_port), 4321);
    cr_assert_eq(ntohl(sa.sin_addr.s_addr), 0x7f000001u);

    cr_assert_eq(cfx__parse_hostport("10.1.2.3:1", &sa), CFX_OK);
    cr_assert_eq(ntohs(sa.sin_port), 1);
    cr_assert_eq(ntohl(sa.sin_addr.s_addr), 0x0a010203u);

    cr_assert_eq(cfx__parse_hostport("0.0.0.0:65535", &sa), CFX_OK);
    cr_assert_eq(ntohs(sa.sin_port), 65535);
    cr_assert_eq(sa.sin_addr.s_addr, htonl(INADDR_ANY));
}

Test(util, parse_hostport_name)
{
    struct sockaddr_in sa;

    /* localhost comes from /etc/hosts, no DNS needed. */
    cr_assert_eq(cfx__parse_hostport("localhost:80", &sa), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(sa.sin_family, AF_INET);
    cr_assert_eq(ntohs(sa.sin_port), 80);
    cr_assert_eq(ntohl(sa.sin_addr.s_addr) >> 24, 127);
}

Test(util, parse_hostport_rejects_garbage)
{
    static const char *const bad[] = {
        "",
        "127.0.0.1",
        ":80",
        "127.0.0.1:",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "127.0.0.1:-1",
        "127.0.0.1:80x",
        "127.0.0.1: 80x",
        "127.0.0.1:99999999999999999999",
        "127.0.0.1:+80", /* the tools refuse a sign or a blank: so does the library */
        "127.0.0.1: 80",
    };
    struct sockaddr_in sa;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cfx__err_clear();
        cr_assert_eq(cfx__parse_hostport(bad[i], &sa), CFX_ERR_INVALID, "'%s' accepted", bad[i]);
        cr_assert_neq(cfx_last_error()[0], '\0', "'%s' left no error detail", bad[i]);
    }
    cr_assert_eq(cfx__parse_hostport(NULL, &sa), CFX_ERR_INVALID);
}

Test(util, parse_hostport_says_ipv6_is_not_supported)
{
    static const char *const v6[] = { "[::1]:5000", "::1:5000", "[fe80::1%eth0]:80" };
    struct sockaddr_in sa;

    for (size_t i = 0; i < sizeof(v6) / sizeof(v6[0]); i++) {
        cfx__err_clear();
        cr_assert_eq(cfx__parse_hostport(v6[i], &sa), CFX_ERR_INVALID, "'%s' accepted", v6[i]);
        cr_assert(strstr(cfx_last_error(), "IPv6 is not supported"), "'%s': %s", v6[i],
                  cfx_last_error());
    }
}

/* A second colon is a typo, not IPv6: it was answered "IPv6 is not
 * supported" (a new user's trial, CFX_COORD=127.0.0.1:41455:1). */
Test(util, parse_hostport_a_typo_is_not_ipv6)
{
    struct sockaddr_in sa;

    cr_assert_eq(cfx__parse_hostport("127.0.0.1:5000:1", &sa), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "'127.0.0.1:5000:1' is not host:port"), "%s",
              cfx_last_error());
    cr_assert(!strstr(cfx_last_error(), "IPv6"), "%s", cfx_last_error());
}

Test(util, parse_hostport_names_the_address)
{
    struct sockaddr_in sa;

    cr_assert_eq(cfx__parse_hostport("127.0.0.1:70000", &sa), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "127.0.0.1:70000"), "detail: '%s'", cfx_last_error());
}

Test(util, parse_hostport_host_too_long)
{
    char s[400];
    struct sockaddr_in sa;

    memset(s, 'a', 300);
    strcpy(s + 300, ":80");
    cr_assert_eq(cfx__parse_hostport(s, &sa), CFX_ERR_INVALID);
}

/* ---- environment helpers ------------------------------------------------------ */
/* Criterion runs each test in its own process, so setenv() does not leak. */

Test(util, env_str)
{
    unsetenv("CFX_TEST_STR");
    cr_assert_str_eq(cfx__env_str("CFX_TEST_STR", "dflt"), "dflt");
    cr_assert_null(cfx__env_str("CFX_TEST_STR", NULL));
    setenv("CFX_TEST_STR", "", 1);
    cr_assert_str_eq(cfx__env_str("CFX_TEST_STR", "dflt"), "dflt", "empty counts as unset");
    setenv("CFX_TEST_STR", "shm,tcp", 1);
    cr_assert_str_eq(cfx__env_str("CFX_TEST_STR", "dflt"), "shm,tcp");
}

Test(util, env_ll)
{
    unsetenv("CFX_TEST_LL");
    cr_assert_eq(cfx__env_ll("CFX_TEST_LL", 5), 5);
    setenv("CFX_TEST_LL", "42", 1);
    cr_assert_eq(cfx__env_ll("CFX_TEST_LL", 5), 42);
    setenv("CFX_TEST_LL", "-7", 1);
    cr_assert_eq(cfx__env_ll("CFX_TEST_LL", 5), -7);
    setenv("CFX_TEST_LL", "", 1);
    cr_assert_eq(cfx__env_ll("CFX_TEST_LL", 5), 5);
    /* Malformed values warn and fall back to the default. */
    setenv("CFX_TEST_LL", "12abc", 1);
    cr_assert_eq(cfx__env_ll("CFX_TEST_LL", 5), 5);
    setenv("CFX_TEST_LL", "abc", 1);
    cr_assert_eq(cfx__env_ll("CFX_TEST_LL", 5), 5);
    setenv("CFX_TEST_LL", "99999999999999999999", 1);
    cr_assert_eq(cfx__env_ll("CFX_TEST_LL", 5), 5);
}

Test(util, env_size)
{
    unsetenv("CFX_TEST_SIZE");
    cr_assert_eq(cfx__env_size("CFX_TEST_SIZE", 100), 100);
    setenv("CFX_TEST_SIZE", "4M", 1);
    cr_assert_eq(cfx__env_size("CFX_TEST_SIZE", 100), 4u << 20);
    setenv("CFX_TEST_SIZE", "512k", 1);
    cr_assert_eq(cfx__env_size("CFX_TEST_SIZE", 100), 512u << 10);
    setenv("CFX_TEST_SIZE", "", 1);
    cr_assert_eq(cfx__env_size("CFX_TEST_SIZE", 100), 100);
    setenv("CFX_TEST_SIZE", "lots", 1);
    cr_assert_eq(cfx__env_size("CFX_TEST_SIZE", 100), 100);
    setenv("CFX_TEST_SIZE", "-1", 1);
    cr_assert_eq(cfx__env_size("CFX_TEST_SIZE", 100), 100);
}

/* a bounded size or count: past a bound it is brought to that bound, a
 * negative one to the lower (it was "not a size", and the default taken) */
Test(util, env_size_clamp)
{
    setenv("CFX_TEST_SIZE", "-5", 1);
    cr_assert_eq(cfx__env_size_clamp("CFX_TEST_SIZE", 100, 2, 1000), 2);
    setenv("CFX_TEST_SIZE", "-4K", 1);
    cr_assert_eq(cfx__env_size_clamp("CFX_TEST_SIZE", 100, 0, 1000), 0);
    setenv("CFX_TEST_SIZE", "1K", 1);
    cr_assert_eq(cfx__env_size_clamp("CFX_TEST_SIZE", 100, 0, 1000), 1000);
    setenv("CFX_TEST_SIZE", "1", 1);
    cr_assert_eq(cfx__env_size_clamp("CFX_TEST_SIZE", 100, 2, 1000), 2);
    setenv("CFX_TEST_SIZE", "500", 1);
    cr_assert_eq(cfx__env_size_clamp("CFX_TEST_SIZE", 100, 2, 1000), 500);
    setenv("CFX_TEST_SIZE", "-lots", 1);
    cr_assert_eq(cfx__env_size_clamp("CFX_TEST_SIZE", 100, 2, 1000), 100);
    unsetenv("CFX_TEST_SIZE");
}

/* ---- time helpers ----------------------------------------------------------------- */

Test(util, deadlines)
{
    cr_assert_eq(cfx__deadline_ns(-1), UINT64_MAX);
    cr_assert_eq(cfx__ms_left(UINT64_MAX), -1);
    cr_assert_eq(cfx__ms_left(0), 0);
    /* what is left is 1000 ms less the time that passed, however long a
     * loaded machine took between the two calls */
    uint64_t t0 = cfx__now_ns();
    uint64_t d = cfx__deadline_ns(1000);
    int left = cfx__ms_left(d);
    int passed = (int)((cfx__now_ns() - t0) / 1000000u);
    cr_assert(left <= 1000 && left >= 1000 - passed - 1, "left %d after %d ms", left, passed);
    uint64_t a = cfx__now_ns(), b = cfx__now_ns();
    cr_assert_geq(b, a);
}
