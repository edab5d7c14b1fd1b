/* Sealed records (control/seal.h): keys per connection, AES-256-GCM records. */
#include <criterion/criterion.h>

#include <string.h>

#include <conflux/status.h>

#include "control/seal.h"

static const uint8_t salt[64] = { 1, 2, 3, 4, 5, 6, 7, 8 };
static const uint8_t info[9] = { 0x10, 0, 0, 0, 0x20, 0, 0, 0, CFX_SEAL_ENCRYPT };

struct pair {
    struct cfx_seal_dir tx, rx;
};

static void pair_init(struct pair *p, int mode, const char *token, int dir)
{
    struct cfx_seal_keys k;
    cr_assert_eq(cfx__seal_derive(token, "conflux-v1 test seal", salt, sizeof(salt), info,
                                  sizeof(info), &k),
                 CFX_OK);
    cr_assert_eq(cfx__seal_dir_init(&p->tx, mode, &k, dir, true), CFX_OK);
    cr_assert_eq(cfx__seal_dir_init(&p->rx, mode, &k, dir, false), CFX_OK);
    cfx__seal_keys_cleanse(&k);
}

static void pair_fini(struct pair *p)
{
    cfx__seal_dir_fini(&p->tx);
    cfx__seal_dir_fini(&p->rx);
}

static void fill(uint8_t *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
}

/* Seal @p n bytes given as two iovecs; open; bytes back byte for byte. */
static void roundtrip(int mode)
{
    struct pair p;
    uint8_t in[5000], ct[5000], out[5000], tag[CFX_SEAL_TAG_LEN];
    uint32_t aad = 0x1234;

    pair_init(&p, mode, "0123456789abcdef0123456789abcdef", CFX_SEAL_DIR_CONNECTOR);
    for (unsigned r = 0; r < 4; r++) {
        fill(in, sizeof(in), r);
        struct iovec iov[2] = { { in, 1000 }, { in + 1000, sizeof(in) - 1000 } };
        cr_assert_eq(cfx__seal(&p.tx, &aad, sizeof(aad), iov, 2, ct, tag), CFX_OK);
        if (mode == CFX_SEAL_ENCRYPT)
            cr_assert_neq(memcmp(ct, in, sizeof(in)), 0, "encrypted bytes equal the clear ones");
        else
            cr_assert_eq(memcmp(ct, in, sizeof(in)), 0, "integrity mode changed the bytes");
        cr_assert_eq(cfx__seal_open(&p.rx, &aad, sizeof(aad), ct, sizeof(ct), out, tag), CFX_OK);
        cr_assert_eq(memcmp(out, in, sizeof(in)), 0, "record %u not opened byte for byte", r);
    }
    /* in place */
    fill(in, sizeof(in), 9);
    memcpy(out, in, sizeof(in));
    struct iovec one = { out, sizeof(out) };
    cr_assert_eq(cfx__seal(&p.tx, NULL, 0, &one, 1, out, tag), CFX_OK);
    cr_assert_eq(cfx__seal_open(&p.rx, NULL, 0, out, sizeof(out), out, tag), CFX_OK);
    cr_assert_eq(memcmp(out, in, sizeof(in)), 0);
    pair_fini(&p);
}

Test(seal, roundtrip_encrypt) { roundtrip(CFX_SEAL_ENCRYPT); }
Test(seal, roundtrip_integrity) { roundtrip(CFX_SEAL_INTEGRITY); }

/* Every kind of tampering is CFX_ERR_AUTH, in both modes. */
static void tamper(int mode)
{
    uint8_t in[256], ct[256], out[256], tag[CFX_SEAL_TAG_LEN], t2[CFX_SEAL_TAG_LEN];
    uint32_t aad = 77, bad_aad = 78;
    fill(in, sizeof(in), 3);
    struct iovec iov = { in, sizeof(in) };

    for (int what = 0; what < 5; what++) {
        struct pair p;
        pair_init(&p, mode, "0123456789abcdef0123456789abcdef", CFX_SEAL_DIR_ACCEPTOR);
        cr_assert_eq(cfx__seal(&p.tx, &aad, sizeof(aad), &iov, 1, ct, tag), CFX_OK);
        memcpy(t2, tag, sizeof(t2));
        const void *a = &aad;
        switch (what) {
        case 0: ct[100] ^= 0x01; break;    /* a payload bit */
        case 1: a = &bad_aad; break;       /* the header under the tag */
        case 2: t2[15] ^= 0x80; break;     /* the tag */
        case 3: p.rx.seq = 1; break;       /* opened as another record (reorder, replay) */
        case 4: break;                     /* checked below: the same record twice */
        }
        int rc = cfx__seal_open(&p.rx, a, sizeof(aad), ct, sizeof(ct), out, t2);
        if (what == 4) {
            cr_assert_eq(rc, CFX_OK);
            p.rx.seq = 1;
            rc = cfx__seal_open(&p.rx, a, sizeof(aad), ct, sizeof(ct), out, t2);
        }
        cr_assert_eq(rc, CFX_ERR_AUTH, "tampering %d (mode %d) gave %s", what, mode,
                     cfx_errname(rc));
        pair_fini(&p);
    }
}

Test(seal, tampering_fails_encrypt) { tamper(CFX_SEAL_ENCRYPT); }
Test(seal, tampering_fails_integrity) { tamper(CFX_SEAL_INTEGRITY); }

/* Another token, another salt or binding, the other direction: the record
 * does not open. */
Test(seal, keys_depend_on_token_nonces_binding_and_direction)
{
    struct cfx_seal_keys k[5];
    uint8_t salt2[64], info2[sizeof(info)];
    memcpy(salt2, salt, sizeof(salt2));
    salt2[63] ^= 1;
    memcpy(info2, info, sizeof(info2));
    info2[8] = CFX_SEAL_INTEGRITY;

    const char *tok = "0123456789abcdef0123456789abcdef";
    cr_assert_eq(cfx__seal_derive(tok, "l", salt, 64, info, 9, &k[0]), CFX_OK);
    cr_assert_eq(cfx__seal_derive("0123456789abcdef0123456789abcdeF", "l", salt, 64, info, 9,
                                  &k[1]), CFX_OK);
    cr_assert_eq(cfx__seal_derive(tok, "l", salt2, 64, info, 9, &k[2]), CFX_OK);
    cr_assert_eq(cfx__seal_derive(tok, "l", salt, 64, info2, 9, &k[3]), CFX_OK);
    cr_assert_eq(cfx__seal_derive(tok, "m", salt, 64, info, 9, &k[4]), CFX_OK);
    for (int i = 1; i < 5; i++)
        cr_assert_neq(memcmp(&k[0], &k[i], sizeof(k[0])), 0, "derivation %d gave the same keys",
                      i);
    cr_assert_neq(memcmp(k[0].key[0], k[0].key[1], CFX_SEAL_KEY_LEN), 0);

    uint8_t in[64] = { 5 }, ct[64], out[64], tag[CFX_SEAL_TAG_LEN];
    struct iovec iov = { in, sizeof(in) };
    for (int i = 0; i < 6; i++) {
        struct cfx_seal_dir tx, rx;
        cr_assert_eq(cfx__seal_dir_init(&tx, CFX_SEAL_ENCRYPT, &k[0], 0, true), CFX_OK);
        /* i == 5: the other direction of the same keys */
        cr_assert_eq(cfx__seal_dir_init(&rx, CFX_SEAL_ENCRYPT, &k[i == 5 ? 0 : i], i == 5, false),
                     CFX_OK);
        cr_assert_eq(cfx__seal(&tx, NULL, 0, &iov, 1, ct, tag), CFX_OK);
        int rc = cfx__seal_open(&rx, NULL, 0, ct, sizeof(ct), out, tag);
        cr_assert_eq(rc, i == 0 ? CFX_OK : CFX_ERR_AUTH, "keys %d: %s", i, cfx_errname(rc));
        cfx__seal_dir_fini(&tx);
        cfx__seal_dir_fini(&rx);
    }
    cr_assert_eq(cfx__seal_derive("", "l", salt, 64, info, 9, &k[0]), CFX_ERR_INVALID);
}

Test(seal, spent_counter_refuses_to_seal)
{
    struct pair p;
    uint8_t b[8] = { 0 }, tag[CFX_SEAL_TAG_LEN];
    struct iovec iov = { b, sizeof(b) };
    pair_init(&p, CFX_SEAL_ENCRYPT, "tok", 0);
    p.tx.seq = UINT64_MAX;
    cr_assert_eq(cfx__seal(&p.tx, NULL, 0, &iov, 1, b, tag), CFX_ERR_TOO_BIG);
    pair_fini(&p);
}

Test(seal, mode_parse)
{
    static const struct {
        const char *s;
        int mode;
    } ok[] = { { NULL, CFX_SEAL_OFF },      { "", CFX_SEAL_OFF },
               { "0", CFX_SEAL_OFF },       { "off", CFX_SEAL_OFF },
               { "1", CFX_SEAL_ENCRYPT },   { "on", CFX_SEAL_ENCRYPT },
               { "encrypt", CFX_SEAL_ENCRYPT }, { "integrity", CFX_SEAL_INTEGRITY } };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        int m = -1;
        cr_assert_eq(cfx__seal_mode_parse(ok[i].s, &m), CFX_OK);
        cr_assert_eq(m, ok[i].mode, "%s", ok[i].s ? ok[i].s : "(unset)");
    }
    int m;
    cr_assert_eq(cfx__seal_mode_parse("2", &m), CFX_ERR_INVALID);
    cr_assert_eq(cfx__seal_mode_parse("tls", &m), CFX_ERR_INVALID);
}
