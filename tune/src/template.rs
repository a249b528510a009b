//! Command templates: how to start an engine for one strategy and its parameters.
//!
//! `ft tune` drives engines it knows nothing about (FreeToken's `ft serve`, llama.cpp's
//! `llama-server`, this project's `ft serve`), so everything engine-specific lives in a small
//! TOML file: the command that starts the engine (an argument list, no shell), where it
//! answers when ready, and for each strategy the flags that select it. `docs/tune.md` is the
//! reference; `docs/templates/` has one per engine.
//!
//! ```toml
//! name = "ft-serve"
//! command = ["{ft}", "serve", "--model", "{model}", "--port", "{port}", "{strategy_args}"]
//! [vars]
//! model = "qwen3.8-flash-next"
//! [strategies.offload]
//! args = ["--moe-strategy", "offload"]
//! [strategies.hybrid]
//! args = ["--moe-strategy", "hybrid", "--fetch-fraction", "{fetch_fraction}"]
//! ```
//!
//! Placeholders are `{name}` (`{{` and `}}` write braces). tune fills `{ft}` (this binary),
//! `{port}`, `{strategy}`, `{fetch_fraction}`, `{cpu_layers}`, `{strategy_args}` (the
//! strategy's `args`, only as a whole argument of `command`) per run, and `{model}`,
//! `{threads}`, `{cache_gb}`, `{max_streams}`, `{context}` (one stream's) and
//! `{total_context}` (`{context}` times `{max_streams}`) from its flags; `[vars]` gives
//! defaults for those and defines any other name, and `--set name=value` overrides both. A
//! placeholder that is none of these is refused by name when the template is loaded, and so
//! is one without a value for a strategy tune would run, before any engine starts.

use std::collections::BTreeMap;
use std::path::Path;

use ft_model::observe::ObservedStrategy;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TuneError};

/// Largest template file read, bytes: a template is a few lines; a wrong path (a model file)
/// fails at once.
pub const MAX_TEMPLATE_BYTES: u64 = 256 << 10;

/// Longest start-up bound a template may ask for, s (an engine that loads a large checkpoint
/// from disk takes minutes; an hour is a typo).
pub const MAX_STARTUP_TIMEOUT_S: f64 = 3600.0;

/// Longest grace period between SIGTERM and SIGKILL a template may ask for, s.
pub const MAX_STOP_GRACE_S: f64 = 600.0;

/// Placeholders tune fills for every run: they cannot be set by `[vars]` or `--set`.
pub const PER_RUN: &[&str] = &[
    "ft",
    "port",
    "strategy",
    "fetch_fraction",
    "cpu_layers",
    "strategy_args",
];

/// Placeholders tune fills from its flags when given; `[vars]` and `--set` may default them.
pub const FROM_FLAGS: &[&str] = &[
    "model",
    "threads",
    "cache_gb",
    "max_streams",
    "context",
    "total_context",
];

/// The strategy names a template may map (the observations file's names).
pub const STRATEGY_NAMES: &[&str] = &[
    "offload",
    "hybrid",
    "cpu",
    "resident",
    "layer-split",
    "layer-split-cached",
];

/// Which endpoint the protocol loads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Endpoint {
    /// `/v1/completions`.
    #[default]
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// One strategy's flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyFlags {
    /// Arguments that select the strategy, spliced where `command` has `{strategy_args}`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Hybrid only: the fetch fraction the engine uses by itself, for an engine whose flags
    /// cannot set it (the observations must say which fraction ran). Leave it out when `args`
    /// set `{fetch_fraction}`.
    pub fetch_fraction: Option<f64>,
    /// Extra environment for this strategy (placeholders allowed).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

fn default_ready_path() -> String {
    "/v1/models".into()
}
fn default_startup_timeout_s() -> f64 {
    120.0
}
fn default_stop_grace_s() -> f64 {
    10.0
}
fn default_chars_per_token() -> f64 {
    4.0
}
fn default_true() -> bool {
    true
}

/// A template as written (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateFile {
    /// The engine's name, for reports.
    #[serde(default)]
    pub name: String,
    /// What the template is for (a comment that survives into reports).
    #[serde(default)]
    pub description: String,
    /// The engine's command line, one argument per entry (no shell).
    pub command: Vec<String>,
    /// Extra environment for every run (placeholders allowed).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Values of placeholders: defaults for tune's flags, and names of the template's own.
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    /// Path polled until it answers 2xx (the engine is then ready).
    #[serde(default = "default_ready_path")]
    pub ready_path: String,
    /// Bound on the engine's start, s.
    #[serde(default = "default_startup_timeout_s")]
    pub startup_timeout_s: f64,
    /// Time between SIGTERM and SIGKILL when the engine is stopped, s.
    #[serde(default = "default_stop_grace_s")]
    pub stop_grace_s: f64,
    /// Characters per prompt token of the engine's tokenizer (about 4 for a BPE tokenizer on
    /// English, 1 for ft serve's bytes).
    #[serde(default = "default_chars_per_token")]
    pub chars_per_token: f64,
    /// The endpoint the protocol loads.
    #[serde(default)]
    pub endpoint: Endpoint,
    /// Send `ignore_eos` so every request generates its full output (engines that do not
    /// know the field ignore it).
    #[serde(default = "default_true")]
    pub ignore_eos: bool,
    /// Each strategy the engine can run, by the observations file's name.
    pub strategies: BTreeMap<String, StrategyFlags>,
}

/// A loaded, checked template, with the values of its placeholders that do not change
/// between runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// Where it came from, for messages.
    pub path: String,
    /// As written.
    pub file: TemplateFile,
    /// Values that hold for every run: `[vars]`, then `--set`, then tune's flags.
    pub values: BTreeMap<String, String>,
}

/// What one run starts: the rendered command and environment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Launch {
    /// The configuration it runs.
    pub config: String,
    /// The command line, one argument per entry.
    pub argv: Vec<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// The strategy's own flags, rendered (what a user adds to their engine's command).
    pub flags: Vec<String>,
    /// The port the engine listens on.
    pub port: u16,
}

/// The name a configuration is shown by: `offload`, `hybrid:0.5`, `layer-split:12`.
pub fn config_name(s: &ObservedStrategy) -> String {
    match s {
        ObservedStrategy::Hybrid { fetch_fraction } => format!("hybrid:{fetch_fraction}"),
        ObservedStrategy::LayerSplit { cpu_layers }
        | ObservedStrategy::LayerSplitCached { cpu_layers } => {
            format!("{}:{cpu_layers}", s.name())
        }
        other => other.name().to_string(),
    }
}

/// The pieces of a string: literal text and placeholder names, or where it is malformed.
fn pieces(s: &str) -> std::result::Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = s;
    let mut text = String::new();
    while let Some(i) = rest.find(['{', '}']) {
        text += &rest[..i];
        let c = rest.as_bytes()[i];
        let after = &rest[i + 1..];
        if after.as_bytes().first() == Some(&c) {
            text.push(c as char);
            rest = &after[1..];
            continue;
        }
        if c == b'}' {
            return Err(format!("a lone '}}' in {s:?} (write '}}}}' for a brace)"));
        }
        let Some(end) = after.find('}') else {
            return Err(format!("an unclosed '{{' in {s:?}"));
        };
        let name = &after[..end];
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(format!(
                "{{{name}}} in {s:?} is not a placeholder name (lower-case letters, digits, '_')"
            ));
        }
        if !text.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut text)));
        }
        out.push(Piece::Name(name));
        rest = &after[end + 1..];
    }
    text += rest;
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

#[derive(Debug, PartialEq)]
enum Piece<'a> {
    Text(String),
    Name(&'a str),
}

impl Template {
    /// Read and check a template file (bounded in size), with `--set` values and the values
    /// of tune's flags (`model`, `threads`, ...; `None` where the flag was not given).
    pub fn load(
        path: &Path,
        sets: &[(String, String)],
        flags: &[(&str, Option<String>)],
    ) -> Result<Template> {
        let origin = path.display().to_string();
        let io = |source| TuneError::Io {
            path: origin.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() || meta.len() > MAX_TEMPLATE_BYTES {
            return Err(TuneError::Template {
                path: origin,
                reason: format!(
                    "not a regular file of at most {MAX_TEMPLATE_BYTES} bytes (a template is a short TOML file)"
                ),
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Template::parse(&text, &origin, sets, flags)
    }

    /// Parse and check a template's text; `origin` names it in errors.
    pub fn parse(
        text: &str,
        origin: &str,
        sets: &[(String, String)],
        flags: &[(&str, Option<String>)],
    ) -> Result<Template> {
        let bad = |reason: String| TuneError::Template {
            path: origin.to_string(),
            reason,
        };
        let file: TemplateFile = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        if file.command.is_empty() || file.command[0].trim().is_empty() {
            return Err(bad(
                "command is empty (it names the engine's program first)".into(),
            ));
        }
        if !file.ready_path.starts_with('/') {
            return Err(bad(format!(
                "ready_path {:?} must start with '/'",
                file.ready_path
            )));
        }
        let bounded = |field: &str, v: f64, hi: f64| {
            if v.is_finite() && v > 0.0 && v <= hi {
                Ok(())
            } else {
                Err(bad(format!("{field} = {v} is outside (0, {hi}]")))
            }
        };
        bounded(
            "startup_timeout_s",
            file.startup_timeout_s,
            MAX_STARTUP_TIMEOUT_S,
        )?;
        bounded("stop_grace_s", file.stop_grace_s, MAX_STOP_GRACE_S)?;
        bounded("chars_per_token", file.chars_per_token, 64.0)?;
        if file.strategies.is_empty() {
            return Err(bad(
                "no [strategies.NAME] table: map at least one strategy to the engine's flags"
                    .into(),
            ));
        }
        for (name, flags) in &file.strategies {
            if !STRATEGY_NAMES.contains(&name.as_str()) {
                return Err(bad(format!(
                    "unknown strategy [strategies.{name}]; known: {}",
                    STRATEGY_NAMES.join(", ")
                )));
            }
            if let Some(f) = flags.fetch_fraction {
                if name != "hybrid" || !(0.0..=1.0).contains(&f) {
                    return Err(bad(format!(
                        "strategies.{name}.fetch_fraction = {f}: only hybrid has one, in [0, 1]"
                    )));
                }
            }
        }
        for k in file.vars.keys() {
            if PER_RUN.contains(&k.as_str()) {
                return Err(bad(format!(
                    "vars.{k}: tune fills {{{k}}} for every run; it cannot be set"
                )));
            }
        }
        let mut values = file.vars.clone();
        for (k, v) in sets {
            if PER_RUN.contains(&k.as_str()) {
                return Err(TuneError::invalid(
                    "--set",
                    format!("{k}: tune fills {{{k}}} for every run; it cannot be set"),
                ));
            }
            values.insert(k.clone(), v.clone());
        }
        for (k, v) in flags {
            if let Some(v) = v {
                values.insert(k.to_string(), v.clone());
            }
        }
        let t = Template {
            path: origin.to_string(),
            file,
            values,
        };
        t.check()?;
        Ok(t)
    }

    /// Every name a placeholder may have in this template.
    fn known(&self) -> Vec<String> {
        let mut k: Vec<String> = PER_RUN
            .iter()
            .chain(FROM_FLAGS)
            .map(|s| s.to_string())
            .collect();
        k.extend(self.values.keys().cloned());
        k.sort();
        k.dedup();
        k
    }

    /// Render one string with `values`; `place` names it in errors.
    fn render(&self, s: &str, place: &str, values: &BTreeMap<String, String>) -> Result<String> {
        let ps = pieces(s).map_err(|reason| TuneError::Template {
            path: self.path.clone(),
            reason: format!("{place}: {reason}"),
        })?;
        let mut out = String::new();
        for p in ps {
            match p {
                Piece::Text(t) => out += &t,
                Piece::Name(n) => {
                    let known = self.known();
                    if !known.iter().any(|k| k == n) {
                        return Err(TuneError::UnknownPlaceholder {
                            path: self.path.clone(),
                            name: n.to_string(),
                            place: place.to_string(),
                            known: known.join(", "),
                        });
                    }
                    if n == "strategy_args" {
                        return Err(TuneError::Template {
                            path: self.path.clone(),
                            reason: format!(
                                "{place}: {{strategy_args}} stands alone as one argument of command"
                            ),
                        });
                    }
                    let Some(v) = values.get(n) else {
                        return Err(TuneError::MissingPlaceholder {
                            path: self.path.clone(),
                            name: n.to_string(),
                            place: place.to_string(),
                            hint: hint(n),
                        });
                    };
                    out += v;
                }
            }
        }
        Ok(out)
    }

    /// The strategies this template maps, by name.
    pub fn strategies(&self) -> impl Iterator<Item = &str> {
        self.file.strategies.keys().map(String::as_str)
    }

    /// Whether the command, an environment entry or a strategy's flags use `{name}`.
    pub fn uses(&self, name: &str) -> bool {
        let p = format!("{{{name}}}");
        self.file
            .command
            .iter()
            .chain(self.file.env.values())
            .chain(
                self.file
                    .strategies
                    .values()
                    .flat_map(|f| f.args.iter().chain(f.env.values())),
            )
            .any(|a| a.contains(&p))
    }

    /// This template with `{name}` set to `value` for every run (a run at another cache
    /// size: `with_value("cache_gb", "7")`).
    pub fn with_value(&self, name: &str, value: &str) -> Template {
        let mut t = self.clone();
        t.values.insert(name.into(), value.into());
        t
    }

    /// Whether hybrid's fetch fraction is set by the flags (else the engine's own, fixed).
    pub fn hybrid_fixed_fraction(&self) -> Option<f64> {
        self.file
            .strategies
            .get("hybrid")
            .and_then(|h| h.fetch_fraction)
    }

    /// Render every strategy with representative per-run values, so that an unknown or
    /// valueless placeholder is an error when the template is loaded.
    fn check(&self) -> Result<()> {
        for (name, flags) in &self.file.strategies {
            let uses = |p: &str| {
                flags
                    .args
                    .iter()
                    .chain(flags.env.values())
                    .chain(self.file.command.iter())
                    .any(|a| a.contains(&format!("{{{p}}}")))
            };
            match name.as_str() {
                "hybrid" if !uses("fetch_fraction") && flags.fetch_fraction.is_none() => {
                    return Err(TuneError::Template {
                        path: self.path.clone(),
                        reason: "strategies.hybrid: its args do not set {fetch_fraction}, and no fetch_fraction says which one the engine uses (the runs must record it)".into(),
                    });
                }
                "layer-split" | "layer-split-cached" if !uses("cpu_layers") => {
                    return Err(TuneError::Template {
                        path: self.path.clone(),
                        reason: format!("strategies.{name}: its args do not set {{cpu_layers}} (the N of the split)"),
                    });
                }
                _ => {}
            }
            let sample = match name.as_str() {
                "offload" => ObservedStrategy::Offload,
                "cpu" => ObservedStrategy::Cpu,
                "resident" => ObservedStrategy::Resident,
                "hybrid" => ObservedStrategy::Hybrid {
                    fetch_fraction: flags.fetch_fraction.unwrap_or(0.5),
                },
                "layer-split" => ObservedStrategy::LayerSplit { cpu_layers: 1 },
                _ => ObservedStrategy::LayerSplitCached { cpu_layers: 1 },
            };
            self.launch(&sample, 8000, "ft")?;
        }
        Ok(())
    }

    /// The command and environment that start the engine for `strategy` on `port`; `ft` is
    /// the path of this binary (`{ft}`).
    pub fn launch(&self, strategy: &ObservedStrategy, port: u16, ft: &str) -> Result<Launch> {
        let name = strategy.name();
        let Some(flags) = self.file.strategies.get(name) else {
            return Err(TuneError::invalid(
                "--strategies",
                format!(
                    "{name}: template {} maps no such strategy (it maps {})",
                    self.path,
                    self.strategies().collect::<Vec<_>>().join(", ")
                ),
            ));
        };
        let mut values = self.values.clone();
        values.insert("ft".into(), ft.into());
        values.insert("port".into(), port.to_string());
        values.insert("strategy".into(), name.into());
        match strategy {
            ObservedStrategy::Hybrid { fetch_fraction } => {
                values.insert("fetch_fraction".into(), fetch_fraction.to_string());
            }
            ObservedStrategy::LayerSplit { cpu_layers }
            | ObservedStrategy::LayerSplitCached { cpu_layers } => {
                values.insert("cpu_layers".into(), cpu_layers.to_string());
            }
            _ => {}
        }
        let flags_rendered = flags
            .args
            .iter()
            .enumerate()
            .map(|(i, a)| self.render(a, &format!("strategies.{name}.args[{i}]"), &values))
            .collect::<Result<Vec<_>>>()?;
        let mut argv = Vec::new();
        for (i, a) in self.file.command.iter().enumerate() {
            if a == "{strategy_args}" {
                argv.extend(flags_rendered.iter().cloned());
            } else {
                argv.push(self.render(a, &format!("command[{i}]"), &values)?);
            }
        }
        let mut env = BTreeMap::new();
        for (k, v) in self.file.env.iter() {
            env.insert(k.clone(), self.render(v, &format!("env.{k}"), &values)?);
        }
        for (k, v) in flags.env.iter() {
            env.insert(
                k.clone(),
                self.render(v, &format!("strategies.{name}.env.{k}"), &values)?,
            );
        }
        Ok(Launch {
            config: config_name(strategy),
            argv,
            env,
            flags: flags_rendered,
            port,
        })
    }
}

/// How to give a placeholder a value.
fn hint(name: &str) -> String {
    match name {
        "model" => {
            "pass --model (the engine's model: a path or a name it knows) or --set model=...".into()
        }
        "threads" => "pass --threads (the engine's CPU threads) or --set threads=...".into(),
        "cache_gb" => {
            "pass --cache-gb (the engine's GPU expert cache, GiB) or --set cache_gb=...".into()
        }
        "fetch_fraction" => {
            "only a hybrid run has a fetch fraction; use it in strategies.hybrid.args".into()
        }
        "cpu_layers" => "only a layer split has an N; use it in strategies.layer-split.args".into(),
        other => format!("set it in the template's [vars] or with --set {other}=..."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
name = "test"
command = ["{ft}", "serve", "--port", "{port}", "--model", "{model}", "{strategy_args}", "--x={{literal}}"]
[vars]
model = "tiny"
[strategies.offload]
args = ["--moe-strategy", "offload"]
[strategies.hybrid]
args = ["--moe-strategy", "hybrid", "--fetch-fraction", "{fetch_fraction}"]
env = { POOL = "{threads}" }
[strategies.layer-split]
args = ["--n-cpu-moe", "{cpu_layers}"]
"#;

    fn parse(text: &str) -> Result<Template> {
        Template::parse(text, "t.toml", &[], &[("threads", Some("4".into()))])
    }

    #[test]
    fn a_template_renders_each_strategy_with_its_parameters() {
        let t = parse(OK).unwrap();
        let l = t
            .launch(
                &ObservedStrategy::Hybrid {
                    fetch_fraction: 0.25,
                },
                9001,
                "/bin/ft",
            )
            .unwrap();
        assert_eq!(
            l.argv,
            [
                "/bin/ft",
                "serve",
                "--port",
                "9001",
                "--model",
                "tiny",
                "--moe-strategy",
                "hybrid",
                "--fetch-fraction",
                "0.25",
                "--x={literal}"
            ]
        );
        assert_eq!(
            l.flags,
            ["--moe-strategy", "hybrid", "--fetch-fraction", "0.25"]
        );
        assert_eq!(l.env["POOL"], "4");
        assert_eq!(l.config, "hybrid:0.25");
        let s = t
            .launch(&ObservedStrategy::LayerSplit { cpu_layers: 12 }, 1, "ft")
            .unwrap();
        assert_eq!(s.flags, ["--n-cpu-moe", "12"]);
        let e = t.launch(&ObservedStrategy::Cpu, 1, "ft").unwrap_err();
        assert!(e.to_string().contains("maps no such strategy"), "{e}");
        // --set overrides [vars]; tune's flags override both.
        let t = Template::parse(
            OK,
            "t.toml",
            &[("model".into(), "big".into())],
            &[("threads", Some("2".into()))],
        )
        .unwrap();
        let l = t.launch(&ObservedStrategy::Offload, 1, "ft").unwrap();
        assert_eq!(l.argv[5], "big");
    }

    #[test]
    fn an_unknown_or_valueless_placeholder_is_refused_by_name_at_load() {
        let unknown = OK.replace("\"{model}\"", "\"{modle}\"");
        let e = parse(&unknown).unwrap_err();
        assert!(
            matches!(&e, TuneError::UnknownPlaceholder { name, place, .. } if name == "modle" && place == "command[5]"),
            "{e}"
        );
        assert!(e.to_string().contains("{modle}") && e.to_string().contains("t.toml"));
        // Known, but nothing gives it a value.
        let e = Template::parse(OK, "t.toml", &[], &[]).unwrap_err();
        assert!(
            matches!(&e, TuneError::MissingPlaceholder { name, .. } if name == "threads"),
            "{e}"
        );
        assert!(e.to_string().contains("--threads"), "{e}");
        let no_model = OK.replace("model = \"tiny\"", "");
        let e = parse(&no_model).unwrap_err().to_string();
        assert!(e.contains("{model}") && e.contains("--model"), "{e}");
    }

    #[test]
    fn malformed_templates_are_refused_with_the_reason() {
        let cases = [
            (
                OK.replace("{strategy_args}\"", "{strategy_args} \""),
                "stands alone",
            ),
            (OK.replace("\"{port}\"", "\"{port\""), "unclosed"),
            (OK.replace("\"{port}\"", "\"port}\""), "lone"),
            (
                OK.replace("\"{port}\"", "\"{Port}\""),
                "not a placeholder name",
            ),
            (
                OK.replace("[strategies.offload]", "[strategies.fused]"),
                "unknown strategy",
            ),
            (OK.replace("name = ", "nmae = "), "unknown field"),
            (
                OK.replace("\"{fetch_fraction}\"", "\"0.5\""),
                "fetch_fraction",
            ),
            (OK.replace("\"{cpu_layers}\"", "\"3\""), "cpu_layers"),
            (
                OK.replace("model = \"tiny\"", "port = \"1\""),
                "cannot be set",
            ),
            (
                format!("{OK}\nstartup_timeout_s = -1\n"),
                "startup_timeout_s",
            ),
            (
                "command = []\n[strategies.offload]\n".to_string(),
                "command is empty",
            ),
            ("command = [\"x\"]\n".to_string(), "strategies"),
        ];
        for (text, want) in cases {
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        let e = Template::parse(OK, "t.toml", &[("port".into(), "1".into())], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--set") && e.contains("port"), "{e}");
    }

    #[test]
    fn the_shipped_templates_load_and_render_every_strategy() {
        let flags = [
            ("model", Some("m".to_string())),
            ("threads", Some("4".to_string())),
            ("cache_gb", Some("2".to_string())),
            ("max_streams", Some("2".to_string())),
            ("context", Some("2000".to_string())),
            ("total_context", Some("4000".to_string())),
        ];
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/templates");
        let mut seen = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let t = Template::load(&p, &[], &flags).unwrap();
            seen.push(t.file.name.clone());
            let l = t
                .launch(&ObservedStrategy::LayerSplit { cpu_layers: 7 }, 1, "ft")
                .map(|l| l.flags);
            if t.strategies().any(|s| s == "layer-split") {
                assert_eq!(l.unwrap(), ["--n-cpu-moe", "7"]);
            }
        }
        seen.sort();
        assert_eq!(seen, ["freetoken", "ft-serve", "llama-server"]);
    }

    #[test]
    fn an_engine_that_picks_its_own_fraction_records_it() {
        let fixed = OK.replace(
            "args = [\"--moe-strategy\", \"hybrid\", \"--fetch-fraction\", \"{fetch_fraction}\"]",
            "args = [\"--moe-strategy\", \"hybrid\"]\nfetch_fraction = 0.277",
        );
        let t = parse(&fixed).unwrap();
        assert_eq!(t.hybrid_fixed_fraction(), Some(0.277));
    }
}
