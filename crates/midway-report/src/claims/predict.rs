//! Predicted shares: what each case's congestion control should get of a path, from its
//! response function ([`midway_cc::response`]) and the path as the records give it (the link's
//! rate, one-way delays and random loss), set beside what was measured. The prediction is made
//! from the path's parameters by this code, never typed into a claims file, so it is the same
//! before and after a run.
//!
//! ```toml
//! [[predictions]]
//! experiment = "long-fat"
//! link = "wan"            # the segment the congestion control runs on (between the midways)
//! direction = "b_to_a"    # the data's direction on that link (its rate and loss)
//! cases = { chain-reno = "reno", chain-highspeed = "highspeed" }   # case = congestion control
//! ```
//!
//! Window `w` (segments) from the response function at the link's loss rate `p`; throughput
//! `w * MSS * 8 / RTT` with the link's round trip (both directions' delays, no queue: a flow that
//! does not fill the path builds none), capped by the link's payload rate (its frame rate times
//! [`SEGMENT_BYTES`] / [`FRAME_BYTES`]); the share is that over the payload rate.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Deserialize;

use crate::analysis::{Analysis, Experiment};
use crate::markdown::cell;

/// Payload bytes of a full segment (Ethernet MTU 1500, IPv4, TCP with timestamps).
pub const SEGMENT_BYTES: f64 = 1448.0;
/// Bytes of that segment's frame as the emulator counts its rate (Ethernet header included).
pub const FRAME_BYTES: f64 = 1514.0;

/// A congestion control whose response function predicts a share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResponseFunction {
    /// Reno: Mathis' `1.22 / sqrt(p)`.
    Reno,
    /// HighSpeed TCP: RFC 3649's `0.12 / p^0.835`.
    Highspeed,
    /// gentle HighSpeed TCP: HighSpeed TCP's on a path it does not fill.
    GentleHighspeed,
}

impl ResponseFunction {
    fn window(self, p: f64) -> f64 {
        use midway_cc::response;
        match self {
            ResponseFunction::Reno => response::reno_window(p),
            ResponseFunction::Highspeed => response::highspeed_window(p),
            ResponseFunction::GentleHighspeed => response::gentle_highspeed_window(p),
        }
    }

    fn formula(self) -> &'static str {
        match self {
            ResponseFunction::Reno => "reno: 1.22 / sqrt(p)",
            ResponseFunction::Highspeed => "highspeed: 0.12 / p^0.835",
            ResponseFunction::GentleHighspeed => "gentle-highspeed: as highspeed below the BDP",
        }
    }
}

/// One `[[predictions]]` entry.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prediction {
    /// The experiment whose cases are predicted.
    pub experiment: String,
    /// The link the congestion control under test runs over.
    pub link: String,
    /// The data's direction on it: "a_to_b" or "b_to_a".
    pub direction: String,
    /// Each predicted case with its congestion control.
    pub cases: BTreeMap<String, ResponseFunction>,
}

impl Prediction {
    /// Why the entry cannot predict anything (`None`: it can).
    pub fn problem(&self) -> Option<String> {
        if self.cases.is_empty() {
            Some("no `cases` to predict".into())
        } else if !matches!(self.direction.as_str(), "a_to_b" | "b_to_a") {
            Some(format!(
                "direction `{}` is neither \"a_to_b\" nor \"b_to_a\"",
                self.direction
            ))
        } else {
            None
        }
    }
}

/// The segment a congestion control runs on, as its response function sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SegmentPath {
    /// The link's frame rate, bit/s.
    pub rate_bps: f64,
    /// The round trip over the link without a queue, seconds.
    pub rtt_s: f64,
    /// The random loss rate of the data's direction.
    pub loss: f64,
}

impl SegmentPath {
    /// The rate TCP payload can use, bit/s.
    pub fn payload_bps(&self) -> f64 {
        self.rate_bps * SEGMENT_BYTES / FRAME_BYTES
    }

    /// The predicted average window (segments) and payload rate (bit/s, capped by the path's).
    pub fn predict(&self, function: ResponseFunction) -> (f64, f64) {
        let window = function.window(self.loss);
        let rate = window * SEGMENT_BYTES * 8.0 / self.rtt_s;
        (window, rate.min(self.payload_bps()))
    }
}

/// The path of `prediction` from the experiment's fixed parameters, or why there is none.
fn path_of(prediction: &Prediction, experiment: &Experiment) -> Result<SegmentPath, String> {
    let number = |key: String| -> Result<f64, String> {
        experiment
            .fixed_params
            .iter()
            .find(|(name, _)| *name == key)
            .and_then(|(_, value)| value.parse::<f64>().ok())
            .ok_or_else(|| format!("the records give no single value of `{key}`"))
    };
    let link = &prediction.link;
    let direction = &prediction.direction;
    let rtt_ms =
        number(format!("{link}.a_to_b.delay_ms"))? + number(format!("{link}.b_to_a.delay_ms"))?;
    let path = SegmentPath {
        rate_bps: number(format!("{link}.{direction}.rate_bps"))?,
        rtt_s: rtt_ms / 1000.0,
        loss: number(format!("{link}.{direction}.data_loss"))?,
    };
    if path.rtt_s > 0.0 && path.loss > 0.0 && path.rate_bps > 0.0 {
        Ok(path)
    } else {
        Err("a response function needs a round trip, a rate and a random loss above zero".into())
    }
}

/// The markdown section of every prediction (empty without any).
pub(crate) fn render(predictions: &[Prediction], analysis: &Analysis) -> String {
    let mut text = String::new();
    for prediction in predictions {
        let _ = writeln!(
            text,
            "\n## Predicted from the response functions: {}\n",
            prediction.experiment
        );
        let Some(experiment) = analysis
            .experiments
            .iter()
            .find(|e| e.name == prediction.experiment)
        else {
            let _ = writeln!(
                text,
                "No data: experiment `{}` not in the results.",
                prediction.experiment
            );
            continue;
        };
        let path = match path_of(prediction, experiment) {
            Ok(path) => path,
            Err(why) => {
                let _ = writeln!(text, "No prediction: {why}.");
                continue;
            }
        };
        let _ = writeln!(
            text,
            "Link `{}` ({}): {} Mbit/s of frames ({:.1} Mbit/s of payload), round trip {} ms \
             without a queue, random loss {:e}. Predicted: the response function's window at that \
             loss, times MSS {SEGMENT_BYTES} bytes over the round trip, capped by the payload \
             rate; made from these parameters before any run. Measured: the median of the runs.\n",
            prediction.link,
            prediction.direction,
            path.rate_bps / 1e6,
            path.payload_bps() / 1e6,
            path.rtt_s * 1000.0,
            path.loss
        );
        let _ = writeln!(
            text,
            "| case | response function | window (segments) | predicted Mbit/s | predicted share \
             | measured Mbit/s | measured share |"
        );
        let _ = writeln!(text, "|---|---|---|---|---|---|---|");
        for (case, function) in &prediction.cases {
            let (window, rate) = path.predict(*function);
            let measured = experiment
                .rows
                .iter()
                .find(|row| row.case == *case)
                .and_then(|row| row.throughput_mbps.map(|s| s.median));
            let (measured_rate, measured_share) = match measured {
                Some(mbps) => (
                    format!("{mbps:.1}"),
                    format!("{:.2}", mbps * 1e6 / path.payload_bps()),
                ),
                None => ("no runs".to_string(), "-".to_string()),
            };
            let _ = writeln!(
                text,
                "| {} | {} | {window:.0} | {:.1} | {:.2} | {measured_rate} | {measured_share} |",
                cell(case),
                cell(function.formula()),
                rate / 1e6,
                rate / path.payload_bps()
            );
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reno_gets_a_fraction_of_a_long_fat_path_and_highspeed_fills_it() {
        // 200 Mbit/s of frames, 100 ms, p = 1e-5: Reno's 386 segments carry 44.7 Mbit/s, a
        // quarter of the 191.3 Mbit/s of payload; HighSpeed TCP's 1795 would carry 208, so the
        // path caps it.
        let path = SegmentPath {
            rate_bps: 200e6,
            rtt_s: 0.1,
            loss: 1e-5,
        };
        assert!((path.payload_bps() / 1e6 - 191.28).abs() < 0.01);
        let (window, reno) = path.predict(ResponseFunction::Reno);
        assert!((window - 385.8).abs() < 0.1, "{window}");
        assert!((reno / 1e6 - 44.69).abs() < 0.01, "{reno}");
        let (window, highspeed) = path.predict(ResponseFunction::Highspeed);
        assert!((window - 1795.0).abs() < 1.0, "{window}");
        assert_eq!(highspeed, path.payload_bps());
        assert_eq!(
            path.predict(ResponseFunction::GentleHighspeed),
            path.predict(ResponseFunction::Highspeed)
        );
        // At p = 1e-6 Reno's window is sqrt(10) times larger: 141 Mbit/s, still under the cap.
        let (_, reno) = SegmentPath { loss: 1e-6, ..path }.predict(ResponseFunction::Reno);
        assert!((reno / 1e6 - 141.3).abs() < 0.1, "{reno}");
    }

    #[test]
    fn a_prediction_needs_cases_and_a_direction() {
        let prediction = Prediction {
            experiment: "e".into(),
            link: "wan".into(),
            direction: "down".into(),
            cases: BTreeMap::new(),
        };
        assert!(prediction.problem().is_some_and(|p| p.contains("cases")));
        let prediction = Prediction {
            cases: BTreeMap::from([("c".to_string(), ResponseFunction::Reno)]),
            ..prediction
        };
        assert!(prediction.problem().is_some_and(|p| p.contains("down")));
    }
}
