//! Writes the seed corpora of the fuzz targets (`corpus/<target>/`): valid inputs the
//! fuzzer mutates from. Traces of both forms recorded from a synthetic routing process, a
//! profile of a host spec, and every model preset's TOML.

use std::path::Path;

use ft_model::host::HostSpec;
use ft_model::profile::Profile;
use ft_model::routing::{RoutingSource, TraceFormat, TraceWriter};
use ft_model::{ModelSpec, MoeGeometry, RoutingProcess};

const GEOMETRY: MoeGeometry = MoeGeometry {
    hidden: 64,
    intermediate: 64,
    experts: 16,
    top_k: 2,
    moe_layers: 2,
    shared_experts: 0,
};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for t in ["profile", "trace", "model_toml"] {
        std::fs::create_dir_all(root.join(t)).unwrap();
    }
    // Traces: 1 and 3 streams, 4 steps, both forms.
    for preset in ft_model::routing::PRESET_NAMES {
        let process = RoutingProcess::preset(preset).unwrap();
        for (streams, format, ext) in [
            (1, TraceFormat::JsonLines, "jsonl"),
            (3, TraceFormat::Binary, "ftrt"),
        ] {
            let path = root.join("trace").join(format!("{preset}-{streams}.{ext}"));
            let file = std::fs::File::create(&path).unwrap();
            let mut w = TraceWriter::new(Box::new(file), "seed", format, &GEOMETRY).unwrap();
            let mut src = ft_model::routing::SyntheticRouting::new(&process, GEOMETRY).unwrap();
            for _ in 0..4 {
                let step = src.next_step(streams).unwrap();
                w.write_step(&step).unwrap();
            }
            w.finish().unwrap();
        }
    }
    // A profile of the field report's host.
    let model = ModelSpec::preset("qwen3.8-flash-next").unwrap();
    let p = Profile::of_host_spec(&HostSpec::field_report(), &model).unwrap();
    std::fs::write(
        root.join("profile").join("field.json"),
        serde_json::to_vec_pretty(&p).unwrap(),
    )
    .unwrap();
    // Every preset's TOML.
    for name in ModelSpec::preset_names() {
        let m = ModelSpec::preset(name).unwrap();
        std::fs::write(
            root.join("model_toml").join(format!("{name}.toml")),
            m.to_toml(),
        )
        .unwrap();
    }
    println!("seeds written under {}", root.display());
}
