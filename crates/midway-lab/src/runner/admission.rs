//! Which point may start now. Points start in plan order, at most `--jobs` at once; a point of an
//! experiment with a limit of its own (`max_jobs`) starts only once fewer than that many are
//! running, and while it runs no other point starts beyond that limit. Without I/O or clock: the
//! runner keeps one [`Admission`] under a mutex and waits on a condition variable.
//!
//! Starting in plan order matters: if later points could overtake a limited one, a stream of
//! unlimited points would keep the machine busy and the limited point would wait for ever.

/// The number of points that may run at once while a point with `max_jobs` runs, in a run of
/// `jobs`: its own limit, never above `jobs`, at least 1.
pub(crate) fn limit_under(jobs: usize, max_jobs: Option<usize>) -> usize {
    let jobs = jobs.max(1);
    max_jobs.map_or(jobs, |own| own.clamp(1, jobs))
}

/// The points running now, as the limit each runs under.
#[derive(Debug)]
pub(crate) struct Admission {
    jobs: usize,
    running: Vec<usize>,
}

impl Admission {
    /// At most `jobs` points at once (at least 1).
    pub(crate) fn new(jobs: usize) -> Self {
        Admission {
            jobs: jobs.max(1),
            running: Vec::new(),
        }
    }

    /// The number of points that may run at once while a point with `max_jobs` runs.
    pub(crate) fn limit(&self, max_jobs: Option<usize>) -> usize {
        limit_under(self.jobs, max_jobs)
    }

    /// Whether a point with `max_jobs` may start now: one more running point must stay within
    /// its own limit and within the limit of every point already running.
    pub(crate) fn can_start(&self, max_jobs: Option<usize>) -> bool {
        let tightest = self
            .running
            .iter()
            .copied()
            .fold(self.limit(max_jobs), usize::min);
        self.running.len() < tightest
    }

    /// Records that a point with `max_jobs` started (after [`Admission::can_start`]).
    pub(crate) fn start(&mut self, max_jobs: Option<usize>) {
        let limit = self.limit(max_jobs);
        self.running.push(limit);
    }

    /// Records that a point with `max_jobs` finished.
    pub(crate) fn finish(&mut self, max_jobs: Option<usize>) {
        let limit = self.limit(max_jobs);
        if let Some(position) = self.running.iter().position(|&l| l == limit) {
            self.running.swap_remove(position);
        }
    }

    /// Points running now.
    #[cfg(test)]
    fn running(&self) -> usize {
        self.running.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_points_fill_the_jobs() {
        let mut admission = Admission::new(3);
        for _ in 0..3 {
            assert!(admission.can_start(None));
            admission.start(None);
        }
        assert!(!admission.can_start(None));
        admission.finish(None);
        assert!(admission.can_start(None));
    }

    #[test]
    fn a_limited_point_waits_until_the_running_ones_are_below_its_limit() {
        let mut admission = Admission::new(16);
        for _ in 0..5 {
            admission.start(None);
        }
        assert!(!admission.can_start(Some(2)));
        for _ in 0..3 {
            admission.finish(None);
        }
        assert_eq!(admission.running(), 2);
        assert!(
            !admission.can_start(Some(2)),
            "two running: a third would exceed 2"
        );
        admission.finish(None);
        assert!(admission.can_start(Some(2)));
    }

    #[test]
    fn while_a_limited_point_runs_nothing_starts_beyond_its_limit() {
        let mut admission = Admission::new(16);
        admission.start(Some(2));
        assert!(admission.can_start(None));
        admission.start(None);
        assert!(
            !admission.can_start(None),
            "the limited point allows 2 at once"
        );
        assert!(!admission.can_start(Some(2)));
        admission.finish(Some(2));
        assert!(admission.can_start(None));
    }

    #[test]
    fn a_limit_above_jobs_is_jobs_and_a_limit_of_one_runs_alone() {
        let mut admission = Admission::new(2);
        assert_eq!(admission.limit(Some(8)), 2);
        assert_eq!(admission.limit(Some(0)), 1);
        admission.start(Some(1));
        assert!(!admission.can_start(None));
        assert!(!admission.can_start(Some(1)));
        admission.finish(Some(1));
        assert!(admission.can_start(Some(1)));
    }

    #[test]
    fn finishing_removes_one_point_of_that_limit() {
        let mut admission = Admission::new(4);
        admission.start(Some(3));
        admission.start(None);
        admission.finish(None);
        assert_eq!(admission.running(), 1);
        assert!(admission.can_start(None));
        admission.start(None);
        admission.start(None);
        assert!(!admission.can_start(None), "3 running under a limit of 3");
    }
}
