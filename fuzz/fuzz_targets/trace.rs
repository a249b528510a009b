//! Fuzz the routing trace readers (`TraceReader::from_reader`, both forms: JSON lines and
//! the binary form, told apart by the first 8 bytes) for a small geometry: any bytes give
//! steps that validate against the geometry, or an error, never a panic; at most
//! `MAX_STEPS` steps are read (a looping reader never ends).
#![no_main]

use ft_model::routing::TraceReader;
use ft_model::MoeGeometry;
use libfuzzer_sys::fuzz_target;

/// Steps read at most per input.
const MAX_STEPS: usize = 64;

/// The geometry the seeds (`cargo run --bin seed`) are written for.
pub const GEOMETRY: MoeGeometry = MoeGeometry {
    hidden: 64,
    intermediate: 64,
    experts: 16,
    top_k: 2,
    moe_layers: 2,
    shared_experts: 0,
};

fuzz_target!(|data: &[u8]| {
    let cursor = std::io::Cursor::new(data.to_vec());
    let Ok(mut r) = TraceReader::from_reader(cursor, "fuzz", &GEOMETRY) else {
        return;
    };
    for _ in 0..MAX_STEPS {
        match r.read_step() {
            Ok(Some(step)) => {
                // What the reader hands out must hold for the geometry it was opened with.
                let _ = step.validate(&GEOMETRY, "fuzz");
            }
            Ok(None) | Err(_) => break,
        }
    }
});
