/* SPDX-License-Identifier: GPL-2.0 */
/*
 * mw_cc.h: what both of midway's congestion controls share, written to be the exact C form of
 * the reference model in crates/midway-cc (the Rust and the C are checked against each other,
 * table-driven, by crates/midway-bpf/tests/arithmetic.rs):
 *
 *   - the kernel types the programs touch, declared by hand with only the members used and
 *     __attribute__((preserve_access_index)), so that libbpf relocates every access against the
 *     running kernel's BTF (CO-RE) and no generated vmlinux.h is needed;
 *   - RFC 3649 Appendix B (window, a(w), b(w) in hundredths) and its fixed-step binary search
 *     (midway_cc::highspeed::table_row_index);
 *   - the window arithmetic: Reno slow start and the cwnd_cnt additive increase
 *     (midway_cc::window::Window::on_ack), the decrease on a loss
 *     (midway_cc::highspeed::ssthresh_after_loss);
 *   - gentle HighSpeed TCP's RTT tracker and mode switch (midway_cc::gentle_highspeed).
 *
 * Every function works on plain structs (struct mw_window, struct mw_rtt), never on the socket,
 * so the struct_ops programs and the SEC("syscall") check programs run the same code.
 */
#ifndef MW_CC_H
#define MW_CC_H

/* No kernel or libc headers: the few types are spelled out here. */
typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
#define true 1
#define false 0

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

/* ---- kernel types (CO-RE: member offsets come from the running kernel's BTF) ---- */

struct sock;

struct inet_connection_sock {
	__u8 icsk_ca_state;
	__u64 icsk_ca_priv[13];
} __attribute__((preserve_access_index));

struct tcp_sock {
	__u32 snd_cwnd;
	__u32 snd_cwnd_cnt;
	__u32 snd_cwnd_clamp;
	__u32 snd_ssthresh;
	__u32 prior_cwnd;
	__u32 max_packets_out;
	__u8 is_cwnd_limited : 1;
} __attribute__((preserve_access_index));

struct ack_sample {
	__u32 pkts_acked;
	__s32 rtt_us;
	__u32 in_flight;
} __attribute__((preserve_access_index));

/* libbpf matches these members by name with the kernel's struct tcp_congestion_ops. */
struct tcp_congestion_ops {
	__u32 (*ssthresh)(struct sock *sk);
	void (*cong_avoid)(struct sock *sk, __u32 ack, __u32 acked);
	void (*set_state)(struct sock *sk, __u8 new_state);
	void (*pkts_acked)(struct sock *sk, const struct ack_sample *sample);
	__u32 (*undo_cwnd)(struct sock *sk);
	void (*init)(struct sock *sk);
	char name[16];
};

/* include/net/tcp_states / tcp.h values the programs compare with. */
#define MW_TCP_CA_LOSS 4

static __always_inline struct tcp_sock *mw_tcp_sk(struct sock *sk)
{
	return (struct tcp_sock *)sk;
}

static __always_inline void *mw_ca_priv(struct sock *sk)
{
	return (void *)((struct inet_connection_sock *)sk)->icsk_ca_priv;
}

/* The kernel's tcp_is_cwnd_limited(): grow only a window the sender actually fills. */
static __always_inline bool mw_is_cwnd_limited(struct sock *sk)
{
	struct tcp_sock *tp = mw_tcp_sk(sk);

	if (tp->snd_cwnd < tp->snd_ssthresh)
		return tp->snd_cwnd < 2 * tp->max_packets_out;
	return BPF_CORE_READ_BITFIELD(tp, is_cwnd_limited);
}

/* ---- RFC 3649 Appendix B (midway_cc::highspeed::AIMD_TABLE) ---- */

struct mw_aimd_row {
	__u32 window;              /* from this window (segments) on ... */
	__u32 increase;            /* ... a(w): segments per round-trip ... */
	__u32 decrease_hundredths; /* ... and b(w) in hundredths */
};

#define MW_AIMD_ROWS 71

static const struct mw_aimd_row mw_aimd_table[MW_AIMD_ROWS] = {
	{    38,  1, 50 },
	{   118,  2, 44 },
	{   221,  3, 41 },
	{   347,  4, 38 },
	{   495,  5, 37 },
	{   663,  6, 35 },
	{   851,  7, 34 },
	{  1058,  8, 33 },
	{  1284,  9, 32 },
	{  1529, 10, 31 },
	{  1793, 11, 30 },
	{  2076, 12, 29 },
	{  2378, 13, 28 },
	{  2699, 14, 28 },
	{  3039, 15, 27 },
	{  3399, 16, 27 },
	{  3778, 17, 26 },
	{  4177, 18, 26 },
	{  4596, 19, 25 },
	{  5036, 20, 25 },
	{  5497, 21, 24 },
	{  5979, 22, 24 },
	{  6483, 23, 23 },
	{  7009, 24, 23 },
	{  7558, 25, 22 },
	{  8130, 26, 22 },
	{  8726, 27, 22 },
	{  9346, 28, 21 },
	{  9991, 29, 21 },
	{ 10661, 30, 21 },
	{ 11358, 31, 20 },
	{ 12082, 32, 20 },
	{ 12834, 33, 20 },
	{ 13614, 34, 19 },
	{ 14424, 35, 19 },
	{ 15265, 36, 19 },
	{ 16137, 37, 19 },
	{ 17042, 38, 18 },
	{ 17981, 39, 18 },
	{ 18955, 40, 18 },
	{ 19965, 41, 17 },
	{ 21013, 42, 17 },
	{ 22101, 43, 17 },
	{ 23230, 44, 17 },
	{ 24402, 45, 16 },
	{ 25618, 46, 16 },
	{ 26881, 47, 16 },
	{ 28193, 48, 16 },
	{ 29557, 49, 15 },
	{ 30975, 50, 15 },
	{ 32450, 51, 15 },
	{ 33986, 52, 15 },
	{ 35586, 53, 14 },
	{ 37253, 54, 14 },
	{ 38992, 55, 14 },
	{ 40808, 56, 14 },
	{ 42707, 57, 13 },
	{ 44694, 58, 13 },
	{ 46776, 59, 13 },
	{ 48961, 60, 13 },
	{ 51258, 61, 13 },
	{ 53677, 62, 12 },
	{ 56230, 63, 12 },
	{ 58932, 64, 12 },
	{ 61799, 65, 12 },
	{ 64851, 66, 11 },
	{ 68113, 67, 11 },
	{ 71617, 68, 11 },
	{ 75401, 69, 10 },
	{ 79517, 70, 10 },
	{ 84035, 71, 10 },
};

#define MW_MIN_SSTHRESH 2
#define MW_LOSS_WINDOW 1

/*
 * midway_cc::highspeed::table_row_index: the last row whose window is at most cwnd (row 0 below
 * it), found in seven fixed steps (64, 32, ..., 1) that the verifier accepts.
 */
static __always_inline __u32 mw_table_row_index(__u32 cwnd)
{
	__u32 index = 0;

#pragma unroll
	for (int shift = 6; shift >= 0; shift--) {
		__u32 candidate = index + (1u << shift);

		if (candidate < MW_AIMD_ROWS && mw_aimd_table[candidate].window <= cwnd)
			index = candidate;
	}
	return index;
}

static __always_inline __u32 mw_table_increase(__u32 cwnd)
{
	__u32 index = mw_table_row_index(cwnd);

	if (index >= MW_AIMD_ROWS)
		return 1;
	return mw_aimd_table[index].increase;
}

static __always_inline __u32 mw_table_decrease_hundredths(__u32 cwnd)
{
	__u32 index = mw_table_row_index(cwnd);

	if (index >= MW_AIMD_ROWS)
		return 50;
	return mw_aimd_table[index].decrease_hundredths;
}

/* midway_cc::highspeed::ssthresh_after_loss: max(cwnd - cwnd * b / 100, 2), in 64 bits. */
static __always_inline __u32 mw_ssthresh_after_loss(__u32 cwnd)
{
	__u64 given_up = (__u64)cwnd * mw_table_decrease_hundredths(cwnd) / 100;
	__u32 kept = (__u32)((__u64)cwnd - given_up);

	return kept > MW_MIN_SSTHRESH ? kept : MW_MIN_SSTHRESH;
}

/* ---- the window (midway_cc::window::Window) ---- */

struct mw_window {
	__u32 cwnd;
	__u32 cwnd_cnt;
	__u32 ssthresh;
};

static __always_inline __u32 mw_saturating_add(__u32 a, __u32 b)
{
	__u32 sum = a + b;

	return sum < a ? 0xffffffffu : sum;
}

/* Reno slow start, never past ssthresh; returns the ACKs left for congestion avoidance. */
static __always_inline __u32 mw_slow_start(struct mw_window *w, __u32 acked)
{
	__u32 room, used;

	if (!(w->cwnd < w->ssthresh))
		return acked;
	room = w->ssthresh - w->cwnd;
	used = acked < room ? acked : room;
	w->cwnd += used;
	return acked - used;
}

/* One segment per acks_per_increase segments acked (acks_per_increase >= 1). */
static __always_inline void mw_additive_increase(struct mw_window *w, __u32 acks_per_increase,
						 __u32 acked)
{
	if (w->cwnd_cnt >= acks_per_increase) {
		w->cwnd_cnt = 0;
		w->cwnd = mw_saturating_add(w->cwnd, 1);
	}
	w->cwnd_cnt = mw_saturating_add(w->cwnd_cnt, acked);
	if (w->cwnd_cnt >= acks_per_increase) {
		__u32 segments = w->cwnd_cnt / acks_per_increase;

		w->cwnd_cnt -= segments * acks_per_increase;
		w->cwnd = mw_saturating_add(w->cwnd, segments);
	}
}

/* Window::on_ack: slow start first, the rest at increase_per_rtt segments per round-trip. */
static __always_inline void mw_window_on_ack(struct mw_window *w, __u32 acked,
					     __u32 increase_per_rtt)
{
	__u32 acks_per_increase;

	acked = mw_slow_start(w, acked);
	if (acked == 0)
		return;
	if (increase_per_rtt == 0)
		increase_per_rtt = 1;
	acks_per_increase = w->cwnd / increase_per_rtt;
	if (acks_per_increase == 0)
		acks_per_increase = 1;
	mw_additive_increase(w, acks_per_increase, acked);
}

/* A loss (HighSpeed::on_loss, GentleHighSpeed::on_loss): the new ssthresh, cwnd untouched. */
static __always_inline __u32 mw_window_on_loss(struct mw_window *w)
{
	__u32 ssthresh = mw_ssthresh_after_loss(w->cwnd);

	w->ssthresh = ssthresh > MW_MIN_SSTHRESH ? ssthresh : MW_MIN_SSTHRESH;
	return w->ssthresh;
}

/* Fast recovery is over: continue from ssthresh, counting afresh. */
static __always_inline void mw_window_on_recovery_end(struct mw_window *w)
{
	w->cwnd = w->ssthresh;
	w->cwnd_cnt = 0;
}

/* A retransmission timeout: ssthresh as for a loss, slow start from one segment. */
static __always_inline void mw_window_on_timeout(struct mw_window *w)
{
	mw_window_on_loss(w);
	w->cwnd = MW_LOSS_WINDOW;
	w->cwnd_cnt = 0;
}

/* ---- gentle HighSpeed TCP (midway_cc::gentle_highspeed) ---- */

#define MW_SRTT_GAIN_SHIFT 3
#define MW_THRESHOLD_EIGHTHS_SHIFT 3
#define MW_RENO_MODE_ABOVE_EIGHTHS 4
#define MW_HIGHSPEED_MODE_BELOW_EIGHTHS 2
#define MW_MIN_QUEUEING_SPREAD_US 1000

#define MW_MODE_HIGHSPEED 0
#define MW_MODE_RENO 1

/* RttTracker plus the mode; lives in the socket's icsk_ca_priv (zeroed = no sample, HighSpeed). */
struct mw_rtt {
	__u32 srtt_x8_us; /* smoothed RTT times 8, valid when have_sample */
	__u32 min_us;
	__u32 max_us;
	__u32 have_sample;
	__u32 mode;
};

struct mw_thresholds {
	__u32 defined;
	__u32 lower_us;
	__u32 upper_us;
};

static __always_inline void mw_rtt_reset(struct mw_rtt *r)
{
	r->srtt_x8_us = 0;
	r->min_us = 0;
	r->max_us = 0;
	r->have_sample = 0;
	r->mode = MW_MODE_HIGHSPEED;
}

/* RttTracker::on_sample. */
static __always_inline void mw_rtt_sample(struct mw_rtt *r, __u32 rtt_us)
{
	if (!r->have_sample) {
		r->srtt_x8_us = rtt_us > (0xffffffffu >> MW_SRTT_GAIN_SHIFT)
					? 0xffffffffu
					: rtt_us << MW_SRTT_GAIN_SHIFT;
		r->min_us = rtt_us;
		r->max_us = rtt_us;
		r->have_sample = 1;
		return;
	}
	r->srtt_x8_us = mw_saturating_add(r->srtt_x8_us - (r->srtt_x8_us >> MW_SRTT_GAIN_SHIFT),
					  rtt_us);
	if (rtt_us < r->min_us)
		r->min_us = rtt_us;
	if (rtt_us > r->max_us)
		r->max_us = rtt_us;
}

/* RttTracker::thresholds. */
static __always_inline struct mw_thresholds mw_rtt_thresholds(const struct mw_rtt *r)
{
	struct mw_thresholds t = { 0, 0, 0 };
	__u32 spread;

	if (!r->have_sample)
		return t;
	spread = r->max_us - r->min_us;
	if (spread < MW_MIN_QUEUEING_SPREAD_US)
		return t;
	t.defined = 1;
	t.lower_us = r->min_us + (__u32)(((__u64)spread * MW_HIGHSPEED_MODE_BELOW_EIGHTHS) >>
					  MW_THRESHOLD_EIGHTHS_SHIFT);
	t.upper_us = r->min_us + (__u32)(((__u64)spread * MW_RENO_MODE_ABOVE_EIGHTHS) >>
					  MW_THRESHOLD_EIGHTHS_SHIFT);
	return t;
}

/* GentleHighSpeed::on_rtt_sample: take the sample, then decide the mode (next_mode). */
static __always_inline void mw_ghs_on_rtt_sample(struct mw_rtt *r, __u32 rtt_us)
{
	struct mw_thresholds t;
	__u32 srtt_us;

	mw_rtt_sample(r, rtt_us);
	srtt_us = r->srtt_x8_us >> MW_SRTT_GAIN_SHIFT;
	t = mw_rtt_thresholds(r);
	if (!t.defined) {
		r->mode = MW_MODE_HIGHSPEED;
		return;
	}
	if (r->mode == MW_MODE_HIGHSPEED && srtt_us > t.upper_us)
		r->mode = MW_MODE_RENO;
	else if (r->mode == MW_MODE_RENO && srtt_us < t.lower_us)
		r->mode = MW_MODE_HIGHSPEED;
}

/* GentleHighSpeed::increase_per_rtt. */
static __always_inline __u32 mw_ghs_increase(__u32 cwnd, __u32 mode)
{
	return mode == MW_MODE_RENO ? 1 : mw_table_increase(cwnd);
}

/* GentleHighSpeed::on_retransmission_timeout's RTT part: forget the path, HighSpeed mode. */
static __always_inline void mw_ghs_on_timeout(struct mw_rtt *r)
{
	mw_rtt_reset(r);
}

/* ---- glue shared by both struct_ops programs ---- */

static __always_inline struct mw_window mw_window_of(struct sock *sk)
{
	struct tcp_sock *tp = mw_tcp_sk(sk);
	struct mw_window w = { tp->snd_cwnd, tp->snd_cwnd_cnt, tp->snd_ssthresh };

	return w;
}

/* Writes cwnd and cwnd_cnt back, capped at the socket's clamp as tcp_cong_avoid_ai() does. */
static __always_inline void mw_window_store(struct sock *sk, const struct mw_window *w)
{
	struct tcp_sock *tp = mw_tcp_sk(sk);
	__u32 cwnd = w->cwnd;

	if (cwnd > tp->snd_cwnd_clamp)
		cwnd = tp->snd_cwnd_clamp;
	tp->snd_cwnd = cwnd;
	tp->snd_cwnd_cnt = w->cwnd_cnt;
}

/* Reno's undo (tcp_reno_undo_cwnd): back to the window before the spurious reduction. */
static __always_inline __u32 mw_undo_cwnd(struct sock *sk)
{
	struct tcp_sock *tp = mw_tcp_sk(sk);

	return tp->snd_cwnd > tp->prior_cwnd ? tp->snd_cwnd : tp->prior_cwnd;
}

#endif /* MW_CC_H */
