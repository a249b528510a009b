//! An engine whose experts come from a safetensors checkpoint decodes exactly as one whose
//! experts were generated: the checkpoint here holds a seeded bank's encoded matrices, so
//! every output must be bit-identical; and a checkpoint that does not fit the model is an
//! error naming the file and the tensor, before any step runs.

use ft_kernels::ActivationPath;
use ft_model::routing;
use ft_model::{
    DenseSpec, ExpertFormat, ExpertId, FetchFraction, ModelSpec, MoeGeometry, Strategy,
};
use ft_runtime::bank::{tensor_name, HostBank, MATRICES};
use ft_runtime::cpu_pool::PoolWait;
use ft_runtime::device::{Device, HostDeviceConfig};
use ft_runtime::engine::{
    decode, draw_routing, BankSource, CombineOrder, DecodeOptions, Engine, EngineConfig,
};
use ft_runtime::gather::GatherMethod;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

fn small() -> ModelSpec {
    ModelSpec {
        name: "small".into(),
        format: ExpertFormat::Nvfp4,
        geometry: MoeGeometry {
            hidden: 128,
            intermediate: 64,
            experts: 16,
            top_k: 4,
            moe_layers: 3,
            shared_experts: 0,
        },
        dense: Some(DenseSpec {
            weight_bytes_per_layer: 16 << 10,
            kv_bytes_per_token: 32,
        }),
    }
}

fn device() -> Device {
    Device::host(HostDeviceConfig {
        memory_bytes: 256 << 20,
        kernel_threads: 1,
        ..Default::default()
    })
    .unwrap()
}

fn config(strategy: Strategy) -> EngineConfig {
    EngineConfig {
        strategy,
        cache_slots: 12,
        cache_options: Default::default(),
        max_streams: 2,
        max_context: 32,
        threads: 1,
        pool_wait: PoolWait::Park,
        gpu_path: ActivationPath::Int8,
        cpu_path: ActivationPath::Int8,
        combine: CombineOrder::Fixed,
        gather: GatherMethod::CopyEngine,
        seed: 29,
        timeline: false,
        reserve_bytes: 0,
        ..EngineConfig::default()
    }
}

/// Write every expert matrix of `bank` as a `U8` tensor of its encoded bytes.
fn export(bank: &HostBank, model: &ModelSpec, path: &std::path::Path) {
    let g = model.geometry;
    let l = *bank.layout();
    let mut owned: Vec<(String, Vec<u8>)> = Vec::new();
    for layer in 0..g.moe_layers {
        for expert in 0..g.experts {
            let e = bank.expert(ExpertId::new(layer, expert)).unwrap();
            for (m, which) in MATRICES.iter().enumerate() {
                let (rows, cols) = l.matrix_shape(m);
                let n = model.format.matrix_bytes(rows, cols) as usize;
                let off = l.matrix_offset(m);
                owned.push((tensor_name(layer, expert, which), e[off..off + n].to_vec()));
            }
        }
    }
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|(n, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::U8, vec![b.len()], b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &None, path).unwrap();
}

#[test]
fn a_checkpoint_of_a_seeded_bank_decodes_bit_identically() {
    let d = device();
    let model = small();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("experts.safetensors");
    let cfg0 = config(Strategy::Offload);
    let seeded = HostBank::from_seed(&d, model.format, &model.geometry, cfg0.seed).unwrap();
    export(&seeded, &model, &path);
    drop(seeded);

    let mut src = routing::resolve("typical", &model.geometry, Some(3)).unwrap();
    let steps = draw_routing(src.as_mut(), 2, 5).unwrap();
    let opts = DecodeOptions {
        context: 8,
        input_seed: 5,
        keep_spans: false,
        keep_outputs: true,
        block_stamps: false,
    };
    for strategy in [
        Strategy::Offload,
        Strategy::Hybrid {
            fetch: FetchFraction::Fixed(0.5),
        },
    ] {
        let cfg = config(strategy);
        let mut a = Engine::new(&d, &model, &cfg, None).unwrap();
        let mut b =
            Engine::with_bank_source(&d, &model, &cfg, None, BankSource::Safetensors(&path))
                .unwrap();
        let ra = decode(&mut a, &steps[..1], &steps[1..], &opts, &mut |_, _| {}).unwrap();
        let rb = decode(&mut b, &steps[..1], &steps[1..], &opts, &mut |_, _| {}).unwrap();
        assert!(!ra.outputs.is_empty());
        assert_eq!(ra.outputs, rb.outputs, "{strategy:?}");
    }

    // A different seed gives different outputs: the test would see a bank that ignored the
    // checkpoint.
    let mut other = config(Strategy::Offload);
    other.seed = 30;
    let mut c = Engine::new(&d, &model, &other, None).unwrap();
    let mut b =
        Engine::with_bank_source(&d, &model, &cfg0, None, BankSource::Safetensors(&path)).unwrap();
    let rc = decode(&mut c, &steps[..1], &steps[1..], &opts, &mut |_, _| {}).unwrap();
    let rb = decode(&mut b, &steps[..1], &steps[1..], &opts, &mut |_, _| {}).unwrap();
    assert_ne!(rc.outputs, rb.outputs);
}

#[test]
fn a_checkpoint_that_does_not_fit_is_an_error_naming_it() {
    let d = device();
    let model = small();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.safetensors");
    let seeded = HostBank::from_seed(&d, model.format, &model.geometry, 1).unwrap();
    export(&seeded, &model, &path);
    let mut deeper = model.clone();
    deeper.geometry.moe_layers = 4;
    let e = Engine::with_bank_source(
        &d,
        &deeper,
        &config(Strategy::Offload),
        None,
        BankSource::Safetensors(&path),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("short.safetensors"), "{e}");
    assert!(e.contains(&tensor_name(3, 0, "gate")), "{e}");
}
