// SPDX-License-Identifier: GPL-2.0
/*
 * mw_gentle_hs: gentle HighSpeed TCP (gHSTCP) as a BPF struct_ops congestion control.
 * HighSpeed TCP's a(w) per round-trip while the smoothed RTT stays low, Reno's one segment while
 * it is raised (two thresholds between the smallest and largest RTT sample, with hysteresis),
 * HighSpeed TCP's b(w) on a loss. The RTT tracker and the mode live in the socket's private
 * congestion-control area. The arithmetic is in mw_cc.h; the reference is crates/midway-cc's
 * gentle_highspeed module.
 */
#include "mw_cc.h"

char _license[] SEC("license") = "GPL";

static __always_inline struct mw_rtt *mw_ghs(struct sock *sk)
{
	return (struct mw_rtt *)mw_ca_priv(sk);
}

SEC("struct_ops/mw_ghs_init")
void BPF_PROG(mw_ghs_init, struct sock *sk)
{
	mw_rtt_reset(mw_ghs(sk));
}

SEC("struct_ops/mw_ghs_pkts_acked")
void BPF_PROG(mw_ghs_pkts_acked, struct sock *sk, const struct ack_sample *sample)
{
	__s32 rtt_us = sample->rtt_us;

	/* A negative RTT is the kernel's "no sample with this ACK". */
	if (rtt_us < 0)
		return;
	mw_ghs_on_rtt_sample(mw_ghs(sk), (__u32)rtt_us);
}

SEC("struct_ops/mw_ghs_cong_avoid")
void BPF_PROG(mw_ghs_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct mw_window w;

	if (!mw_is_cwnd_limited(sk))
		return;
	w = mw_window_of(sk);
	mw_window_on_ack(&w, acked, mw_ghs_increase(w.cwnd, mw_ghs(sk)->mode));
	mw_window_store(sk, &w);
}

SEC("struct_ops/mw_ghs_ssthresh")
__u32 BPF_PROG(mw_ghs_ssthresh, struct sock *sk)
{
	return mw_ssthresh_after_loss(mw_tcp_sk(sk)->snd_cwnd);
}

SEC("struct_ops/mw_ghs_set_state")
void BPF_PROG(mw_ghs_set_state, struct sock *sk, __u8 new_state)
{
	/* A retransmission timeout: the path may have changed; forget its RTTs. */
	if (new_state == MW_TCP_CA_LOSS)
		mw_ghs_on_timeout(mw_ghs(sk));
}

SEC("struct_ops/mw_ghs_undo_cwnd")
__u32 BPF_PROG(mw_ghs_undo_cwnd, struct sock *sk)
{
	return mw_undo_cwnd(sk);
}

SEC(".struct_ops.link")
struct tcp_congestion_ops mw_gentle_hs = {
	.init = (void *)mw_ghs_init,
	.pkts_acked = (void *)mw_ghs_pkts_acked,
	.cong_avoid = (void *)mw_ghs_cong_avoid,
	.ssthresh = (void *)mw_ghs_ssthresh,
	.set_state = (void *)mw_ghs_set_state,
	.undo_cwnd = (void *)mw_ghs_undo_cwnd,
	.name = "mw_gentle_hs",
};
