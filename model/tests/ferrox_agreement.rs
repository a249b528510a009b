//! The legacy rule against the reference engine's port (ferrox-core 0.25 `qstar`): verdicts,
//! fetch fractions and the integer split agree everywhere on a grid.

use ferrox_core::qstar;
use ft_model::perf::legacy::{
    balanced_fetch, fetch_fraction_from_bandwidths, fetch_fraction_from_overlap, fraction_q16,
    recommend, LegacyVerdict, FRACTION_ONE,
};

#[test]
fn verdicts_and_fractions_agree_with_ferrox_core() {
    assert_eq!(FRACTION_ONE, qstar::FRACTION_ONE);
    let values = [
        0.0, 0.5, 8.41, 13.09, 21.89, 24.25, 29.97, 40.0, 46.12, 48.5, 80.0, 100.0, 412.0,
    ];
    for &c in &values {
        for &p in &values {
            for threshold in [1.0, 1.5, 2.0, 2.5] {
                let ours = recommend(c, p, threshold);
                let theirs = qstar::recommend_backend(c, p, threshold);
                let same = matches!(
                    (ours, theirs),
                    (LegacyVerdict::Offload, qstar::MoeBackend::Offload)
                        | (LegacyVerdict::Hybrid, qstar::MoeBackend::Hybrid)
                );
                assert!(same, "c={c} p={p} t={threshold}: {ours:?} vs {theirs:?}");
            }
            assert_eq!(
                fetch_fraction_from_bandwidths(c, p),
                qstar::fetch_fraction_from_bandwidths(c, p)
            );
            assert_eq!(
                fetch_fraction_from_overlap(c, p),
                qstar::fetch_fraction_from_overlap(c, p)
            );
        }
    }
}

#[test]
fn the_split_agrees_with_ferrox_core() {
    for f in [
        0.0, 0.05, 0.1, 0.2, 0.25, 0.277, 0.3, 0.415, 0.454, 0.5, 0.7, 0.99, 1.0,
    ] {
        let policy = qstar::QStarPolicy::from_fraction(f);
        assert_eq!(fraction_q16(f), policy.fraction_q16(), "f={f}");
        for m in 0..=200usize {
            assert_eq!(
                balanced_fetch(m, fraction_q16(f)),
                qstar::balanced_fetch(m, fraction_q16(f)),
                "f={f} m={m}"
            );
            if f > 0.0 {
                assert_eq!(
                    balanced_fetch(m, fraction_q16(f)),
                    policy.split(m).fetch,
                    "f={f} m={m}"
                );
            }
        }
    }
}
