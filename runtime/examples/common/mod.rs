//! What the device micro-benches of `runtime/examples` share: their command line, the device
//! and streams they open, and how they report an error.

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;

use ft_model::ModelSpec;
use ft_runtime::device::{Device, DeviceKind, Event, Stream};

/// The arguments every bench takes (flattened into its own).
#[derive(clap::Args)]
pub struct BenchArgs {
    /// cuda or host.
    #[arg(long, default_value = "cuda")]
    pub device: DeviceKind,
    /// Folder the bench writes its results into.
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
    /// Repetitions of each timing (the median is kept).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
}

/// What a bench runs on: the device its arguments name, the served model's spec, a compute
/// and a copy stream, and two timing events.
pub struct Bench {
    pub device: Device,
    /// The host-emulated device: the benches shrink their sizes on it.
    pub small: bool,
    pub out: PathBuf,
    pub reps: usize,
    pub spec: ModelSpec,
    pub compute: Stream,
    pub copy: Stream,
    pub events: (Event, Event),
}

impl BenchArgs {
    /// Open the device the arguments name, with its streams and events, and create the
    /// output folder first, so that a bad `--out` fails before any run (a bench may write
    /// files there as it goes, and its report at the end).
    pub fn open(self) -> Result<Bench, Box<dyn Error>> {
        std::fs::create_dir_all(&self.out)
            .map_err(|e| format!("--out {}: {e}", self.out.display()))?;
        let device = Device::open_kind(self.device)?;
        Ok(Bench {
            small: self.device == DeviceKind::Host,
            out: self.out,
            reps: self.reps,
            spec: ModelSpec::preset("qwen3.8-flash-next")?,
            compute: device.new_stream("compute")?,
            copy: device.new_stream("copy")?,
            events: (device.new_event(true)?, device.new_event(true)?),
            device,
        })
    }
}

/// Write a bench's `report` as pretty JSON to `name` in its output folder `out` (created by
/// [`BenchArgs::open`]).
pub fn write_json(
    out: &std::path::Path,
    name: &str,
    report: &impl serde::Serialize,
) -> Result<(), Box<dyn Error>> {
    std::fs::write(out.join(name), serde_json::to_string_pretty(report)?)?;
    Ok(())
}

/// A bench's exit: its error, if any, in its readable form on stderr (`main` returning the
/// error would print its Debug form) and a failing status.
pub fn exit(result: Result<(), Box<dyn Error>>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
