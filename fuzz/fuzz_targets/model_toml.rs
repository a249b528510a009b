//! Fuzz the model TOML parser (`ModelSpec::from_toml_str`): any text gives a model whose
//! byte counts are exact (checked, never saturated) or an error naming the origin.
#![no_main]

use ft_model::ModelSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match ModelSpec::from_toml_str(text, "fuzz.toml") {
        Ok(m) => {
            assert!(m.geometry.checked_total_expert_bytes(m.format).is_ok());
            assert!(m.expert_bytes() < u64::MAX);
            let _ = m.dense();
        }
        Err(e) => assert!(e.to_string().contains("fuzz.toml")),
    }
});
