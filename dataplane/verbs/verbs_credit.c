/* verbs transport: receive credits and selective signaling (see verbs_credit.h). */
#include "verbs_credit.h"

void cfx__verbs_fc_init(struct cfx__verbs_fc *fc, uint32_t rq, uint32_t peer_rq)
{
    fc->rq_depth = rq;
    /* A quarter of the queue: few credit messages, and the sender never
     * waits long for credits that are already free here. */
    fc->thresh = rq / 4 > 2 ? rq / 4 : 2;
    fc->reserve = 2;
    fc->tx_credits = peer_rq;
    fc->rx_owed = 0;
}

bool cfx__verbs_fc_grant(struct cfx__verbs_fc *fc, uint32_t n, uint32_t peer_rq)
{
    if (n > peer_rq || fc->tx_credits + n > peer_rq)
        return false;
    fc->tx_credits += n;
    return true;
}

uint32_t cfx__verbs_fc_take(struct cfx__verbs_fc *fc, uint32_t max)
{
    uint32_t n = fc->rx_owed < max ? fc->rx_owed : max;
    fc->rx_owed -= n;
    return n;
}

void cfx__verbs_sq_init(struct cfx__verbs_sq *sq, uint32_t depth, uint32_t interval)
{
    sq->depth = depth;
    sq->interval = interval ? interval : 1;
    sq->posted = sq->retired = sq->last_sig = sq->run = 0;
    sq->any_sig = false;
}

bool cfx__verbs_sq_sig_outstanding(const struct cfx__verbs_sq *sq)
{
    /* last_sig lies in [retired, posted) */
    return sq->any_sig && sq->last_sig - sq->retired < sq->posted - sq->retired;
}

bool cfx__verbs_sq_post(struct cfx__verbs_sq *sq, bool force)
{
    uint32_t out = cfx__verbs_sq_outstanding(sq);
    bool sig = force || !cfx__verbs_sq_sig_outstanding(sq) || sq->run + 1 >= sq->interval ||
               out + 2 >= sq->depth;

    if (sig) {
        sq->last_sig = sq->posted;
        sq->any_sig = true;
        sq->run = 0;
    } else {
        sq->run++;
    }
    sq->posted++;
    return sig;
}

uint32_t cfx__verbs_sq_retire(struct cfx__verbs_sq *sq, uint32_t seq)
{
    uint32_t n = seq - sq->retired + 1;
    if (seq - sq->retired >= sq->posted - sq->retired)
        return 0;
    sq->retired = seq + 1;
    return n;
}
