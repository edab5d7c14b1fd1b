/*
 * Load distribution: the scheduler's decision, a pure function of the
 * measured service time per byte of each server and the block sizes.
 *
 * Capacity c_s = 1 / ns_per_byte_s (unknown servers get the median of the
 * known ones).  Server s's predicted time for a step is T_s = L_s / c_s, with
 * L_s the bytes it owns; the step takes max_s T_s.  The decision:
 *
 *  1. blocks on servers that are not ACTIVE (draining, standby) move to the
 *     active server whose T would grow least; a server that is gone (its
 *     mailbox failed) or FAILED takes no block, and keeps its own until it
 *     is removed;
 *  2. exploration: every active server keeps at least max(1 block,
 *     explore * total / active) bytes, taken from the server with the
 *     largest T, so a demoted server keeps being measured and can win
 *     blocks back once it recovers;
 *  3. greedy: take the server with the largest T and move one of its blocks
 *     to the server where it lands with the smallest resulting T, as long as
 *     that lowers the larger of the two times; repeat.  This converges to
 *     shares proportional to capacity, within one block;
 *  4. hysteresis: unless forced (or step 1 moved blocks), keep the old map
 *     when the predicted max drops by less than min_gain.
 *
 * A server whose time per byte exceeds straggler_factor times the median is
 * flagged as a straggler (reported, and the reason its share shrinks).
 *
 * A server that is gone or FAILED serves nothing: its blocks, which it
 * keeps, are out of the measurement (neither its stale time per byte in
 * the median nor their predicted time in the step's), so the survivors'
 * shares follow their own speeds alone, and a decision waits for no
 * traffic to it (cfx__ps_balance_unmeasured).
 *
 * A block whose values were lost (in->lost: moved off a failed server) is
 * served by nobody either: every request for it fails at once, and failed
 * requests are not measured.  It is out of the measurement wherever it
 * is: it counts in no server's load, a decision waits for no traffic to
 * it (a live server that owns nothing else held every decision: it now
 * counts as owning nothing), and it moves only off a server that drains.
 */
#include "ps_int.h"

#include <stdlib.h>
#include <string.h>

void cfx__ps_balance_defaults(struct cfx_ps_balance *k)
{
    k->enabled = 1;
    k->interval_ms = 1000;
    k->straggler_factor = 1.5;
    k->min_gain = 0.2;
    k->explore = 0.05;
    k->report_ms = 200;
}

static double dmax(double a, double b)
{
    return a > b ? a : b;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

bool cfx__ps_balance_serves(uint32_t state, bool gone)
{
    return !gone && state != CFX_PS_SERVER_FAILED;
}

static bool serves(const struct ps_balance_in *in, uint32_t s)
{
    return cfx__ps_balance_serves(in->state[s], in->gone && in->gone[s]);
}

static bool is_lost(const struct ps_balance_in *in, uint32_t i)
{
    return in->lost && in->lost[i];
}

int cfx__ps_balance_unmeasured(const struct ps_balance_in *in, const uint16_t *owner,
                               const double *measured)
{
    bool owns[PS_MAX_SERVERS] = { false };
    for (uint32_t i = 0; i < in->nblocks; i++)
        if (owner[i] < PS_MAX_SERVERS && !is_lost(in, i))
            owns[owner[i]] = true;
    for (uint32_t s = 0; s < in->nservers && s < PS_MAX_SERVERS; s++)
        if (owns[s] && measured[s] <= 0 && serves(in, s))
            return (int)s;
    return -1;
}

/* Of the servers that serve: a failed one's last measurement is history. */
static double median(const struct ps_balance_in *in)
{
    double tmp[PS_MAX_SERVERS];
    uint32_t k = 0;
    for (uint32_t i = 0; i < in->nservers; i++)
        if (in->ns_per_byte[i] > 0 && serves(in, i))
            tmp[k++] = in->ns_per_byte[i];
    if (!k)
        return 0;
    qsort(tmp, k, sizeof(double), cmp_double);
    return k % 2 ? tmp[k / 2] : 0.5 * (tmp[k / 2 - 1] + tmp[k / 2]);
}

struct bal {
    const struct ps_balance_in *in;
    uint16_t *owner;
    double cap[PS_MAX_SERVERS];  /* bytes per ns */
    double load[PS_MAX_SERVERS]; /* bytes */
    uint32_t nblk[PS_MAX_SERVERS];
    bool active[PS_MAX_SERVERS];
    uint32_t moves;
};

static double t_of(const struct bal *b, uint32_t s, double extra)
{
    return (b->load[s] + extra) / b->cap[s];
}

static double max_t(const struct bal *b, uint32_t *who)
{
    double m = 0;
    uint32_t w = UINT32_MAX;
    for (uint32_t s = 0; s < b->in->nservers; s++)
        if (b->active[s] && (w == UINT32_MAX || t_of(b, s, 0) > m)) {
            m = t_of(b, s, 0);
            w = s;
        }
    if (who)
        *who = w;
    return m;
}

/* A block's bytes and count in its owner's load: none when its values
 * were lost (nobody serves it). */
static double load_of(const struct bal *b, uint32_t blk)
{
    return is_lost(b->in, blk) ? 0 : (double)b->in->bytes[blk];
}

static void move(struct bal *b, uint32_t blk, uint32_t to)
{
    uint32_t from = b->owner[blk];
    double sz = load_of(b, blk);
    uint32_t n = !is_lost(b->in, blk);
    if (from < b->in->nservers) {
        b->load[from] -= sz;
        b->nblk[from] -= n;
    }
    b->load[to] += sz;
    b->nblk[to] += n;
    b->owner[blk] = (uint16_t)to;
}

/* Active server where @p sz bytes raise T least. */
static uint32_t best_dest(const struct bal *b, double sz, uint32_t except)
{
    uint32_t best = UINT32_MAX;
    for (uint32_t s = 0; s < b->in->nservers; s++)
        if (b->active[s] && s != except &&
            (best == UINT32_MAX || t_of(b, s, sz) < t_of(b, best, sz)))
            best = s;
    return best;
}

int cfx__ps_balance(const struct ps_balance_in *in, uint16_t *owner, struct ps_balance_out *out)
{
    struct bal b;
    memset(&b, 0, sizeof(b));
    memset(out, 0, sizeof(*out));
    b.in = in;
    if (in->nservers == 0 || in->nservers > PS_MAX_SERVERS)
        return CFX_ERR_INVALID;

    uint32_t nactive = 0;
    for (uint32_t s = 0; s < in->nservers; s++)
        if (in->state[s] == CFX_PS_SERVER_ACTIVE && !(in->gone && in->gone[s])) {
            b.active[s] = true;
            nactive++;
        }
    if (!nactive)
        return CFX_ERR_INVALID;

    double med = median(in);
    double fac = in->knobs->straggler_factor > 1 ? in->knobs->straggler_factor : 1.5;
    for (uint32_t s = 0; s < in->nservers; s++) {
        double npb = in->ns_per_byte[s] > 0 ? in->ns_per_byte[s] : (med > 0 ? med : 1.0);
        b.cap[s] = 1.0 / npb;
        if (b.active[s] && med > 0 && in->ns_per_byte[s] > fac * med)
            out->stragglers |= 1ull << s;
    }

    /* work on a copy: the caller's owners change only if we commit */
    uint16_t *own = malloc((in->nblocks ? in->nblocks : 1) * sizeof(*own));
    if (!own)
        return CFX_ERR_NOMEM;
    memcpy(own, owner, in->nblocks * sizeof(*own));
    b.owner = own;
    double total = 0;
    uint32_t nmovable = 0;
    for (uint32_t i = 0; i < in->nblocks; i++) {
        uint32_t s = own[i];
        if (is_lost(in, i))
            continue; /* out of the measurement, and moved only when forced */
        if (s < in->nservers) {
            b.load[s] += (double)in->bytes[i];
            b.nblk[s]++;
        }
        total += (double)in->bytes[i];
        nmovable += !in->movable || in->movable[i];
    }
    out->cur_max = max_t(&b, NULL);
    /* the slowest of all owners that serve, draining ones included: a
     * failed one's blocks take no time (they are not served), and its
     * stale prediction made any small gain among the survivors pass */
    for (uint32_t s = 0; s < in->nservers; s++)
        if (!b.active[s] && b.nblk[s] && serves(in, s))
            out->cur_max = dmax(out->cur_max, t_of(&b, s, 0));

    /* 1. forced moves */
    bool forced = false;
    for (uint32_t i = 0; i < in->nblocks; i++) {
        uint32_t s = own[i];
        /* an active server not counted active is gone, and a failed one
         * too: its blocks' states went with it, so they stay, and its
         * workers hear of it from there (a failed one removed comes as
         * DRAINING: its blocks move) */
        if (s < in->nservers && (b.active[s] || in->state[s] == CFX_PS_SERVER_ACTIVE ||
                                 in->state[s] == CFX_PS_SERVER_FAILED))
            continue;
        move(&b, i, best_dest(&b, load_of(&b, i), UINT32_MAX));
        forced = true;
    }

    /* 2. exploration floor */
    double floor_bytes = in->knobs->explore > 0 ? in->knobs->explore * total / nactive : 0;
    if (nmovable >= nactive) {
        for (uint32_t s = 0; s < in->nservers; s++) {
            if (!b.active[s])
                continue;
            for (uint32_t guard = 0;
                 guard < in->nblocks && (b.nblk[s] == 0 || b.load[s] < floor_bytes); guard++) {
                /* the smallest movable block of the slowest other server with two+ */
                uint32_t src = UINT32_MAX;
                for (uint32_t d = 0; d < in->nservers; d++)
                    if (d != s && b.active[d] && b.nblk[d] > 1 &&
                        (src == UINT32_MAX || t_of(&b, d, 0) > t_of(&b, src, 0)))
                        src = d;
                if (src == UINT32_MAX)
                    break;
                uint32_t pick = UINT32_MAX;
                for (uint32_t i = 0; i < in->nblocks; i++)
                    if (own[i] == src && (!in->movable || in->movable[i]) && !is_lost(in, i) &&
                        (pick == UINT32_MAX || in->bytes[i] < in->bytes[pick]))
                        pick = i;
                if (pick == UINT32_MAX)
                    break;
                move(&b, pick, s);
            }
        }
    }

    /* 3. greedy: unload the slowest server one block at a time */
    for (uint32_t iter = 0; iter < 4 * in->nblocks + 16; iter++) {
        uint32_t hi;
        double tmax = max_t(&b, &hi);
        if (hi == UINT32_MAX || b.nblk[hi] <= 1)
            break;
        uint32_t best_blk = UINT32_MAX, best_to = UINT32_MAX;
        double best_t = tmax;
        for (uint32_t i = 0; i < in->nblocks; i++) {
            if (own[i] != hi || (in->movable && !in->movable[i]) || is_lost(in, i))
                continue;
            double sz = (double)in->bytes[i];
            if (b.load[hi] - sz < floor_bytes)
                continue;
            uint32_t to = best_dest(&b, sz, hi);
            if (to == UINT32_MAX)
                continue;
            double t = dmax(t_of(&b, to, sz), t_of(&b, hi, -sz));
            if (t < best_t * (1 - 1e-9)) {
                best_t = t;
                best_blk = i;
                best_to = to;
            }
        }
        if (best_blk == UINT32_MAX)
            break;
        move(&b, best_blk, best_to);
    }
    out->new_max = max_t(&b, NULL);

    /* 4. hysteresis */
    uint32_t moves = 0;
    for (uint32_t i = 0; i < in->nblocks; i++)
        moves += own[i] != owner[i];
    bool commit =
        moves && (forced || in->force || out->new_max < out->cur_max * (1 - in->knobs->min_gain));
    if (commit) {
        memcpy(owner, own, in->nblocks * sizeof(*own));
        out->moves = moves;
    } else {
        out->new_max = out->cur_max;
    }
    free(own);
    return CFX_OK;
}
