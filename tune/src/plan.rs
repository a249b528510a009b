//! The choice from the estimates, whether it is settled, and which run to make next.
//!
//! Settled: every strategy has been measured at least once, and the best candidate's
//! interval lies above every other's (intervals separated). A strategy the runs never
//! measured is run before anything is settled, whatever the calibrated model predicts for
//! it: the terms that decide it (a CPU side's serving rate, say) are exactly the ones the
//! other strategies' runs cannot identify, so its interval would be too narrow. Otherwise the next run is where it most reduces the decision's uncertainty: a candidate
//! the runs say nothing of is run first (in the order given); else, of the candidates whose
//! interval overlaps the best's, the one whose margin over (or under) the best has the
//! largest standard error is the contender, and of the pair the one with the larger own
//! standard error is run (a run shrinks that one's error the most).

use serde::Serialize;

use crate::calib::Estimate;

/// Where the decision stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Standing {
    /// Index of the best candidate with an estimate (highest tok/s).
    pub best: Option<usize>,
    /// Index of the runner-up (second highest).
    pub runner_up: Option<usize>,
    /// Whether every candidate has an estimate and the best's interval is above all others'.
    pub settled: bool,
    /// The next candidate to run, by index (`None` when settled).
    pub next: Option<usize>,
    /// Why `next` was picked, in words.
    pub why: String,
}

/// Decide from each candidate's estimate (see the module docs); `names` name them in `why`.
pub fn standing(estimates: &[Option<Estimate>], names: &[String]) -> Standing {
    let mut order: Vec<usize> = (0..estimates.len())
        .filter(|&i| estimates[i].is_some())
        .collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (estimates[a].unwrap().tok_s, estimates[b].unwrap().tok_s);
        y.total_cmp(&x)
    });
    let best = order.first().copied();
    let runner_up = order.get(1).copied();
    if let Some(i) = estimates.iter().position(Option::is_none) {
        return Standing {
            best,
            runner_up,
            settled: false,
            next: Some(i),
            why: format!("{} has no estimate yet", names[i]),
        };
    }
    if let Some(i) = first_of_an_unmeasured_strategy(estimates, names) {
        return Standing {
            best,
            runner_up,
            settled: false,
            next: Some(i),
            why: format!(
                "{} is predicted from other strategies' runs only: it is measured once first",
                names[i]
            ),
        };
    }
    let Some(b) = best else {
        return Standing {
            best,
            runner_up,
            settled: true,
            next: None,
            why: "no candidates".into(),
        };
    };
    let eb = estimates[b].unwrap();
    let (blo, _) = eb.interval();
    let contender = order[1..]
        .iter()
        .copied()
        .filter(|&c| estimates[c].unwrap().interval().1 >= blo)
        .max_by(|&x, &y| {
            let m = |c: usize| estimates[c].unwrap().se.hypot(eb.se);
            m(x).total_cmp(&m(y))
        });
    let Some(c) = contender else {
        return Standing {
            best,
            runner_up,
            settled: true,
            next: None,
            why: if order.len() > 1 {
                format!("{}'s interval lies above every other's", names[b])
            } else {
                format!("{} is the only candidate", names[b])
            },
        };
    };
    let ec = estimates[c].unwrap();
    let next = if (ec.se, usize::MAX - ec.runs) > (eb.se, usize::MAX - eb.runs) {
        c
    } else {
        b
    };
    let margin = eb.tok_s - ec.tok_s;
    Standing {
        best,
        runner_up,
        settled: false,
        next: Some(next),
        why: format!(
            "{} leads {} by {:.3} tok/s ± {:.3} (se): the intervals overlap; {} has the larger error",
            names[b],
            names[c],
            margin,
            ec.se.hypot(eb.se),
            names[next]
        ),
    }
}

/// The strategy a candidate's name names (`hybrid:0.5` -> `hybrid`).
fn strategy_of(name: &str) -> &str {
    name.split(':').next().unwrap_or(name)
}

/// The first candidate (in the order given) whose strategy no run has measured at the target.
pub fn first_of_an_unmeasured_strategy(
    estimates: &[Option<Estimate>],
    names: &[String],
) -> Option<usize> {
    let measured = |kind: &str| {
        estimates
            .iter()
            .zip(names)
            .any(|(e, n)| strategy_of(n) == kind && e.is_some_and(|e| e.runs > 0))
    };
    (0..estimates.len()).find(|&i| !measured(strategy_of(&names[i])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tok_s: f64, se: f64, runs: usize) -> Option<Estimate> {
        Some(Estimate { tok_s, se, runs })
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}")).collect()
    }

    #[test]
    fn an_unmeasured_candidate_is_run_first() {
        let s = standing(&[e(10.0, 0.1, 1), None, None], &names(3));
        assert_eq!((s.next, s.settled, s.best), (Some(1), false, Some(0)));
    }

    #[test]
    fn a_strategy_only_predicted_is_measured_before_settling() {
        let names: Vec<String> = ["offload", "hybrid:0.3", "hybrid:0.6"]
            .map(String::from)
            .to_vec();
        // hybrid is predicted far ahead with a narrow interval, but no hybrid was run.
        let s = standing(&[e(10.0, 0.1, 1), e(30.0, 0.1, 0), e(25.0, 0.1, 0)], &names);
        assert_eq!((s.settled, s.next), (false, Some(1)), "{}", s.why);
        // One hybrid run stands for the strategy: the other fraction may stay predicted.
        let s = standing(&[e(10.0, 0.1, 1), e(30.0, 0.1, 1), e(25.0, 0.1, 0)], &names);
        assert!(s.settled, "{}", s.why);
        assert_eq!(s.best, Some(1));
    }

    #[test]
    fn separated_intervals_settle_the_choice() {
        let s = standing(&[e(10.0, 0.5, 1), e(20.0, 0.5, 1)], &names(2));
        assert!(s.settled, "{s:?}");
        assert_eq!((s.best, s.runner_up, s.next), (Some(1), Some(0), None));
        // One candidate is settled by itself.
        assert!(standing(&[e(1.0, 1.0, 1)], &names(1)).settled);
    }

    #[test]
    fn overlapping_intervals_run_the_less_known_of_the_closest_pair() {
        // c0 leads; c1 and c2 overlap it; c2's margin is the less certain; c2's own error
        // is larger than c0's, so c2 is run.
        let s = standing(
            &[e(10.0, 0.5, 2), e(9.5, 0.2, 4), e(9.0, 0.9, 1)],
            &names(3),
        );
        assert!(!s.settled);
        assert_eq!((s.best, s.next), (Some(0), Some(2)), "{}", s.why);
        // The leader is the less known: it is run again.
        let s = standing(&[e(10.0, 1.0, 1), e(9.0, 0.3, 3)], &names(2));
        assert_eq!(s.next, Some(0), "{}", s.why);
        // Equal errors: the one with fewer runs.
        let s = standing(&[e(10.0, 0.5, 3), e(9.5, 0.5, 1)], &names(2));
        assert_eq!(s.next, Some(1), "{}", s.why);
    }
}
