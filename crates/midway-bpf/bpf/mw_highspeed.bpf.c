// SPDX-License-Identifier: GPL-2.0
/*
 * mw_highspeed: HighSpeed TCP (RFC 3649) as a BPF struct_ops congestion control. Reno's slow
 * start, a(w) segments per round-trip in congestion avoidance and (1 - b(w)) * w on a loss, with
 * a(w) and b(w) from RFC 3649 Appendix B (mw_cc.h; the reference is crates/midway-cc's
 * highspeed module). Registered by crates/midway-bpf through a link, so it is unregistered when
 * the link (the midway that registered it) goes away.
 */
#include "mw_cc.h"

char _license[] SEC("license") = "GPL";

SEC("struct_ops/mw_hs_init")
void BPF_PROG(mw_hs_init, struct sock *sk)
{
}

SEC("struct_ops/mw_hs_cong_avoid")
void BPF_PROG(mw_hs_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct mw_window w;

	if (!mw_is_cwnd_limited(sk))
		return;
	w = mw_window_of(sk);
	mw_window_on_ack(&w, acked, mw_table_increase(w.cwnd));
	mw_window_store(sk, &w);
}

SEC("struct_ops/mw_hs_ssthresh")
__u32 BPF_PROG(mw_hs_ssthresh, struct sock *sk)
{
	return mw_ssthresh_after_loss(mw_tcp_sk(sk)->snd_cwnd);
}

SEC("struct_ops/mw_hs_undo_cwnd")
__u32 BPF_PROG(mw_hs_undo_cwnd, struct sock *sk)
{
	return mw_undo_cwnd(sk);
}

SEC(".struct_ops.link")
struct tcp_congestion_ops mw_highspeed = {
	.init = (void *)mw_hs_init,
	.cong_avoid = (void *)mw_hs_cong_avoid,
	.ssthresh = (void *)mw_hs_ssthresh,
	.undo_cwnd = (void *)mw_hs_undo_cwnd,
	.name = "mw_highspeed",
};
