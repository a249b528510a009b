//! Property tests of the TOML inputs whose parsers live in files other engineers own (the
//! host spec, the routing process): called through their public entry points, never
//! edited here. Any input gives a valid value or an error naming the origin, never a panic;
//! a host that parses maps to the model's parameters (`PerfModel::from_host`) or a clear
//! error, again without a panic.

use ft_model::host::HostSpec;
use ft_model::perf::PerfModel;
use ft_model::RoutingProcess;
use proptest::prelude::*;

/// A TOML document with some of its bytes replaced.
fn mutated(text: String, edits: Vec<(prop::sample::Index, u8)>) -> String {
    let mut bytes = text.into_bytes();
    for (at, b) in edits {
        let i = at.index(bytes.len());
        bytes[i] = b;
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A TOML document with the value of one `key = value` line replaced by `with`.
fn revalued(text: &str, line: prop::sample::Index, with: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let values: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains(" = "))
        .collect();
    let target = values[line.index(values.len())];
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| match (i == target, l.split_once(" = ")) {
            (true, Some((k, _))) => format!("{k} = {with}"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("1e308".to_string()),
        Just("9223372036854775807".to_string()),
        Just("\"\"".to_string()),
        Just("[]".to_string()),
        any::<f64>().prop_map(|x| format!("{x:?}")),
        any::<i64>().prop_map(|x| x.to_string()),
    ]
}

fn host_ok_or_named(text: &str, origin: &str) -> Result<(), TestCaseError> {
    match HostSpec::from_toml_str(text, origin) {
        Ok(h) => {
            // A host that parses maps to parameters or refuses, naming what is wrong.
            if let Ok(m) = PerfModel::from_host(&h) {
                prop_assert!(m.params.validate().is_ok());
            }
        }
        Err(e) => prop_assert!(e.to_string().contains(origin), "{}", e),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn host_toml_any_text(text in "\\PC{0,200}") {
        host_ok_or_named(&text, "host.toml")?;
    }

    #[test]
    fn host_toml_mutated_bytes(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let text = mutated(HostSpec::field_report().to_toml(), edits);
        host_ok_or_named(&text, "host.toml")?;
    }

    #[test]
    fn host_toml_edge_values(line in any::<prop::sample::Index>(), with in value()) {
        let text = revalued(&HostSpec::field_report().to_toml(), line, &with);
        host_ok_or_named(&text, "host.toml")?;
    }

    #[test]
    fn routing_process_toml(
        preset in prop::sample::select(ft_model::routing::PRESET_NAMES.to_vec()),
        line in any::<prop::sample::Index>(),
        with in value(),
    ) {
        let base = toml::to_string(&RoutingProcess::preset(preset).unwrap()).unwrap();
        let text = revalued(&base, line, &with);
        match RoutingProcess::from_toml_str(&text, "routing.toml") {
            Ok(p) => prop_assert!(p.validate().is_ok()),
            Err(e) => prop_assert!(e.to_string().contains("routing.toml"), "{}", e),
        }
    }
}
