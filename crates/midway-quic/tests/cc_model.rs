//! midway's congestion controls on quinn, checked against midway-cc's model: event traces (ACK
//! frames of packets in bytes, losses, persistent congestion, MTU changes) drive the quinn
//! controller, and after every event its window must be the model's, fed the same trace in
//! segments by hand. Also the names of every congestion control and the initial window each
//! factory builds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use midway_cc::gentle_highspeed::{GentleHighSpeed, Mode};
use midway_cc::highspeed::{self, HighSpeed};
use midway_cc::window::Window;
use midway_quic::cc::{
    CongestionControl, GentleHighSpeedController, HighSpeedController, ModelConfig,
    ModelController, WindowModel, MIN_WINDOW_SEGMENTS,
};
use quinn::congestion::{Controller, ControllerFactory};

const MTU: u16 = 1200;
const MSS: u64 = MTU as u64;

/// A quinn controller and the midway-cc model it must agree with, on a clock in milliseconds.
struct Run<M: WindowModel> {
    quic: ModelController<M>,
    reference: M,
    start: Instant,
}

impl<M: WindowModel> Run<M> {
    /// Built by the factory, as quinn builds it, at quinn's initial MTU.
    fn built() -> Self {
        let start = Instant::now();
        let controller = Arc::new(ModelConfig::<M>::default()).build(start, MTU);
        let quic = *controller
            .into_any()
            .downcast::<ModelController<M>>()
            .unwrap();
        Self {
            quic,
            reference: M::new(10),
            start,
        }
    }

    /// Mid-connection, in congestion avoidance at `cwnd` segments.
    fn avoiding_at(cwnd: u32, reference: M) -> Self {
        assert_eq!(reference.window().cwnd, cwnd);
        Self {
            quic: ModelController::with_model(reference.clone(), MTU),
            reference,
            start: Instant::now(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    /// One ACK frame at `now_ms` for packets `(sent_ms, bytes)`, as quinn reports it.
    fn frame(&mut self, now_ms: u64, packets: &[(u64, u64)]) {
        self.frame_limited(now_ms, packets, false);
    }

    fn frame_limited(&mut self, now_ms: u64, packets: &[(u64, u64)], app_limited: bool) {
        let now = self.at(now_ms);
        for &(sent_ms, bytes) in packets {
            self.quic
                .on_packet_acked(now, self.at(sent_ms), bytes, app_limited);
        }
        self.quic.on_end_acks(now, 0, app_limited, None);
    }

    fn loss(&mut self, now_ms: u64, sent_ms: u64, persistent: bool) {
        let (now, sent) = (self.at(now_ms), self.at(sent_ms));
        self.quic.on_congestion_event(now, sent, persistent, MSS);
    }

    /// The quinn controller's window is the model's, in segments of the current size, never
    /// under QUIC's two-datagram minimum.
    fn check(&self) {
        let window = self.reference.window();
        assert_eq!(self.quic.model().window(), window);
        // The whole model, the RTT state and mode of gentle HighSpeed included.
        assert_eq!(
            format!("{:?}", self.quic.model()),
            format!("{:?}", self.reference)
        );
        let segments = u64::from(window.cwnd.max(MIN_WINDOW_SEGMENTS));
        assert_eq!(self.quic.window(), segments * self.quic.segment_size());
    }

    fn cwnd(&self) -> u32 {
        self.reference.window().cwnd
    }

    /// One round-trip from `sent_ms`: the window's worth of full-size packets, acknowledged
    /// two to a frame `rtt_ms` later, each frame checked against the model.
    fn round_trip(&mut self, sent_ms: u64, rtt_ms: u64) -> u64 {
        let mut left = self.cwnd();
        while left > 0 {
            let packets = left.min(2);
            left -= packets;
            self.frame(sent_ms + rtt_ms, &vec![(sent_ms, MSS); packets as usize]);
            self.reference.on_rtt_sample(micros(rtt_ms));
            self.reference.on_ack(packets);
            self.check();
        }
        sent_ms + rtt_ms
    }
}

fn micros(ms: u64) -> u32 {
    u32::try_from(ms * 1000).unwrap()
}

fn avoiding(cwnd: u32) -> Window {
    Window {
        cwnd,
        cwnd_cnt: 0,
        ssthresh: cwnd,
    }
}

#[test]
fn names_round_trip_and_all_lists_every_variant_once() {
    let names: Vec<_> = CongestionControl::ALL.iter().map(|cc| cc.name()).collect();
    assert_eq!(
        names,
        ["newreno", "cubic", "bbr", "highspeed", "gentle_highspeed"]
    );
    for cc in CongestionControl::ALL {
        assert_eq!(cc.name().parse::<CongestionControl>().unwrap(), cc);
    }
    for unknown in ["reno", "HighSpeed", "gentle-highspeed", ""] {
        let error = unknown.parse::<CongestionControl>().unwrap_err();
        assert_eq!(error.name(), unknown);
        let message = error.to_string();
        assert!(message.contains(&format!("{unknown:?}")), "{message}");
        assert!(
            message.ends_with("newreno, cubic, bbr, highspeed, gentle_highspeed"),
            "{message}"
        );
    }
}

#[test]
fn every_factory_builds_a_sane_initial_window() {
    let now = Instant::now();
    for mtu in [1200_u16, 1452] {
        for cc in CongestionControl::ALL {
            let controller = cc.factory().build(now, mtu);
            let window = controller.window();
            assert_eq!(window, controller.initial_window(), "{}", cc.name());
            // RFC 9002 §7.2: min(10 * mss, max(2 * mss, 14720)); quinn's BBR starts at its
            // K_MAX_INITIAL_CONGESTION_WINDOW of 200 datagrams of 1200 bytes instead.
            let most = match cc {
                CongestionControl::Bbr => 200 * 1200,
                _ => 14_720,
            };
            assert!(
                (2 * u64::from(mtu)..=most).contains(&window),
                "{} at {mtu}: {window}",
                cc.name()
            );
        }
    }
    // midway's two are midway-cc's models in slow start with ten segments, not quinn's NewReno.
    let highspeed = CongestionControl::HighSpeed.factory().build(now, MTU);
    let highspeed = highspeed
        .into_any()
        .downcast::<HighSpeedController>()
        .unwrap();
    assert_eq!(highspeed.model().window(), Window::new(10));
    let gentle = CongestionControl::GentleHighSpeed.factory().build(now, MTU);
    let gentle = gentle
        .into_any()
        .downcast::<GentleHighSpeedController>()
        .unwrap();
    assert_eq!(gentle.model().window(), Window::new(10));
    assert_eq!(gentle.model().mode(), Mode::HighSpeed);
}

/// Slow start to 5120 segments, a loss there, and congestion avoidance in the large-window
/// region where HighSpeed TCP keeps more than half and adds more than one segment per
/// round-trip.
fn slow_start_loss_and_large_window_avoidance<M: WindowModel>() {
    let mut run = Run::<M>::built();
    run.check();
    let mut t = 0;
    while run.cwnd() < 5000 {
        t = run.round_trip(t, 20);
    }
    assert_eq!(run.cwnd(), 5120);

    // A loss of the last packet sent: the window falls to (1 - b(5120)) * 5120 at once.
    run.loss(t + 5, t, false);
    run.reference.on_loss();
    run.reference.on_recovery_end();
    run.check();
    let ssthresh = highspeed::ssthresh_after_loss(5120);
    assert_eq!(run.cwnd(), ssthresh);
    assert!(ssthresh > 5120 / 2 + 1000, "{ssthresh}");

    // Congestion avoidance from packets sent after the loss: a(w) segments per round-trip.
    let mut t = t + 10;
    for _ in 0..3 {
        let before = run.cwnd();
        t = run.round_trip(t, 20);
        let grown = run.cwnd() - before;
        assert!(
            grown >= highspeed::table_increase(before),
            "{before}: {grown}"
        );
        assert!(grown > 1, "{before}: {grown}");
    }
}

#[test]
fn highspeed_follows_the_model_through_slow_start_a_loss_and_large_windows() {
    slow_start_loss_and_large_window_avoidance::<HighSpeed>();
}

#[test]
fn gentle_highspeed_follows_the_model_through_slow_start_a_loss_and_large_windows() {
    slow_start_loss_and_large_window_avoidance::<GentleHighSpeed>();
}

/// Bytes count towards whole segments, the rest carried to the next frame.
fn partial_segments_are_carried<M: WindowModel>() {
    let mut run = Run::<M>::built();
    run.frame(20, &[(0, 700)]);
    run.reference.on_rtt_sample(micros(20));
    run.check();
    assert_eq!(run.quic.acked_bytes(), 700);
    // 1400 bytes: one segment, 200 carried.
    run.frame(21, &[(1, 700)]);
    run.reference.on_rtt_sample(micros(20));
    run.reference.on_ack(1);
    run.check();
    assert_eq!(run.quic.acked_bytes(), 200);
    // 200 + 3 * 1200 = 3800: three segments, 200 carried.
    run.frame(22, &[(2, MSS), (2, MSS), (2, MSS)]);
    run.reference.on_rtt_sample(micros(20));
    run.reference.on_ack(3);
    run.check();
    assert_eq!(run.quic.acked_bytes(), 200);
    assert_eq!(run.cwnd(), 14);
}

#[test]
fn partial_segments_are_carried_to_the_next_frame() {
    partial_segments_are_carried::<HighSpeed>();
    partial_segments_are_carried::<GentleHighSpeed>();
}

/// One reduction per recovery period: losses and ACKs of packets sent up to the reduction are
/// ignored; the first loss of a packet sent after it reduces again.
fn one_reduction_per_recovery_period<M: WindowModel>(reference: M) {
    let mut run = Run::avoiding_at(1000, reference);
    run.loss(100, 90, false);
    run.reference.on_loss();
    run.reference.on_recovery_end();
    run.check();
    assert_eq!(run.cwnd(), 660);
    assert_eq!(run.quic.recovery_start(), Some(run.at(100)));

    // More losses from before the reduction, even one declared persistent: nothing.
    run.loss(110, 95, false);
    run.loss(111, 100, true);
    run.check();
    // ACKs of packets sent before the reduction do not grow the window (their RTTs still count).
    run.frame(115, &[(95, MSS), (96, MSS), (100, MSS)]);
    run.reference.on_rtt_sample(micros(15));
    run.check();
    assert_eq!(run.quic.acked_bytes(), 0);
    // A frame mixing both: only the packet sent after the reduction counts.
    run.frame(121, &[(100, MSS), (101, MSS)]);
    run.reference.on_rtt_sample(micros(20));
    run.reference.on_ack(1);
    run.check();
    assert_eq!(run.reference.window().cwnd_cnt, 1);
    run.frame(125, &[(105, MSS), (105, MSS), (105, MSS)]);
    run.reference.on_rtt_sample(micros(20));
    run.reference.on_ack(3);
    run.check();
    assert_eq!(run.reference.window().cwnd_cnt, 4);

    // A packet sent after the reduction is lost: a second period, from 660.
    run.loss(130, 105, false);
    run.reference.on_loss();
    run.reference.on_recovery_end();
    run.check();
    assert_eq!(run.cwnd(), highspeed::ssthresh_after_loss(660));
    assert_eq!(run.quic.recovery_start(), Some(run.at(130)));
}

#[test]
fn highspeed_reduces_once_per_recovery_period() {
    one_reduction_per_recovery_period(HighSpeed::with_window(avoiding(1000)));
}

#[test]
fn gentle_highspeed_reduces_once_per_recovery_period() {
    one_reduction_per_recovery_period(GentleHighSpeed::with_window(avoiding(1000)));
}

/// Persistent congestion is the model's timeout: `ssthresh` from `b(w)`, one segment in the
/// model, QUIC's two-datagram minimum on the wire, and slow start with no recovery period.
fn persistent_congestion_is_a_timeout<M: WindowModel>(reference: M) {
    let mut run = Run::avoiding_at(1000, reference);
    run.loss(500, 200, true);
    run.reference.on_retransmission_timeout();
    run.check();
    assert_eq!(
        run.quic.model().window(),
        Window {
            cwnd: 1,
            cwnd_cnt: 0,
            ssthresh: 660
        }
    );
    assert_eq!(run.quic.window(), 2 * MSS);
    assert_eq!(run.quic.recovery_start(), None);
    // Packets sent before it still count: slow start from one segment.
    run.frame(510, &[(300, MSS), (301, MSS), (302, MSS)]);
    run.reference.on_rtt_sample(micros(208));
    run.reference.on_ack(3);
    run.check();
    assert_eq!(run.cwnd(), 4);
    // The next loss reduces again.
    run.loss(520, 505, false);
    run.reference.on_loss();
    run.reference.on_recovery_end();
    run.check();
    assert_eq!(run.cwnd(), 2);
}

#[test]
fn highspeed_treats_persistent_congestion_as_a_timeout() {
    persistent_congestion_is_a_timeout(HighSpeed::with_window(avoiding(1000)));
}

#[test]
fn gentle_highspeed_treats_persistent_congestion_as_a_timeout() {
    let mut reference = GentleHighSpeed::with_window(avoiding(1000));
    reference.on_rtt_sample(18_000);
    for _ in 0..6 {
        reference.on_rtt_sample(30_000);
    }
    assert_eq!(reference.mode(), Mode::Reno);
    persistent_congestion_is_a_timeout(reference);
}

#[test]
fn gentle_highspeed_forgets_its_rtts_on_persistent_congestion() {
    let mut run = Run::avoiding_at(1000, GentleHighSpeed::with_window(avoiding(1000)));
    run.frame(18, &[(0, MSS)]);
    for k in 0..6 {
        run.frame(100 + k, &[(70 + k, MSS)]);
    }
    assert_eq!(run.quic.model().mode(), Mode::Reno);
    run.loss(200, 150, true);
    assert_eq!(run.quic.model().mode(), Mode::HighSpeed);
    assert_eq!(run.quic.model().rtt().smoothed_us(), None);
}

/// The window keeps its segments when the MTU changes: its bytes rescale, and ACKs count in
/// segments of the new size, bytes carried across the change included.
fn mtu_changes_rescale<M: WindowModel>() {
    let mut run = Run::<M>::built();
    run.frame(20, &[(0, 600)]);
    run.reference.on_rtt_sample(micros(20));
    run.check();
    // MTU discovery finds 1452 bytes: 10 segments are 14520 bytes.
    run.quic.on_mtu_update(1452);
    assert_eq!(run.quic.segment_size(), 1452);
    run.check();
    assert_eq!(run.quic.window(), 14_520);
    // 600 carried + 1452 + 1452 = 3504: two segments of 1452, 600 carried.
    run.frame(40, &[(20, 1452), (20, 1452)]);
    run.reference.on_rtt_sample(micros(20));
    run.reference.on_ack(2);
    run.check();
    assert_eq!(run.quic.acked_bytes(), 600);
    // An MTU probe acked in the middle of a frame: quinn updates the MTU between two acks.
    run.quic
        .on_packet_acked(run.at(60), run.at(40), 1452, false);
    run.quic.on_mtu_update(1500);
    run.quic
        .on_packet_acked(run.at(60), run.at(40), 1500, false);
    run.quic.on_end_acks(run.at(60), 0, false, None);
    // 600 + 1452 + 1500 = 3552 bytes of 1500: two segments, 552 carried.
    run.reference.on_rtt_sample(micros(20));
    run.reference.on_ack(2);
    run.check();
    assert_eq!(run.quic.acked_bytes(), 552);
    assert_eq!(run.quic.window(), 14 * 1500);
    // A black hole: back to 1200 bytes, the same 14 segments.
    run.quic.on_mtu_update(1200);
    run.check();
    assert_eq!(run.quic.window(), 14 * 1200);
    // A loss after the change reduces the same segments.
    run.loss(80, 70, false);
    run.reference.on_loss();
    run.reference.on_recovery_end();
    run.check();
    assert_eq!(run.quic.window(), 7 * 1200);
}

#[test]
fn both_rescale_on_mtu_changes() {
    mtu_changes_rescale::<HighSpeed>();
    mtu_changes_rescale::<GentleHighSpeed>();
}

#[test]
fn app_limited_acks_do_not_grow_the_window() {
    let mut run = Run::avoiding_at(1000, GentleHighSpeed::with_window(avoiding(1000)));
    run.frame_limited(20, &[(0, MSS), (1, MSS)], true);
    // The RTT sample still counts; the segments do not.
    run.reference.on_rtt_sample(micros(19));
    run.check();
    assert_eq!(run.quic.acked_bytes(), 0);
    assert_eq!(run.quic.model().rtt().smoothed_us(), Some(19_000));
}

#[test]
fn the_sample_is_the_newest_packet_s_rtt_and_comes_before_the_growth() {
    // Reno mode at 1000 with 500 segments counted, as in midway-cc's own switch test. RTT-only
    // frames are application-limited: their samples count, their bytes do not.
    let mut run = Run::avoiding_at(1000, GentleHighSpeed::with_window(avoiding(1000)));
    run.frame_limited(18, &[(0, MSS)], true);
    run.reference.on_rtt_sample(18_000);
    for k in 0..6 {
        run.frame_limited(100 + k, &[(70 + k, MSS)], true);
        run.reference.on_rtt_sample(30_000);
    }
    run.check();
    assert_eq!(run.quic.model().mode(), Mode::Reno);
    for k in 0..500 {
        run.frame(200 + k, &[(170 + k, MSS)]);
        run.reference.on_rtt_sample(30_000);
        run.reference.on_ack(1);
    }
    run.check();
    assert_eq!(
        run.quic.model().window(),
        Window {
            cwnd: 1000,
            cwnd_cnt: 500,
            ssthresh: 1000
        }
    );
    // The queue drains: 18 ms samples, up to the last one that keeps Reno mode...
    let mut t = 1000;
    loop {
        let mut next = run.reference;
        next.on_rtt_sample(18_000);
        if next.mode() == Mode::HighSpeed {
            break;
        }
        run.frame_limited(t, &[(t - 18, MSS)], true);
        run.reference = next;
        t += 1;
    }
    run.check();
    assert_eq!(run.quic.model().mode(), Mode::Reno);
    // ...then a frame whose newest packet took 18 ms (its older one 40 ms) switches to
    // HighSpeed mode before its segment counts: a = 7, so the 500 counted pay one segment and
    // counting restarts at 1. The other way round, Reno mode would have counted 501.
    run.frame(t, &[(t - 40, MSS / 2), (t - 18, MSS / 2)]);
    run.reference.on_rtt_sample(18_000);
    run.reference.on_ack(1);
    run.check();
    assert_eq!(run.quic.model().mode(), Mode::HighSpeed);
    assert_eq!((run.cwnd(), run.quic.model().window().cwnd_cnt), (1001, 1));
}

#[test]
fn gentle_highspeed_grows_by_a_of_w_on_an_empty_path_and_by_one_on_a_filling_one() {
    let mut run = Run::avoiding_at(1000, GentleHighSpeed::with_window(avoiding(1000)));
    // 18 ms: HighSpeed mode, a(1000) = 7 per round-trip.
    let t = run.round_trip(0, 18);
    assert_eq!(run.quic.model().mode(), Mode::HighSpeed);
    assert_eq!(run.cwnd(), 1007);
    // The queue fills to 30 ms: within this round-trip Reno mode, one segment per round-trip.
    let t = run.round_trip(t, 30);
    assert_eq!(run.quic.model().mode(), Mode::Reno);
    let before = run.cwnd();
    run.round_trip(t, 30);
    assert_eq!(run.cwnd(), before + 1);
    // HighSpeed TCP on the same path keeps adding a(w).
    let mut run = Run::avoiding_at(1000, HighSpeed::with_window(avoiding(1000)));
    let t = run.round_trip(0, 18);
    let t = run.round_trip(t, 30);
    let before = run.cwnd();
    run.round_trip(t, 30);
    assert_eq!(run.cwnd(), before + 7);
}
