//! The BPF congestion controls' arithmetic against the reference model, `midway-cc`, exactly.
//!
//! `bpf/mw_check.bpf.c` puts the functions of `bpf/mw_cc.h` (the ones the `struct_ops` programs
//! call) behind one `SEC("syscall")` program. Each `BPF_PROG_TEST_RUN` passes it one operation
//! and a state as its context; the kernel runs the verified, JIT-compiled program and copies the
//! context back. Every result is compared with `midway-cc`:
//!
//! * the RFC 3649 table lookup and the decrease on a loss at every row's window and its
//!   neighbours, at every window from 0 to 90 000 and at windows up to `u32::MAX`;
//! * one ACK of many sizes on many window states (around every row, at and around `ssthresh`,
//!   with stale `cwnd_cnt` credit, near `u32::MAX`);
//! * HighSpeed TCP traces (slow start, congestion avoidance across rows, losses, recoveries,
//!   timeouts) and gentle HighSpeed TCP traces (RTT samples of a filling and draining queue,
//!   jitter, ACKs, losses, timeouts), state by state after every event.
//!
//! Needs root (loading BPF); skipped otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use libbpf_rs::{Object, ObjectBuilder, ProgramInput};
use midway_cc::gentle_highspeed::{GentleHighSpeed, Mode};
use midway_cc::highspeed::{self, HighSpeed, AIMD_TABLE};
use midway_cc::window::Window;

/// The check program's operations (`enum mw_check_op` in `bpf/mw_check.bpf.c`).
mod op {
    pub(crate) const TABLE_ROW: u32 = 1;
    pub(crate) const SSTHRESH: u32 = 2;
    pub(crate) const HS_ACK: u32 = 3;
    pub(crate) const LOSS: u32 = 4;
    pub(crate) const RECOVERY_END: u32 = 5;
    pub(crate) const HS_TIMEOUT: u32 = 6;
    pub(crate) const GHS_SAMPLE: u32 = 7;
    pub(crate) const GHS_ACK: u32 = 8;
    pub(crate) const GHS_TIMEOUT: u32 = 9;
}

/// `struct mw_check`: thirteen `__u32`s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Check {
    op: u32,
    arg: u32,
    cwnd: u32,
    cwnd_cnt: u32,
    ssthresh: u32,
    srtt_x8_us: u32,
    min_us: u32,
    max_us: u32,
    have_sample: u32,
    mode: u32,
    out: [u32; 3],
}

impl Check {
    fn to_words(self) -> [u32; 13] {
        [
            self.op,
            self.arg,
            self.cwnd,
            self.cwnd_cnt,
            self.ssthresh,
            self.srtt_x8_us,
            self.min_us,
            self.max_us,
            self.have_sample,
            self.mode,
            self.out[0],
            self.out[1],
            self.out[2],
        ]
    }

    fn from_words(w: [u32; 13]) -> Check {
        Check {
            op: w[0],
            arg: w[1],
            cwnd: w[2],
            cwnd_cnt: w[3],
            ssthresh: w[4],
            srtt_x8_us: w[5],
            min_us: w[6],
            max_us: w[7],
            have_sample: w[8],
            mode: w[9],
            out: [w[10], w[11], w[12]],
        }
    }

    fn window(&self) -> Window {
        Window {
            cwnd: self.cwnd,
            cwnd_cnt: self.cwnd_cnt,
            ssthresh: self.ssthresh,
        }
    }

    fn set_window(&mut self, window: Window) {
        self.cwnd = window.cwnd;
        self.cwnd_cnt = window.cwnd_cnt;
        self.ssthresh = window.ssthresh;
    }
}

/// The loaded check program.
struct Bpf {
    object: Object,
}

static CHECK_OBJECT: &[u8] = include_bytes!("../bpf/mw_check.bpf.o");

impl Bpf {
    fn load() -> Option<Bpf> {
        if !midway_testkit::host::is_root() {
            eprintln!("skipped: loading BPF programs needs root");
            return None;
        }
        // libelf reads the headers in place: hand it an 8-byte aligned copy.
        let mut aligned = vec![0u64; CHECK_OBJECT.len().div_ceil(8)];
        let bytes: &mut [u8] = bytemuck_cast(&mut aligned);
        bytes[..CHECK_OBJECT.len()].copy_from_slice(CHECK_OBJECT);
        let open = ObjectBuilder::default()
            .open_memory(&bytes[..CHECK_OBJECT.len()])
            .unwrap();
        let object = open.load().unwrap();
        Some(Bpf { object })
    }

    /// Runs one operation on `state` and returns the state the program wrote back.
    fn run(&self, state: Check) -> Check {
        let mut bytes: Vec<u8> = state
            .to_words()
            .iter()
            .flat_map(|word| word.to_ne_bytes())
            .collect();
        let program = self
            .object
            .progs_mut()
            .find(|program| program.name() == "mw_check")
            .unwrap();
        let input = ProgramInput {
            context_in: Some(&mut bytes),
            ..ProgramInput::default()
        };
        let return_value = program.test_run(input).unwrap().return_value;
        assert_eq!(return_value, 0, "mw_check refused {state:?}");
        let mut words = [0u32; 13];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(4)) {
            *word = u32::from_ne_bytes(chunk.try_into().unwrap());
        }
        Check::from_words(words)
    }
}

fn bytemuck_cast(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: u8 has no alignment or validity requirements; the length covers the same memory.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) }
}

/// A small deterministic generator (xorshift64*), so a failing case is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: u64) -> u32 {
        (self.next() % bound) as u32
    }
}

/// Every row's window and its two neighbours, the ends of the `u32` range and a geometric
/// series of windows up to `u32::MAX`.
fn boundary_windows() -> Vec<u32> {
    let mut windows = vec![0, 1, 2, 3, u32::MAX - 1, u32::MAX];
    for row in AIMD_TABLE {
        windows.extend([row.window - 1, row.window, row.window + 1]);
    }
    let mut w: u64 = 1;
    while w <= u64::from(u32::MAX) {
        windows.push(w as u32);
        w = w * 5 / 4 + 1;
    }
    windows
}

#[test]
fn table_lookup_and_loss_decrease_match_the_model() {
    let Some(bpf) = Bpf::load() else { return };
    let windows: Vec<u32> = boundary_windows().into_iter().chain(0..=90_000).collect();
    for cwnd in windows {
        let row = bpf.run(Check {
            op: op::TABLE_ROW,
            arg: cwnd,
            ..Check::default()
        });
        let index = highspeed::table_row_index(cwnd);
        let expected = AIMD_TABLE[index];
        assert_eq!(
            row.out,
            [
                index as u32,
                expected.increase,
                expected.decrease_hundredths
            ],
            "row of cwnd {cwnd}"
        );
        let loss = bpf.run(Check {
            op: op::SSTHRESH,
            arg: cwnd,
            ..Check::default()
        });
        assert_eq!(
            loss.out[0],
            highspeed::ssthresh_after_loss(cwnd),
            "ssthresh after a loss at cwnd {cwnd}"
        );
    }
}

#[test]
fn one_ack_on_many_window_states_matches_the_model() {
    let Some(bpf) = Bpf::load() else { return };
    let mut rng = Rng(0x6d69_6477_6179_6263);
    let mut states = Vec::new();
    for cwnd in boundary_windows() {
        for ssthresh in [
            0,
            2,
            cwnd.saturating_sub(1),
            cwnd,
            cwnd.saturating_add(1),
            cwnd.saturating_add(5),
            0x7fff_ffff,
            u32::MAX,
        ] {
            for cwnd_cnt in [0, 1, cwnd / 2, cwnd, cwnd.saturating_add(7), u32::MAX] {
                states.push(Window {
                    cwnd,
                    cwnd_cnt,
                    ssthresh,
                });
            }
        }
    }
    for _ in 0..20_000 {
        let cwnd = rng.below(200_000);
        states.push(Window {
            cwnd,
            cwnd_cnt: rng.below(u64::from(cwnd) + 10),
            ssthresh: if rng.below(4) == 0 {
                u32::MAX
            } else {
                rng.below(200_000)
            },
        });
    }
    let mut compared = 0;
    for (n, window) in states.into_iter().enumerate() {
        let acked = [0, 1, 2, 3, 7, 45, 64, 1000, 65_535, u32::MAX][n % 10];
        for (operation, mode) in [(op::HS_ACK, 0), (op::GHS_ACK, 0), (op::GHS_ACK, 1)] {
            let mut state = Check {
                op: operation,
                arg: acked,
                mode,
                ..Check::default()
            };
            state.set_window(window);
            let after = bpf.run(state).window();
            let mut expected = window;
            let increase = if mode == 1 {
                1
            } else {
                highspeed::table_increase(window.cwnd)
            };
            expected.on_ack(acked, increase);
            assert_eq!(
                after, expected,
                "op {operation} mode {mode}: {window:?} + {acked} acked"
            );
            compared += 1;
        }
    }
    eprintln!("{compared} single ACKs compared");
}

/// A HighSpeed TCP event, as the kernel calls the congestion control.
#[derive(Debug, Clone, Copy)]
enum Event {
    Ack(u32),
    Loss,
    Timeout,
    Rtt(u32),
}

#[test]
fn highspeed_traces_match_the_model_event_by_event() {
    let Some(bpf) = Bpf::load() else { return };
    let mut rng = Rng(0x4853_5443_5033_3634);
    // (start, losses per 10 000 events, whether ACKs are large stretch ACKs): small windows
    // with frequent losses, and long climbs through every row of the table with rare ones.
    let starts = [
        (HighSpeed::new(10), 40, false),
        (HighSpeed::new(1), 10, false),
        (
            HighSpeed::with_window(Window {
                cwnd: 216,
                cwnd_cnt: 0,
                ssthresh: 216,
            }),
            5,
            false,
        ),
        (
            HighSpeed::with_window(Window {
                cwnd: 38,
                cwnd_cnt: 0,
                ssthresh: 38,
            }),
            2,
            true,
        ),
        (
            HighSpeed::with_window(Window {
                cwnd: 83_000,
                cwnd_cnt: 0,
                ssthresh: 80_000,
            }),
            2,
            true,
        ),
    ];
    let mut events_run = 0;
    let mut rows_seen = std::collections::BTreeSet::new();
    for (trace, (start, losses, stretch)) in starts.into_iter().enumerate() {
        let mut model = start;
        let mut state = Check::default();
        state.set_window(model.window());
        for step in 0..8_000 {
            let cwnd = model.window().cwnd.max(1);
            rows_seen.insert(highspeed::table_row_index(cwnd));
            let draw = rng.below(10_000);
            let event = if draw < losses {
                Event::Loss
            } else if draw == 9_999 {
                Event::Timeout
            } else if stretch {
                // A quarter to a whole window per ACK: a climb through the rows.
                Event::Ack(cwnd / 4 + rng.below(u64::from(cwnd)))
            } else {
                match draw % 10 {
                    0..=6 => Event::Ack(1),
                    7..=8 => Event::Ack(2),
                    _ => Event::Ack(rng.below(64)),
                }
            };
            state.op = match event {
                Event::Ack(acked) => {
                    state.arg = acked;
                    model.on_ack(acked);
                    op::HS_ACK
                }
                Event::Loss => {
                    model.on_loss();
                    op::LOSS
                }
                Event::Timeout => {
                    model.on_retransmission_timeout();
                    op::HS_TIMEOUT
                }
                Event::Rtt(_) => unreachable!(),
            };
            state = bpf.run(state);
            assert_eq!(
                state.window(),
                model.window(),
                "trace {trace} step {step} after {event:?}"
            );
            if matches!(event, Event::Loss) {
                state.op = op::RECOVERY_END;
                model.on_recovery_end();
                state = bpf.run(state);
                assert_eq!(
                    state.window(),
                    model.window(),
                    "trace {trace} step {step} after the recovery"
                );
            }
            events_run += 1;
        }
        eprintln!("highspeed trace {trace}: ends at {:?}", model.window());
    }
    // The climbs must have run through (nearly) the whole table.
    assert!(rows_seen.len() >= 60, "rows visited: {}", rows_seen.len());
    eprintln!("{events_run} HighSpeed events compared");
}

/// One RTT sample of a trace: a base RTT plus a queue that fills and drains, with jitter.
fn rtt_pattern(rng: &mut Rng, step: u32, base_us: u32) -> u32 {
    let phase = step % 400;
    let queue_us = if phase < 200 {
        phase * 100
    } else {
        (400 - phase) * 100
    };
    base_us + queue_us + rng.below(300)
}

fn mode_word(mode: Mode) -> u32 {
    match mode {
        Mode::HighSpeed => 0,
        Mode::Reno => 1,
    }
}

#[test]
fn gentle_highspeed_traces_match_the_model_event_by_event() {
    let Some(bpf) = Bpf::load() else { return };
    let mut rng = Rng(0x6748_5354_4350_0001);
    let mut events_run = 0;
    let mut mode_changes = 0;
    for (trace, (start, base_us)) in [
        (GentleHighSpeed::new(10), 18_000),
        (GentleHighSpeed::new(10), 200),
        (
            GentleHighSpeed::with_window(Window {
                cwnd: 5_000,
                cwnd_cnt: 0,
                ssthresh: 5_000,
            }),
            100_000,
        ),
        // RTTs near u32::MAX: the saturating smoothing.
        (GentleHighSpeed::new(10), u32::MAX - 100_000),
    ]
    .into_iter()
    .enumerate()
    {
        let mut model = start;
        let mut state = Check::default();
        state.set_window(model.window());
        let mut previous_mode = model.mode();
        for step in 0..8_000u32 {
            let event = match rng.below(1000) {
                0..=2 => Event::Loss,
                3 => Event::Timeout,
                4..=449 => Event::Rtt(rtt_pattern(&mut rng, step, base_us)),
                450..=899 => Event::Ack(1),
                _ => Event::Ack(rng.below(64)),
            };
            state.op = match event {
                Event::Rtt(rtt_us) => {
                    state.arg = rtt_us;
                    model.on_rtt_sample(rtt_us);
                    op::GHS_SAMPLE
                }
                Event::Ack(acked) => {
                    state.arg = acked;
                    model.on_ack(acked);
                    op::GHS_ACK
                }
                Event::Loss => {
                    model.on_loss();
                    op::LOSS
                }
                Event::Timeout => {
                    model.on_retransmission_timeout();
                    op::GHS_TIMEOUT
                }
            };
            state = bpf.run(state);
            let context = format!("trace {trace} step {step} after {event:?}");
            assert_eq!(state.window(), model.window(), "{context}");
            assert_eq!(state.mode, mode_word(model.mode()), "{context}");
            let rtt = model.rtt();
            if let Some(smoothed) = rtt.smoothed_us() {
                assert_eq!(state.have_sample, 1, "{context}");
                assert_eq!(state.srtt_x8_us >> 3, smoothed, "{context}");
                assert_eq!(Some(state.min_us), rtt.min_us(), "{context}");
                assert_eq!(Some(state.max_us), rtt.max_us(), "{context}");
            } else {
                assert_eq!(state.have_sample, 0, "{context}");
            }
            if let Event::Rtt(_) = event {
                let thresholds = rtt.thresholds();
                assert_eq!(state.out[0], u32::from(thresholds.is_some()), "{context}");
                if let Some(thresholds) = thresholds {
                    assert_eq!(
                        [state.out[1], state.out[2]],
                        [thresholds.lower_us, thresholds.upper_us],
                        "{context}"
                    );
                }
            }
            if model.mode() != previous_mode {
                mode_changes += 1;
                previous_mode = model.mode();
            }
            if matches!(event, Event::Loss) {
                state.op = op::RECOVERY_END;
                model.on_recovery_end();
                state = bpf.run(state);
                assert_eq!(state.window(), model.window(), "{context}: recovery");
            }
            events_run += 1;
        }
    }
    eprintln!("{events_run} gentle HighSpeed events compared, {mode_changes} mode changes");
    // The traces must exercise the switch both ways, or they prove little.
    assert!(mode_changes >= 10, "{mode_changes} mode changes");
}
