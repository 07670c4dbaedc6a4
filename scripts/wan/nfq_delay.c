/*
 * nfq_delay.c — a constant-delay line for packets sent to an NFQUEUE (a stand-in for
 * `tc qdisc ... netem delay`, for kernels built without CONFIG_NET_SCH_NETEM).
 *
 * Every packet queued to queue QNUM is held in the kernel and released (NF_ACCEPT) DELAY_US
 * microseconds after this program read its notification. Because every packet gets the same
 * delay, packets leave in arrival order, so one NFQNL_MSG_VERDICT_BATCH ("accept every packet
 * with id <= N") releases all that are due: the program never copies payloads (COPY_META) and
 * costs one syscall per batch. A lost notification (socket buffer overrun) is harmless: the next
 * batch verdict covers its id.
 *
 * Built by scripts/wan/setup.sh into ~/.cache/gradfed-ipfs/wan/ (gcc, no libnetfilter_queue).
 * Use (as root, in the namespace whose traffic is delayed; setup.sh does this):
 *     iptables -A FORWARD -j NFQUEUE --queue-num 0
 *     nfq_delay -q 0 -d 25000            # 25 ms one-way
 * Options: -q QNUM (default 0), -d DELAY_US (required), -m MAXLEN (kernel queue length,
 * default 262144), -s STATS_SECONDS (print counters to stderr periodically; default 0 = off).
 * SIGTERM/SIGINT: release everything held, print counters, exit 0.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif

#define RING (1u << 20)

static int fd;
static uint16_t qnum;
static uint32_t seq;
static volatile sig_atomic_t stop;
static uint32_t ring_id[RING];
static int64_t ring_due[RING];
static uint32_t head, tail; /* ring indices (mod RING) */
static uint64_t n_packets, n_batches, n_overrun, n_ringfull;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void on_signal(int sig) { (void)sig; stop = 1; }

static struct nlmsghdr *start_msg(char *buf, size_t cap, int type, int flags) {
    memset(buf, 0, cap);
    struct nlmsghdr *nlh = (struct nlmsghdr *)buf;
    nlh->nlmsg_len = NLMSG_LENGTH(sizeof(struct nfgenmsg));
    nlh->nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | type;
    nlh->nlmsg_flags = NLM_F_REQUEST | flags;
    nlh->nlmsg_seq = ++seq;
    struct nfgenmsg *g = NLMSG_DATA(nlh);
    g->nfgen_family = AF_UNSPEC;
    g->version = NFNETLINK_V0;
    g->res_id = htons(qnum);
    return nlh;
}

static void put_attr(struct nlmsghdr *nlh, int type, const void *data, int len) {
    struct nlattr *a = (struct nlattr *)((char *)nlh + NLMSG_ALIGN(nlh->nlmsg_len));
    a->nla_type = type;
    a->nla_len = NLA_HDRLEN + len;
    memcpy((char *)a + NLA_HDRLEN, data, len);
    nlh->nlmsg_len = NLMSG_ALIGN(nlh->nlmsg_len) + NLA_ALIGN(a->nla_len);
}

static int send_msg(struct nlmsghdr *nlh) {
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    return sendto(fd, nlh, nlh->nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0 ? -1
                                                                                              : 0;
}

/* Send a config message with an ACK request and wait for the kernel's answer. */
static int config(int attr, const void *data, int len, const char *what) {
    char buf[256];
    struct nlmsghdr *nlh = start_msg(buf, sizeof buf, NFQNL_MSG_CONFIG, NLM_F_ACK);
    put_attr(nlh, attr, data, len);
    if (send_msg(nlh) < 0) {
        fprintf(stderr, "nfq_delay: send %s: %s\n", what, strerror(errno));
        return -1;
    }
    char rbuf[8192];
    for (;;) {
        ssize_t n = recv(fd, rbuf, sizeof rbuf, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "nfq_delay: recv ack %s: %s\n", what, strerror(errno));
            return -1;
        }
        for (struct nlmsghdr *h = (struct nlmsghdr *)rbuf; NLMSG_OK(h, (unsigned)n);
             h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type == NLMSG_ERROR && h->nlmsg_seq == seq) {
                struct nlmsgerr *e = NLMSG_DATA(h);
                if (e->error != 0) {
                    fprintf(stderr, "nfq_delay: %s refused: %s\n", what, strerror(-e->error));
                    return -1;
                }
                return 0;
            }
        }
    }
}

static void verdict_upto(uint32_t id) {
    char buf[128];
    struct nlmsghdr *nlh = start_msg(buf, sizeof buf, NFQNL_MSG_VERDICT_BATCH, 0);
    struct nfqnl_msg_verdict_hdr v = {.verdict = htonl(NF_ACCEPT), .id = htonl(id)};
    put_attr(nlh, NFQA_VERDICT_HDR, &v, sizeof v);
    if (send_msg(nlh) < 0) fprintf(stderr, "nfq_delay: verdict: %s\n", strerror(errno));
    n_batches++;
}

/* Release every held packet that is due at `now`. */
static void release_due(int64_t now) {
    uint32_t last = 0;
    int any = 0;
    while (head != tail && ring_due[head % RING] <= now) {
        last = ring_id[head % RING];
        any = 1;
        head++;
    }
    if (any) verdict_upto(last);
}

static void read_packets(int64_t delay_ns) {
    static char buf[1 << 18];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
            if (errno == ENOBUFS) { n_overrun++; continue; }
            fprintf(stderr, "nfq_delay: recv: %s\n", strerror(errno));
            return;
        }
        int64_t due = now_ns() + delay_ns;
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (unsigned)n);
             h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type != ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET)) continue;
            int alen = h->nlmsg_len - NLMSG_LENGTH(sizeof(struct nfgenmsg));
            struct nlattr *a = (struct nlattr *)((char *)NLMSG_DATA(h) +
                                                 NLMSG_ALIGN(sizeof(struct nfgenmsg)));
            while (alen >= (int)NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= alen) {
                if ((a->nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR) {
                    struct nfqnl_msg_packet_hdr *ph =
                        (struct nfqnl_msg_packet_hdr *)((char *)a + NLA_HDRLEN);
                    if (tail - head >= RING) {
                        n_ringfull++; /* should not happen; release the oldest now */
                        release_due(INT64_MAX / 2);
                    }
                    ring_id[tail % RING] = ntohl(ph->packet_id);
                    ring_due[tail % RING] = due;
                    tail++;
                    n_packets++;
                    break;
                }
                int step = NLA_ALIGN(a->nla_len);
                alen -= step;
                a = (struct nlattr *)((char *)a + step);
            }
        }
    }
}

int main(int argc, char **argv) {
    long delay_us = -1, maxlen = 262144, stats_s = 0;
    int opt;
    while ((opt = getopt(argc, argv, "q:d:m:s:")) != -1) {
        switch (opt) {
            case 'q': qnum = (uint16_t)atoi(optarg); break;
            case 'd': delay_us = atol(optarg); break;
            case 'm': maxlen = atol(optarg); break;
            case 's': stats_s = atol(optarg); break;
            default:
                fprintf(stderr, "usage: %s -d DELAY_US [-q QNUM] [-m MAXLEN] [-s STATS_S]\n",
                        argv[0]);
                return 2;
        }
    }
    if (delay_us < 0) {
        fprintf(stderr, "nfq_delay: -d DELAY_US is required\n");
        return 2;
    }
    int64_t delay_ns = (int64_t)delay_us * 1000;
    fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
    if (fd < 0) { perror("nfq_delay: socket"); return 1; }
    struct sockaddr_nl local = {.nl_family = AF_NETLINK};
    if (bind(fd, (struct sockaddr *)&local, sizeof local) < 0) { perror("bind"); return 1; }
    int rcv = 32 << 20, one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcv, sizeof rcv) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);

    struct nfqnl_msg_config_cmd cmd = {.command = NFQNL_CFG_CMD_BIND, .pf = htons(AF_INET)};
    if (config(NFQA_CFG_CMD, &cmd, sizeof cmd, "bind") < 0) return 1;
    struct nfqnl_msg_config_params params = {.copy_range = htonl(0), .copy_mode = NFQNL_COPY_META};
    if (config(NFQA_CFG_PARAMS, &params, sizeof params, "params") < 0) return 1;
    uint32_t ml = htonl((uint32_t)maxlen);
    if (config(NFQA_CFG_QUEUE_MAXLEN, &ml, sizeof ml, "maxlen") < 0) return 1;

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    fprintf(stderr, "nfq_delay: queue %u, delay %ld us, maxlen %ld\n", qnum, delay_us, maxlen);

    int64_t next_stats = stats_s > 0 ? now_ns() + stats_s * 1000000000LL : INT64_MAX;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    while (!stop) {
        int64_t now = now_ns();
        release_due(now);
        if (now >= next_stats) {
            fprintf(stderr, "nfq_delay: packets %llu batches %llu held %u overruns %llu\n",
                    (unsigned long long)n_packets, (unsigned long long)n_batches, tail - head,
                    (unsigned long long)n_overrun);
            next_stats = now + stats_s * 1000000000LL;
        }
        int64_t wait_ns = 200000000LL; /* at most 200 ms between checks */
        if (head != tail) {
            int64_t d = ring_due[head % RING] - now;
            if (d < wait_ns) wait_ns = d < 0 ? 0 : d;
        }
        struct timespec ts = {.tv_sec = wait_ns / 1000000000LL, .tv_nsec = wait_ns % 1000000000LL};
        int r = ppoll(&pfd, 1, &ts, NULL);
        if (r > 0 && (pfd.revents & POLLIN)) read_packets(delay_ns);
    }
    if (head != tail) verdict_upto(ring_id[(tail - 1) % RING]);
    fprintf(stderr, "nfq_delay: exit; packets %llu batches %llu overruns %llu ringfull %llu\n",
            (unsigned long long)n_packets, (unsigned long long)n_batches,
            (unsigned long long)n_overrun, (unsigned long long)n_ringfull);
    return 0;
}
