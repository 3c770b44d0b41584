// SPDX-License-Identifier: GPL-2.0
/*
 * mw_check: the arithmetic of mw_cc.h behind one SEC("syscall") program, so that a test can run
 * it with BPF_PROG_TEST_RUN on inputs of its choosing and compare the outputs with the Rust
 * reference model (crates/midway-cc). Never registered or attached; used by
 * crates/midway-bpf/tests/arithmetic.rs only.
 *
 * The context is struct mw_check, copied in from user space and back out after the run. Each run
 * applies one operation to the state in it.
 */
#include "mw_cc.h"

char _license[] SEC("license") = "GPL";

enum mw_check_op {
	MW_OP_TABLE_ROW = 1,      /* out0..2 = index, a, b of the row for arg */
	MW_OP_SSTHRESH = 2,       /* out0 = ssthresh_after_loss(arg) */
	MW_OP_HS_ACK = 3,         /* HighSpeed::on_ack(arg) */
	MW_OP_LOSS = 4,           /* on_loss() (both algorithms), out0 = new ssthresh */
	MW_OP_RECOVERY_END = 5,   /* on_recovery_end() (both) */
	MW_OP_HS_TIMEOUT = 6,     /* HighSpeed::on_retransmission_timeout() */
	MW_OP_GHS_SAMPLE = 7,     /* GentleHighSpeed::on_rtt_sample(arg); out0..2 = thresholds */
	MW_OP_GHS_ACK = 8,        /* GentleHighSpeed::on_ack(arg) */
	MW_OP_GHS_TIMEOUT = 9,    /* GentleHighSpeed::on_retransmission_timeout() */
};

struct mw_check {
	__u32 op;
	__u32 arg;
	struct mw_window window;
	struct mw_rtt rtt;
	__u32 out[3];
};

SEC("syscall")
int mw_check(struct mw_check *ctx)
{
	struct mw_window w = ctx->window;
	struct mw_rtt r = ctx->rtt;
	struct mw_thresholds t;
	__u32 index;

	switch (ctx->op) {
	case MW_OP_TABLE_ROW:
		index = mw_table_row_index(ctx->arg);
		if (index >= MW_AIMD_ROWS)
			return 2;
		ctx->out[0] = index;
		ctx->out[1] = mw_aimd_table[index].increase;
		ctx->out[2] = mw_aimd_table[index].decrease_hundredths;
		return 0;
	case MW_OP_SSTHRESH:
		ctx->out[0] = mw_ssthresh_after_loss(ctx->arg);
		return 0;
	case MW_OP_HS_ACK:
		mw_window_on_ack(&w, ctx->arg, mw_table_increase(w.cwnd));
		break;
	case MW_OP_LOSS:
		ctx->out[0] = mw_window_on_loss(&w);
		break;
	case MW_OP_RECOVERY_END:
		mw_window_on_recovery_end(&w);
		break;
	case MW_OP_HS_TIMEOUT:
		mw_window_on_timeout(&w);
		break;
	case MW_OP_GHS_SAMPLE:
		mw_ghs_on_rtt_sample(&r, ctx->arg);
		t = mw_rtt_thresholds(&r);
		ctx->out[0] = t.defined;
		ctx->out[1] = t.lower_us;
		ctx->out[2] = t.upper_us;
		break;
	case MW_OP_GHS_ACK:
		mw_window_on_ack(&w, ctx->arg, mw_ghs_increase(w.cwnd, r.mode));
		break;
	case MW_OP_GHS_TIMEOUT:
		mw_window_on_timeout(&w);
		mw_ghs_on_timeout(&r);
		break;
	default:
		return 1;
	}
	ctx->window = w;
	ctx->rtt = r;
	return 0;
}
