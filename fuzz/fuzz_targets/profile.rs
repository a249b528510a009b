//! Fuzz the profile parser (`Profile::parse`, behind every read of a profile): any bytes
//! give a valid profile or an error, never a panic, a hang or an unbounded allocation; a
//! profile that parses is then used the way predict and serve use it (its covariance, its
//! re-expression at other thread counts, its check against its own model), which must not
//! panic either.
#![no_main]

use ft_model::profile::Profile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(p) = Profile::parse(text, "fuzz.json") else {
        return;
    };
    assert!(p.validate().is_ok());
    let m = p.perf_model("fuzz");
    for id in &m.covariance.params {
        assert!(m.covariance.se(*id) >= 0.0);
    }
    let _ = m
        .covariance
        .quadratic_form(&vec![1.0; m.covariance.params.len()]);
    for t in [1, 7, p.params.cpu_threads] {
        if let Ok(q) = p.at_threads(t) {
            assert!(q.params.validate().is_ok());
        }
    }
    let _ = p.check_for("fuzz.json", &p.probed_model(), Some(4));
    let _ = p.trust_issue();
});
