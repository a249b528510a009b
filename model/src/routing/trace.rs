//! Routing traces: replay ([`TraceReader`]) and recording ([`TraceWriter`], [`RecordingSource`]).
//!
//! A trace lets a run be repeated exactly (`--record`, then replay), and lets routing exported
//! by another engine (or converted from a public dataset with `scripts/convert_trace.py`) drive
//! the runtime, the simulator and the analytic model. Two forms, both specified byte for byte in
//! `docs/routing.md`:
//!
//! - **JSON lines** (`.jsonl`): a header object, then one object per (step, stream, layer):
//!   `{"step":0,"stream":0,"layer":0,"experts":[3,17],"weights":[0.6,0.4]}`;
//! - **binary** (`.ftrt`): a 32-byte header (magic `FTROUTE\0`, version, id width, geometry)
//!   and one block per step (little-endian).
//!
//! Readers stream the file (a trace may be longer than memory allows to hold at once), check the
//! geometry against the model's, validate every route, and name the file and line (JSON lines)
//! or byte offset (binary) in every error.

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::{RoutingSource, StepRouting, TokenRoute};
use crate::error::{ModelError, Result};
use crate::geometry::MoeGeometry;

/// Value of the header's `format` field in a JSON-lines trace.
pub const TRACE_FORMAT_NAME: &str = "ft-routing-trace";
/// Version of both trace forms described in `docs/routing.md`.
pub const TRACE_VERSION: u32 = 1;
/// First 8 bytes of a binary trace.
pub const BINARY_MAGIC: [u8; 8] = *b"FTROUTE\0";
/// Bytes of the binary header: magic (8), version, id width, experts, top_k, moe_layers,
/// reserved (6 x u32).
pub const BINARY_HEADER_BYTES: usize = 32;
/// Most streams one step of a trace may hold (a `stream` index of a JSON-lines record, a
/// binary block's stream count). A step is held in memory whole (`streams x moe_layers`
/// routes), so an input-given count is checked before anything is allocated for it; no
/// engine decodes more concurrent sequences than this.
pub const MAX_TRACE_STREAMS: usize = 4096;

/// The two trace forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceFormat {
    /// JSON lines: a header object, then one object per (step, stream, layer).
    JsonLines,
    /// The compact little-endian binary form.
    Binary,
}

impl TraceFormat {
    /// The form a file name implies: `.jsonl`, `.ndjson` or `.json` for JSON lines, `.ftrt` or
    /// `.bin` for binary; other extensions are an error naming the path.
    pub fn from_path(path: &Path) -> Result<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "ndjson" | "json") => Ok(TraceFormat::JsonLines),
            Some("ftrt" | "bin") => Ok(TraceFormat::Binary),
            _ => Err(ModelError::invalid(
                path.display().to_string(),
                "a trace file name must end in .jsonl (JSON lines) or .ftrt (binary)",
            )),
        }
    }
}

/// The header line of a JSON-lines trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonHeader {
    /// Always [`TRACE_FORMAT_NAME`].
    format: String,
    /// Always [`TRACE_VERSION`].
    version: u32,
    /// Routed experts per layer.
    experts: usize,
    /// Experts per token per layer.
    top_k: usize,
    /// MoE layers.
    moe_layers: usize,
    /// Model width, if the exporter knows it (checked when present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hidden: Option<usize>,
    /// Expert FFN width, if the exporter knows it (checked when present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    intermediate: Option<usize>,
    /// Free text: the model or engine the trace came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
}

/// One (step, stream, layer) line of a JSON-lines trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRecord {
    step: u64,
    stream: u32,
    layer: u32,
    experts: Vec<u32>,
    /// Router weights; absent means equal weights (1 / top_k each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    weights: Option<Vec<f32>>,
    /// The request (sequence) the stream serves at this step, as the engine names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request: Option<String>,
    /// Position of the token within its request (0 for the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
}

/// What a trace may say about a stream at a step beyond its routing (JSON lines only).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamTag {
    /// The request id the stream serves.
    pub request: Option<String>,
    /// The token's position within its request.
    pub token: Option<u64>,
}

impl StreamTag {
    /// `request "r-1" token 5`, or `no request` / `no token` for what is absent (errors).
    fn describe(&self) -> String {
        let r = match &self.request {
            Some(r) => format!("request {r:?}"),
            None => "no request".to_string(),
        };
        match self.token {
            Some(t) => format!("{r} token {t}"),
            None => format!("{r}, no token"),
        }
    }
}

/// Check a trace's geometry against the model's; the error lists every difference.
fn check_geometry(
    origin: &str,
    expected: &MoeGeometry,
    experts: usize,
    top_k: usize,
    moe_layers: usize,
    hidden: Option<usize>,
    intermediate: Option<usize>,
) -> Result<()> {
    let mut diffs = Vec::new();
    for (name, trace, model) in [
        ("experts", Some(experts), expected.experts),
        ("top_k", Some(top_k), expected.top_k),
        ("moe_layers", Some(moe_layers), expected.moe_layers),
        ("hidden", hidden, expected.hidden),
        ("intermediate", intermediate, expected.intermediate),
    ] {
        if let Some(t) = trace {
            if t != model {
                diffs.push(format!("{name} = {t} in the trace, {model} in the model"));
            }
        }
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(ModelError::invalid(
            origin,
            format!(
                "trace geometry does not match the model: {}",
                diffs.join("; ")
            ),
        ))
    }
}

/// Streaming JSON-lines parser.
struct JsonLinesReader {
    lines: Box<dyn BufRead + Send>,
    /// Line number of the last line read (1-based).
    line_no: usize,
    /// A record of the next step, read ahead, with its line number.
    lookahead: Option<(JsonRecord, usize)>,
    buf: String,
}

impl JsonLinesReader {
    /// Read the next non-empty line; `None` at the end.
    fn next_line(&mut self, origin: &str) -> Result<Option<usize>> {
        loop {
            self.buf.clear();
            let n = self
                .lines
                .read_line(&mut self.buf)
                .map_err(|source| ModelError::Io {
                    path: format!("{origin}:{}", self.line_no + 1),
                    source,
                })?;
            if n == 0 {
                return Ok(None);
            }
            self.line_no += 1;
            if !self.buf.trim().is_empty() {
                return Ok(Some(self.line_no));
            }
        }
    }

    fn parse_record(&self, origin: &str, line: usize) -> Result<JsonRecord> {
        serde_json::from_str(self.buf.trim()).map_err(|e| ModelError::Json {
            path: format!("{origin}:{line}"),
            message: format!("not a trace record ({e})"),
        })
    }
}

/// Streaming binary parser.
struct BinaryReader {
    bytes: Box<dyn BufRead + Send>,
    /// Byte offset of the next byte to read.
    offset: u64,
    id_bytes: usize,
}

impl BinaryReader {
    /// Fill `buf` exactly; `Ok(false)` on a clean end of file before the first byte.
    fn read_exact_or_eof(
        &mut self,
        origin: &str,
        buf: &mut [u8],
        what: impl Fn() -> String,
    ) -> Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            match self.bytes.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(ModelError::Io {
                        path: format!("{origin} (byte {})", self.offset + got as u64),
                        source,
                    })
                }
            }
        }
        if got == 0 && !buf.is_empty() {
            return Ok(false);
        }
        if got < buf.len() {
            return Err(ModelError::invalid(
                origin,
                format!(
                    "truncated binary trace: {} at byte {} needs {} bytes, {got} remain",
                    what(),
                    self.offset,
                    buf.len()
                ),
            ));
        }
        self.offset += got as u64;
        Ok(true)
    }
}

enum Inner {
    Json(JsonLinesReader),
    Binary(BinaryReader),
}

/// Most bytes of a JSON-lines trace's header line (a header is about a hundred bytes; the
/// limit keeps a file without line breaks from being read whole to find its first line).
pub const MAX_HEADER_BYTES: u64 = 64 * 1024;

/// The routed geometry a trace file declares in its header (either form), without reading
/// its steps: `hidden` and `intermediate` are those of the header when given, else 0
/// (unknown). Lets a command route a trace without being told the model.
pub fn trace_geometry(path: &Path) -> Result<MoeGeometry> {
    let origin = path.display().to_string();
    let file = File::open(path).map_err(|source| ModelError::Io {
        path: origin.clone(),
        source,
    })?;
    let mut head = Vec::new();
    BufReader::new(file)
        .take(MAX_HEADER_BYTES)
        .read_until(b'\n', &mut head)
        .map_err(|source| ModelError::Io {
            path: origin.clone(),
            source,
        })?;
    let geometry = |experts: usize, top_k: usize, moe_layers: usize, h, i| MoeGeometry {
        hidden: h,
        intermediate: i,
        experts,
        top_k,
        moe_layers,
        shared_experts: 0,
    };
    if head.len() >= BINARY_MAGIC.len() && head[..8] == BINARY_MAGIC {
        // The binary header may hold a newline byte anywhere: read its fixed size instead.
        let mut h = [0u8; BINARY_HEADER_BYTES];
        let mut f = File::open(path).map_err(|source| ModelError::Io {
            path: origin.clone(),
            source,
        })?;
        f.read_exact(&mut h).map_err(|_| {
            ModelError::invalid(&origin, "truncated binary trace: no complete header")
        })?;
        let word = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        return Ok(geometry(
            word(16) as usize,
            word(20) as usize,
            word(24) as usize,
            0,
            0,
        ));
    }
    let text = std::str::from_utf8(&head).map_err(|_| {
        ModelError::invalid(
            &origin,
            "neither a binary trace nor a UTF-8 JSON-lines trace",
        )
    })?;
    let header: JsonHeader = serde_json::from_str(text.trim()).map_err(|e| ModelError::Json {
        path: format!("{origin}:1"),
        message: format!("not a trace header ({e})"),
    })?;
    if header.format != TRACE_FORMAT_NAME {
        return Err(ModelError::invalid(
            format!("{origin}:1"),
            format!(
                "header says format '{}', not '{TRACE_FORMAT_NAME}'",
                header.format
            ),
        ));
    }
    Ok(geometry(
        header.experts,
        header.top_k,
        header.moe_layers,
        header.hidden.unwrap_or(0),
        header.intermediate.unwrap_or(0),
    ))
}

/// Replays a trace file as a [`RoutingSource`].
///
/// `next_step(streams)` returns the trace's next step restricted to its first `streams`
/// streams; asking for more streams than the step holds is an error naming the step. At the
/// end of the trace it is an error too, unless [`TraceReader::looping`] was set (the trace
/// then starts again from its first step; step numbers keep increasing).
pub struct TraceReader {
    origin: String,
    path: Option<PathBuf>,
    geometry: MoeGeometry,
    format: TraceFormat,
    inner: Inner,
    looping: bool,
    /// Steps handed out so far.
    served: u64,
    /// Steps read in the current pass over the file.
    pass_steps: u64,
    /// Step number of the last step read in this pass (must increase).
    last_step: Option<u64>,
}

impl std::fmt::Debug for TraceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceReader")
            .field("origin", &self.origin)
            .field("format", &self.format)
            .field("served", &self.served)
            .finish()
    }
}

impl TraceReader {
    /// Open a trace file (either form, recognised by its first 8 bytes) for a model geometry.
    pub fn open(path: &Path, expected: &MoeGeometry) -> Result<Self> {
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let mut r = Self::from_reader(BufReader::new(file), &path.display().to_string(), expected)?;
        r.path = Some(path.to_path_buf());
        Ok(r)
    }

    /// Read a trace from any buffered reader; `origin` names it in errors.
    pub fn from_reader(
        mut reader: impl BufRead + Send + 'static,
        origin: &str,
        expected: &MoeGeometry,
    ) -> Result<Self> {
        let head = reader.fill_buf().map_err(|source| ModelError::Io {
            path: origin.to_string(),
            source,
        })?;
        let is_binary = head.len() >= BINARY_MAGIC.len() && head[..8] == BINARY_MAGIC;
        let (format, inner) = if is_binary {
            let mut b = BinaryReader {
                bytes: Box::new(reader),
                offset: 0,
                id_bytes: 0,
            };
            let mut h = [0u8; BINARY_HEADER_BYTES];
            if !b.read_exact_or_eof(origin, &mut h, || "the header".into())? {
                return Err(ModelError::invalid(origin, "empty trace"));
            }
            let word = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
            let version = word(8);
            if version != TRACE_VERSION {
                return Err(ModelError::invalid(
                    origin,
                    format!(
                        "binary trace version {version}; this build reads version {TRACE_VERSION}"
                    ),
                ));
            }
            let id_bytes = word(12) as usize;
            if id_bytes != 2 && id_bytes != 4 {
                return Err(ModelError::invalid(
                    origin,
                    format!("binary trace id width {id_bytes} bytes; must be 2 or 4"),
                ));
            }
            b.id_bytes = id_bytes;
            check_geometry(
                origin,
                expected,
                word(16) as usize,
                word(20) as usize,
                word(24) as usize,
                None,
                None,
            )?;
            (TraceFormat::Binary, Inner::Binary(b))
        } else {
            let mut j = JsonLinesReader {
                lines: Box::new(reader),
                line_no: 0,
                lookahead: None,
                buf: String::new(),
            };
            let Some(line) = j.next_line(origin)? else {
                return Err(ModelError::invalid(origin, "empty trace (no header line)"));
            };
            let header: JsonHeader =
                serde_json::from_str(j.buf.trim()).map_err(|e| ModelError::Json {
                    path: format!("{origin}:{line}"),
                    message: format!(
                        "not a trace header ({e}); the first line must be \
                         {{\"format\":\"{TRACE_FORMAT_NAME}\",\"version\":{TRACE_VERSION},\
                         \"experts\":..,\"top_k\":..,\"moe_layers\":..}}"
                    ),
                })?;
            if header.format != TRACE_FORMAT_NAME || header.version != TRACE_VERSION {
                return Err(ModelError::invalid(
                    format!("{origin}:{line}"),
                    format!(
                        "header says format '{}' version {}; this build reads '{TRACE_FORMAT_NAME}' version {TRACE_VERSION}",
                        header.format, header.version
                    ),
                ));
            }
            check_geometry(
                origin,
                expected,
                header.experts,
                header.top_k,
                header.moe_layers,
                header.hidden,
                header.intermediate,
            )?;
            (TraceFormat::JsonLines, Inner::Json(j))
        };
        Ok(TraceReader {
            origin: origin.to_string(),
            path: None,
            geometry: *expected,
            format,
            inner,
            looping: false,
            served: 0,
            pass_steps: 0,
            last_step: None,
        })
    }

    /// Start again from the first step at the end of the trace instead of failing. Only for
    /// traces opened from a file ([`TraceReader::open`]); others still fail at the end.
    pub fn looping(mut self, on: bool) -> Self {
        self.looping = on;
        self
    }

    /// Which form the trace is in.
    pub fn format(&self) -> TraceFormat {
        self.format
    }

    /// Steps handed out so far.
    pub fn steps_served(&self) -> u64 {
        self.served
    }

    /// Read the next whole step (all its streams), validated; `None` at the end.
    pub fn read_step(&mut self) -> Result<Option<StepRouting>> {
        Ok(self.read_step_tagged()?.map(|(step, _)| step))
    }

    /// [`TraceReader::read_step`] with each stream's tag (its request id and token position;
    /// one per stream, empty tags where the trace has none, as in the binary form). Every
    /// record of one stream at one step must carry the same tag.
    pub fn read_step_tagged(&mut self) -> Result<Option<(StepRouting, Vec<StreamTag>)>> {
        let step = match &mut self.inner {
            Inner::Json(j) => read_json_step(j, &self.origin, &self.geometry)?,
            Inner::Binary(b) => read_binary_step(b, &self.origin, &self.geometry)?.map(|s| {
                let tags = vec![StreamTag::default(); s.streams()];
                (s, tags)
            }),
        };
        if let Some((s, _)) = &step {
            if let Some(last) = self.last_step {
                if s.step <= last {
                    return Err(ModelError::invalid(
                        &self.origin,
                        format!(
                            "step {} follows step {last}; steps must increase through the trace",
                            s.step
                        ),
                    ));
                }
            }
            self.last_step = Some(s.step);
            self.pass_steps += 1;
        }
        Ok(step)
    }

    /// Reopen the file for another pass.
    fn restart(&mut self) -> Result<()> {
        let Some(path) = self.path.clone() else {
            return Err(ModelError::invalid(
                &self.origin,
                "cannot loop a trace that was not opened from a file",
            ));
        };
        if self.pass_steps == 0 {
            return Err(ModelError::invalid(
                &self.origin,
                "the trace holds no steps",
            ));
        }
        let again = TraceReader::open(&path, &self.geometry)?;
        self.inner = again.inner;
        self.pass_steps = 0;
        self.last_step = None;
        Ok(())
    }
}

fn read_json_step(
    j: &mut JsonLinesReader,
    origin: &str,
    geometry: &MoeGeometry,
) -> Result<Option<(StepRouting, Vec<StreamTag>)>> {
    let first = match j.lookahead.take() {
        Some(r) => r,
        None => match j.next_line(origin)? {
            None => return Ok(None),
            Some(line) => (j.parse_record(origin, line)?, line),
        },
    };
    let step_no = first.0.step;
    let start_line = first.1;
    let layers = geometry.moe_layers;
    // [layer][stream]; None until seen.
    let mut grid: Vec<Vec<Option<TokenRoute>>> = vec![Vec::new(); layers];
    // [stream]: the tag of the stream's first record at this step, and its line.
    let mut tags: Vec<Option<(StreamTag, usize)>> = Vec::new();
    let mut place = |rec: JsonRecord, line: usize| -> Result<()> {
        let at = format!("{origin}:{line}");
        let l = rec.layer as usize;
        if l >= layers {
            return Err(ModelError::invalid(
                at,
                format!("layer {l} is out of range (the model has {layers} MoE layers)"),
            ));
        }
        let tag = StreamTag {
            request: rec.request,
            token: rec.token,
        };
        let weights = match rec.weights {
            Some(w) => w,
            None => vec![1.0 / rec.experts.len().max(1) as f32; rec.experts.len()],
        };
        let route = TokenRoute {
            experts: rec.experts,
            weights,
        };
        route.validate(geometry, &at)?;
        let s = rec.stream as usize;
        if s >= MAX_TRACE_STREAMS {
            return Err(ModelError::invalid(
                at,
                format!("stream {s} is beyond the limit of {MAX_TRACE_STREAMS} streams per step"),
            ));
        }
        let row = &mut grid[l];
        if row.len() <= s {
            row.resize(s + 1, None);
        }
        if row[s].is_some() {
            return Err(ModelError::invalid(
                at,
                format!("step {} stream {s} layer {l} appears twice", rec.step),
            ));
        }
        row[s] = Some(route);
        if tags.len() <= s {
            tags.resize(s + 1, None);
        }
        match &tags[s] {
            None => tags[s] = Some((tag, line)),
            Some((first, first_line)) if *first != tag => {
                return Err(ModelError::invalid(
                    at,
                    format!(
                        "step {} stream {s} layer {l} is tagged {} but line {first_line} tags \
                         the same step and stream {}; a stream serves one token of one \
                         request per step",
                        rec.step,
                        tag.describe(),
                        first.describe()
                    ),
                ));
            }
            Some(_) => {}
        }
        Ok(())
    };
    place(first.0, first.1)?;
    while let Some(line) = j.next_line(origin)? {
        let rec = j.parse_record(origin, line)?;
        if rec.step != step_no {
            j.lookahead = Some((rec, line));
            break;
        }
        place(rec, line)?;
    }
    let streams = grid.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::with_capacity(layers);
    for (l, row) in grid.into_iter().enumerate() {
        let mut routes = Vec::with_capacity(streams);
        for s in 0..streams {
            match row.get(s).cloned().flatten() {
                Some(r) => routes.push(r),
                None => {
                    return Err(ModelError::invalid(
                        format!("{origin}:{start_line}"),
                        format!(
                            "step {step_no} (starting at this line) has no record for stream {s} \
                             layer {l}; every stream below {streams} needs all {layers} layers"
                        ),
                    ))
                }
            }
        }
        out.push(routes);
    }
    let tags = tags
        .into_iter()
        .map(|t| t.map(|(tag, _)| tag).unwrap_or_default())
        .collect();
    Ok(Some((
        StepRouting {
            step: step_no,
            layers: out,
        },
        tags,
    )))
}

fn read_binary_step(
    b: &mut BinaryReader,
    origin: &str,
    geometry: &MoeGeometry,
) -> Result<Option<StepRouting>> {
    let block_at = b.offset;
    let mut head = [0u8; 12];
    if !b.read_exact_or_eof(origin, &mut head, || "a step header".into())? {
        return Ok(None);
    }
    let step = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let streams = u32::from_le_bytes(head[8..].try_into().expect("4 bytes")) as usize;
    if streams > MAX_TRACE_STREAMS {
        return Err(ModelError::invalid(
            origin,
            format!(
                "step {step} (block at byte {block_at}) holds {streams} streams, beyond the \
                 limit of {MAX_TRACE_STREAMS}"
            ),
        ));
    }
    let k = geometry.top_k;
    let route_bytes = k * (b.id_bytes + 4);
    let mut buf = vec![0u8; route_bytes];
    let mut layers = Vec::with_capacity(geometry.moe_layers);
    for l in 0..geometry.moe_layers {
        let mut routes = Vec::with_capacity(streams);
        for s in 0..streams {
            let at = b.offset;
            if !b.read_exact_or_eof(origin, &mut buf, || {
                format!("step {step} (block at byte {block_at}) layer {l} stream {s}")
            })? {
                return Err(ModelError::invalid(
                    origin,
                    format!(
                        "truncated binary trace: step {step} (block at byte {block_at}) ends \
                         before layer {l} stream {s}"
                    ),
                ));
            }
            let (ids, ws) = buf.split_at(k * b.id_bytes);
            let experts = ids
                .chunks_exact(b.id_bytes)
                .map(|c| match c.len() {
                    2 => u16::from_le_bytes([c[0], c[1]]) as u32,
                    _ => u32::from_le_bytes(c.try_into().expect("4 bytes")),
                })
                .collect();
            let weights = ws
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            let route = TokenRoute { experts, weights };
            route.validate(
                geometry,
                &format!("{origin} (byte {at}: step {step} layer {l} stream {s})"),
            )?;
            routes.push(route);
        }
        layers.push(routes);
    }
    Ok(Some(StepRouting { step, layers }))
}

impl RoutingSource for TraceReader {
    fn geometry(&self) -> &MoeGeometry {
        &self.geometry
    }

    fn next_step(&mut self, streams: usize) -> Result<StepRouting> {
        let step = match self.read_step()? {
            Some(s) => s,
            None if self.looping => {
                self.restart()?;
                self.read_step()?
                    .ok_or_else(|| ModelError::invalid(&self.origin, "the trace holds no steps"))?
            }
            None => {
                return Err(ModelError::invalid(
                    &self.origin,
                    format!(
                        "the trace ended after {} steps; record a longer one or replay it looping",
                        self.served
                    ),
                ))
            }
        };
        if step.streams() < streams {
            return Err(ModelError::invalid(
                &self.origin,
                format!(
                    "step {} holds {} streams; {streams} were requested",
                    step.step,
                    step.streams()
                ),
            ));
        }
        self.served += 1;
        if step.streams() == streams {
            Ok(step)
        } else {
            Ok(step.truncated(streams))
        }
    }
}

/// Requests [`trace_requests`] lists one by one; the count and the token statistics cover all.
pub const REQUESTS_LISTED: usize = 64;

/// One request of a trace: a run of consecutive steps in which one stream carries one
/// request id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceRequest {
    /// The stream that serves it.
    pub stream: u32,
    /// Its id, as the trace names it.
    pub request: String,
    /// The step number of its first token.
    pub first_step: u64,
    /// Its tokens in the trace (steps of the run).
    pub tokens: u64,
    /// The position of its first and last token in the trace, where tagged.
    #[serde(default)]
    pub first_token: Option<u64>,
    #[serde(default)]
    pub last_token: Option<u64>,
}

/// The requests a trace's streams serve, from its `request` and `token` tags
/// ([`trace_requests`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TraceRequests {
    /// Steps read.
    pub steps: u64,
    /// Largest stream count of a step.
    pub streams: usize,
    /// (step, stream) pairs read, and those of them with a request id.
    pub stream_steps: u64,
    pub tagged: u64,
    /// Requests: maximal runs of consecutive steps in which one stream carries one id.
    pub requests: u64,
    /// Tokens per request: fewest, most and mean (0 without requests).
    pub tokens_min: u64,
    pub tokens_max: u64,
    pub tokens_mean: f64,
    /// Steps at which a request's token position is not its previous one plus 1 (a trace of
    /// every token has none).
    pub token_gaps: u64,
    /// The first [`REQUESTS_LISTED`] requests, in the order they end.
    pub listed: Vec<TraceRequest>,
}

impl TraceRequests {
    fn close(&mut self, r: TraceRequest) {
        self.requests += 1;
        self.tokens_min = if self.requests == 1 {
            r.tokens
        } else {
            self.tokens_min.min(r.tokens)
        };
        self.tokens_max = self.tokens_max.max(r.tokens);
        // Running mean, exact for the counts a trace holds.
        self.tokens_mean += (r.tokens as f64 - self.tokens_mean) / self.requests as f64;
        if self.listed.len() < REQUESTS_LISTED {
            self.listed.push(r);
        }
    }
}

/// Read a trace (either form; the binary one has no tags) and gather the requests its
/// streams serve: what `ft routing stats` reports beside the routing, so that a trace
/// written by `ft run --record` or `ft routing import` shows its requests again. Memory
/// holds one step and one open request per stream, whatever the trace's length.
pub fn trace_requests(path: &Path) -> Result<TraceRequests> {
    let geometry = trace_geometry(path)?;
    let mut reader = TraceReader::open(path, &geometry)?;
    let mut out = TraceRequests::default();
    let mut open: Vec<Option<TraceRequest>> = Vec::new();
    while let Some((step, tags)) = reader.read_step_tagged()? {
        out.steps += 1;
        out.streams = out.streams.max(tags.len());
        out.stream_steps += tags.len() as u64;
        if open.len() < tags.len() {
            open.resize(tags.len(), None);
        }
        for (s, cur) in open.iter_mut().enumerate() {
            let tag = tags.get(s);
            let id = tag.and_then(|t| t.request.as_deref());
            let token = tag.and_then(|t| t.token);
            match (cur.as_mut(), id) {
                (Some(r), Some(id)) if r.request == id => {
                    if let (Some(last), Some(t)) = (r.last_token, token) {
                        if t != last + 1 {
                            out.token_gaps += 1;
                        }
                    }
                    r.tokens += 1;
                    r.last_token = token.or(r.last_token);
                    r.first_token = r.first_token.or(token);
                }
                _ => {
                    if let Some(done) = cur.take() {
                        out.close(done);
                    }
                    if let Some(id) = id {
                        *cur = Some(TraceRequest {
                            stream: s as u32,
                            request: id.to_string(),
                            first_step: step.step,
                            tokens: 1,
                            first_token: token,
                            last_token: token,
                        });
                    }
                }
            }
            if id.is_some() {
                out.tagged += 1;
            }
        }
    }
    for r in open.into_iter().flatten() {
        out.close(r);
    }
    Ok(out)
}

/// Writes steps to a trace in either form.
pub struct TraceWriter {
    origin: String,
    out: BufWriter<Box<dyn Write + Send>>,
    format: TraceFormat,
    geometry: MoeGeometry,
    id_bytes: usize,
    last_step: Option<u64>,
    steps: u64,
}

impl std::fmt::Debug for TraceWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceWriter")
            .field("origin", &self.origin)
            .field("format", &self.format)
            .field("steps", &self.steps)
            .finish()
    }
}

impl TraceWriter {
    /// Create (truncate) a trace file; the form follows the extension
    /// ([`TraceFormat::from_path`]).
    pub fn create(path: &Path, geometry: &MoeGeometry) -> Result<Self> {
        let format = TraceFormat::from_path(path)?;
        let file = File::create(path).map_err(|source| ModelError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::new(
            Box::new(file),
            &path.display().to_string(),
            format,
            geometry,
        )
    }

    /// Write a trace to any writer (the header is written at once); `origin` names it in errors.
    pub fn new(
        writer: Box<dyn Write + Send>,
        origin: &str,
        format: TraceFormat,
        geometry: &MoeGeometry,
    ) -> Result<Self> {
        let source = format!("ft {}", env!("CARGO_PKG_VERSION"));
        Self::with_source(writer, origin, format, geometry, &source)
    }

    /// [`TraceWriter::new`] with the header's free-text `source` (JSON lines). A geometry
    /// whose `hidden` or `intermediate` is 0 (unknown, as in an imported trace) leaves that
    /// field out of the header, so any model of the routed geometry reads the trace.
    pub fn with_source(
        writer: Box<dyn Write + Send>,
        origin: &str,
        format: TraceFormat,
        geometry: &MoeGeometry,
        source: &str,
    ) -> Result<Self> {
        let id_bytes = if geometry.experts <= u16::MAX as usize + 1 {
            2
        } else {
            4
        };
        let mut w = TraceWriter {
            origin: origin.to_string(),
            out: BufWriter::new(writer),
            format,
            geometry: *geometry,
            id_bytes,
            last_step: None,
            steps: 0,
        };
        match format {
            TraceFormat::JsonLines => {
                let header = JsonHeader {
                    format: TRACE_FORMAT_NAME.to_string(),
                    version: TRACE_VERSION,
                    experts: geometry.experts,
                    top_k: geometry.top_k,
                    moe_layers: geometry.moe_layers,
                    hidden: (geometry.hidden > 0).then_some(geometry.hidden),
                    intermediate: (geometry.intermediate > 0).then_some(geometry.intermediate),
                    source: Some(source.to_string()),
                };
                let line = serde_json::to_string(&header).expect("a header always serializes");
                w.write_bytes(line.as_bytes())?;
                w.write_bytes(b"\n")?;
            }
            TraceFormat::Binary => {
                let mut h = Vec::with_capacity(BINARY_HEADER_BYTES);
                h.extend_from_slice(&BINARY_MAGIC);
                for v in [
                    TRACE_VERSION,
                    id_bytes as u32,
                    geometry.experts as u32,
                    geometry.top_k as u32,
                    geometry.moe_layers as u32,
                    0,
                ] {
                    h.extend_from_slice(&v.to_le_bytes());
                }
                debug_assert_eq!(h.len(), BINARY_HEADER_BYTES);
                w.write_bytes(&h)?;
            }
        }
        Ok(w)
    }

    fn write_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|source| ModelError::Io {
            path: self.origin.clone(),
            source,
        })
    }

    /// Append one step (validated against the geometry; step numbers must increase).
    pub fn write_step(&mut self, step: &StepRouting) -> Result<()> {
        self.write_step_tagged(step, &[])
    }

    /// Append one step with a tag per stream (its request id and token position; written to
    /// JSON lines, not kept by the binary form). `tags` may be shorter than the streams.
    pub fn write_step_tagged(&mut self, step: &StepRouting, tags: &[StreamTag]) -> Result<()> {
        if step.streams() > MAX_TRACE_STREAMS {
            return Err(ModelError::invalid(
                &self.origin,
                format!(
                    "step {} holds {} streams, beyond the limit of {MAX_TRACE_STREAMS}",
                    step.step,
                    step.streams()
                ),
            ));
        }
        step.validate(
            &self.geometry,
            &format!("step {} written to {}", step.step, self.origin),
        )?;
        if let Some(last) = self.last_step {
            if step.step <= last {
                return Err(ModelError::invalid(
                    &self.origin,
                    format!(
                        "step {} written after step {last}; steps must increase",
                        step.step
                    ),
                ));
            }
        }
        match self.format {
            TraceFormat::JsonLines => {
                let mut line = String::new();
                for s in 0..step.streams() {
                    let tag = tags.get(s).cloned().unwrap_or_default();
                    for (l, routes) in step.layers.iter().enumerate() {
                        let r = &routes[s];
                        let rec = JsonRecord {
                            step: step.step,
                            stream: s as u32,
                            layer: l as u32,
                            experts: r.experts.clone(),
                            weights: Some(r.weights.clone()),
                            request: tag.request.clone(),
                            token: tag.token,
                        };
                        line.clear();
                        line.push_str(
                            &serde_json::to_string(&rec).expect("a record always serializes"),
                        );
                        line.push('\n');
                        self.write_bytes(line.as_bytes())?;
                    }
                }
            }
            TraceFormat::Binary => {
                let mut block = Vec::new();
                block.extend_from_slice(&step.step.to_le_bytes());
                block.extend_from_slice(&(step.streams() as u32).to_le_bytes());
                for routes in &step.layers {
                    for r in routes {
                        for &e in &r.experts {
                            if self.id_bytes == 2 {
                                block.extend_from_slice(&(e as u16).to_le_bytes());
                            } else {
                                block.extend_from_slice(&e.to_le_bytes());
                            }
                        }
                        for &w in &r.weights {
                            block.extend_from_slice(&w.to_le_bytes());
                        }
                    }
                }
                self.write_bytes(&block)?;
            }
        }
        self.last_step = Some(step.step);
        self.steps += 1;
        Ok(())
    }

    /// Steps written so far.
    pub fn steps_written(&self) -> u64 {
        self.steps
    }

    /// Flush everything to the underlying writer.
    pub fn finish(mut self) -> Result<()> {
        self.out.flush().map_err(|source| ModelError::Io {
            path: self.origin.clone(),
            source,
        })
    }
}

/// A [`RoutingSource`] that writes every step its inner source produces to a trace (what
/// `--record` does). Replaying the trace with the same stream counts gives the same steps.
pub struct RecordingSource<S: RoutingSource> {
    inner: S,
    writer: TraceWriter,
}

impl<S: RoutingSource> std::fmt::Debug for RecordingSource<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingSource")
            .field("writer", &self.writer)
            .finish()
    }
}

impl<S: RoutingSource> RecordingSource<S> {
    /// Record `inner` into `writer`. The writer's geometry must be the source's.
    pub fn new(inner: S, writer: TraceWriter) -> Result<Self> {
        if writer.geometry != *inner.geometry() {
            return Err(ModelError::invalid(
                &writer.origin,
                "the trace writer's geometry differs from the recorded source's",
            ));
        }
        Ok(RecordingSource { inner, writer })
    }

    /// Flush the trace and give the inner source back.
    pub fn finish(self) -> Result<S> {
        self.writer.finish()?;
        Ok(self.inner)
    }
}

impl<S: RoutingSource> RoutingSource for RecordingSource<S> {
    fn geometry(&self) -> &MoeGeometry {
        self.inner.geometry()
    }

    fn next_step(&mut self, streams: usize) -> Result<StepRouting> {
        let step = self.inner.next_step(streams)?;
        self.writer.write_step(&step)?;
        Ok(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{RoutingProcess, SyntheticRouting};
    use std::io::Cursor;

    fn geo() -> MoeGeometry {
        MoeGeometry {
            hidden: 64,
            intermediate: 32,
            experts: 16,
            top_k: 2,
            moe_layers: 3,
            shared_experts: 0,
        }
    }

    fn header() -> String {
        r#"{"format":"ft-routing-trace","version":1,"experts":16,"top_k":2,"moe_layers":3}"#
            .to_string()
    }

    fn rec(step: u64, stream: u32, layer: u32, experts: &str) -> String {
        format!(
            r#"{{"step":{step},"stream":{stream},"layer":{layer},"experts":{experts},"weights":[0.75,0.25]}}"#
        )
    }

    /// A well-formed step of `streams` streams.
    fn step_lines(step: u64, streams: u32) -> Vec<String> {
        let mut v = Vec::new();
        for s in 0..streams {
            for l in 0..3 {
                v.push(rec(step, s, l, &format!("[{},{}]", s + l, 15 - l)));
            }
        }
        v
    }

    fn reader(lines: &[String]) -> Result<TraceReader> {
        let text = lines.join("\n") + "\n";
        TraceReader::from_reader(Cursor::new(text.into_bytes()), "t.jsonl", &geo())
    }

    fn err_of(lines: &[String], streams: usize) -> String {
        match reader(lines) {
            Err(e) => e.to_string(),
            Ok(mut r) => loop {
                match r.next_step(streams) {
                    Ok(_) => continue,
                    Err(e) => break e.to_string(),
                }
            },
        }
    }

    #[test]
    fn round_trips_in_both_forms() {
        let dir = tempfile::tempdir().unwrap();
        let g = geo();
        for name in ["t.jsonl", "t.ftrt"] {
            let path = dir.path().join(name);
            let src = SyntheticRouting::new(&RoutingProcess::default(), g).unwrap();
            let writer = TraceWriter::create(&path, &g).unwrap();
            let mut rec = RecordingSource::new(src, writer).unwrap();
            let counts = [3, 2, 3, 1, 4, 4, 2];
            let produced: Vec<StepRouting> =
                counts.iter().map(|&s| rec.next_step(s).unwrap()).collect();
            rec.finish().unwrap();
            let mut replay = TraceReader::open(&path, &g).unwrap();
            let want = if name.ends_with("jsonl") {
                TraceFormat::JsonLines
            } else {
                TraceFormat::Binary
            };
            assert_eq!(replay.format(), want);
            for (p, &s) in produced.iter().zip(&counts) {
                assert_eq!(&replay.next_step(s).unwrap(), p, "{name}");
            }
            let e = replay.next_step(1).unwrap_err().to_string();
            assert!(e.contains("ended after 7 steps"), "{e}");
            // Fewer streams than recorded: the first ones.
            let mut replay = TraceReader::open(&path, &g).unwrap();
            assert_eq!(replay.next_step(1).unwrap(), produced[0].truncated(1));
            let e = replay.next_step(3).unwrap_err().to_string();
            assert!(
                e.contains("step 1 holds 2 streams; 3 were requested"),
                "{e}"
            );
            // Looping wraps to the first step.
            let mut looping = TraceReader::open(&path, &g).unwrap().looping(true);
            for _ in 0..7 {
                looping.next_step(1).unwrap();
            }
            assert_eq!(looping.next_step(1).unwrap(), produced[0].truncated(1));
            assert_eq!(looping.steps_served(), 8);
            // And through `resolve`.
            let mut r = crate::routing::resolve(path.to_str().unwrap(), &g, None).unwrap();
            assert_eq!(&r.next_step(3).unwrap(), &produced[0]);
        }
        // The binary form is the smaller.
        let j = std::fs::metadata(dir.path().join("t.jsonl")).unwrap().len();
        let b = std::fs::metadata(dir.path().join("t.ftrt")).unwrap().len();
        assert!(b * 4 < j, "binary {b} bytes vs JSON lines {j}");
        // Binary size is exactly the documented layout: header + per step 12 + S*L*k*(2+4).
        let streams: u64 = [3, 2, 3, 1, 4, 4, 2].iter().sum();
        assert_eq!(b, BINARY_HEADER_BYTES as u64 + 7 * 12 + streams * 3 * 2 * 6);
    }

    #[test]
    fn json_lines_accept_omitted_weights_and_blank_lines() {
        let mut lines = vec![header(), String::new()];
        for l in 0..3 {
            lines.push(format!(
                r#"{{"step":5,"stream":0,"layer":{l},"experts":[1,2]}}"#
            ));
        }
        let mut r = reader(&lines).unwrap();
        let s = r.next_step(1).unwrap();
        assert_eq!(s.step, 5);
        assert_eq!(s.layers[2][0].weights, vec![0.5, 0.5]);
    }

    #[test]
    fn malformed_json_lines_name_the_line() {
        let ok = |mut extra: Vec<String>| {
            let mut v = vec![header()];
            v.append(&mut extra);
            v
        };
        let cases: Vec<(Vec<String>, usize, &str)> = vec![
            (vec![], 1, "empty trace"),
            (vec!["{\"format\":\"x\"}".into()], 1, "t.jsonl:1"),
            (
                vec![header().replace("\"experts\":16", "\"experts\":32")],
                1,
                "experts = 32 in the trace, 16 in the model",
            ),
            (
                vec![header().replace("\"version\":1", "\"version\":9")],
                1,
                "version 9",
            ),
            (
                ok(vec![rec(0, 0, 0, "[1,2]"), "{not json".into()]),
                1,
                "t.jsonl:3",
            ),
            (ok(vec![rec(0, 0, 0, "[1,16]")]), 1, "t.jsonl:2"),
            (ok(vec![rec(0, 0, 0, "[1,16]")]), 1, "out of range"),
            (
                ok(vec![rec(0, 0, 0, "[3,3]")]),
                1,
                "appears twice in one token",
            ),
            (ok(vec![rec(0, 0, 0, "[1,2,3]")]), 1, "top_k = 2"),
            (
                ok(vec![rec(0, 0, 5, "[1,2]")]),
                1,
                "layer 5 is out of range",
            ),
            (
                ok(vec![rec(0, 0, 0, "[1,2]"), rec(0, 0, 0, "[1,2]")]),
                1,
                "t.jsonl:3: step 0 stream 0 layer 0 appears twice",
            ),
            (
                ok(vec![rec(0, 0, 0, "[1,2]"), rec(0, 0, 1, "[1,2]")]),
                1,
                "no record for stream 0 layer 2",
            ),
            (
                ok(vec![
                    r#"{"step":0,"stream":0,"layer":0,"experts":[1,2],"weights":[0.5,0.6]}"#.into(),
                ]),
                1,
                "weights sum to 1.1",
            ),
            (
                ok(vec![
                    r#"{"step":0,"stream":0,"layer":0,"experts":[1,2],"w":[0.5,0.5]}"#.into(),
                ]),
                1,
                "unknown field",
            ),
            (
                ok([step_lines(3, 1), step_lines(2, 1)].concat()),
                1,
                "step 2 follows step 3",
            ),
            (ok(step_lines(0, 1)), 2, "holds 1 streams; 2 were requested"),
            (ok(step_lines(0, 2)), 1, "ended after 1 steps"),
        ];
        for (lines, streams, want) in cases {
            let e = err_of(&lines, streams);
            assert!(e.contains(want), "expected '{want}' in: {e}");
        }
        // A stream gap: streams 0 and 2 but not 1.
        let mut lines = vec![header()];
        lines.extend(step_lines(0, 1));
        for l in 0..3 {
            lines.push(rec(0, 2, l, "[1,2]"));
        }
        let e = err_of(&lines, 1);
        assert!(e.contains("no record for stream 1"), "{e}");
    }

    #[test]
    fn stream_counts_from_the_file_are_bounded() {
        // A huge stream index is refused before a step of that many streams is built.
        let lines = vec![
            header(),
            format!(
                r#"{{"step":0,"stream":{},"layer":0,"experts":[1,2]}}"#,
                u32::MAX
            ),
        ];
        let e = err_of(&lines, 1);
        assert!(
            e.contains("t.jsonl:2") && e.contains("limit of 4096"),
            "{e}"
        );
        // A binary block claiming u32::MAX streams: refused from its header.
        let g = geo();
        let mut bytes = BINARY_MAGIC.to_vec();
        for v in [TRACE_VERSION, 2, 16, 2, 3, 0] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        bytes.extend_from_slice(&7u64.to_le_bytes());
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut r = TraceReader::from_reader(Cursor::new(bytes), "t.ftrt", &g).unwrap();
        let e = r.next_step(1).unwrap_err().to_string();
        assert!(
            e.contains("4294967295 streams") && e.contains("limit"),
            "{e}"
        );
        // Request ids and token positions are accepted and round-trip through the writer.
        let tagged = vec![
            header(),
            r#"{"step":0,"stream":0,"layer":0,"experts":[1,2],"request":"r-1","token":0}"#.into(),
            r#"{"step":0,"stream":0,"layer":1,"experts":[1,2],"request":"r-1","token":0}"#.into(),
            r#"{"step":0,"stream":0,"layer":2,"experts":[1,2],"request":"r-1","token":0}"#.into(),
        ];
        let step = reader(&tagged).unwrap().next_step(1).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let mut w = TraceWriter::create(&path, &g).unwrap();
        let tag = StreamTag {
            request: Some("r-1".into()),
            token: Some(5),
        };
        w.write_step_tagged(&step, std::slice::from_ref(&tag))
            .unwrap();
        w.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(r#""request":"r-1","token":5"#), "{text}");
        assert_eq!(
            TraceReader::open(&path, &g).unwrap().next_step(1).unwrap(),
            step
        );
    }

    #[test]
    fn request_tags_round_trip_and_requests_are_gathered() {
        let dir = tempfile::tempdir().unwrap();
        let g = geo();
        let path = dir.path().join("t.jsonl");
        let mut w = TraceWriter::create(&path, &g).unwrap();
        let mut src = SyntheticRouting::new(&RoutingProcess::default(), g).unwrap();
        // Stream 0 serves "a" for 3 steps then "b" for 2; stream 1 serves "c" for 5 steps
        // with a skipped token position at step 3; stream 2 is untagged.
        let tag = |r: &str, t: u64| StreamTag {
            request: Some(r.into()),
            token: Some(t),
        };
        let mut written = Vec::new();
        for i in 0..5u64 {
            let step = src.next_step(3).unwrap();
            let t0 = if i < 3 {
                tag("a", 10 + i)
            } else {
                tag("b", i - 3)
            };
            let t1 = tag("c", if i < 3 { i } else { i + 1 });
            let tags = vec![t0, t1, StreamTag::default()];
            w.write_step_tagged(&step, &tags).unwrap();
            written.push((step, tags));
        }
        w.finish().unwrap();
        // Read back: the same steps with the same tags, through either call.
        let mut r = TraceReader::open(&path, &g).unwrap();
        for (step, tags) in &written {
            assert_eq!(
                r.read_step_tagged().unwrap().as_ref(),
                Some(&(step.clone(), tags.clone()))
            );
        }
        assert_eq!(r.read_step_tagged().unwrap(), None);
        let q = trace_requests(&path).unwrap();
        assert_eq!(
            (q.steps, q.streams, q.stream_steps, q.tagged),
            (5, 3, 15, 10)
        );
        assert_eq!(q.requests, 3);
        assert_eq!((q.tokens_min, q.tokens_max), (2, 5));
        assert!((q.tokens_mean - 10.0 / 3.0).abs() < 1e-12);
        assert_eq!(q.token_gaps, 1);
        let summary: Vec<_> = q
            .listed
            .iter()
            .map(|r| {
                (
                    r.stream,
                    r.request.as_str(),
                    r.first_step,
                    r.tokens,
                    r.first_token,
                    r.last_token,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (0, "a", 0, 3, Some(10), Some(12)),
                (0, "b", 3, 2, Some(0), Some(1)),
                (1, "c", 0, 5, Some(0), Some(5)),
            ]
        );
        // The binary form keeps no tags: the same steps, no requests.
        let bin = dir.path().join("t.ftrt");
        let mut w = TraceWriter::create(&bin, &g).unwrap();
        for (step, tags) in &written {
            w.write_step_tagged(step, tags).unwrap();
        }
        w.finish().unwrap();
        let q = trace_requests(&bin).unwrap();
        assert_eq!(
            (q.steps, q.stream_steps, q.tagged, q.requests),
            (5, 15, 0, 0)
        );
    }

    #[test]
    fn a_stream_with_two_tags_in_one_step_is_refused() {
        let mut lines = vec![header()];
        for l in 0..3 {
            let r = if l == 2 { "r-2" } else { "r-1" };
            lines.push(format!(
                r#"{{"step":0,"stream":0,"layer":{l},"experts":[1,2],"request":"{r}","token":0}}"#
            ));
        }
        let e = err_of(&lines, 1);
        assert!(
            e.contains("t.jsonl:4")
                && e.contains(r#"request "r-2" token 0"#)
                && e.contains(r#"line 2 tags the same step and stream request "r-1" token 0"#),
            "{e}"
        );
        // A token position that differs between the layers is refused the same way.
        lines[3] = r#"{"step":0,"stream":0,"layer":2,"experts":[1,2],"request":"r-1"}"#.into();
        let e = err_of(&lines, 1);
        assert!(e.contains(r#"request "r-1", no token"#), "{e}");
    }

    #[test]
    fn malformed_binary_traces_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let g = geo();
        let path = dir.path().join("t.ftrt");
        let mut w = TraceWriter::create(&path, &g).unwrap();
        let mut src = SyntheticRouting::new(&RoutingProcess::default(), g).unwrap();
        w.write_step(&src.next_step(2).unwrap()).unwrap();
        w.write_step(&src.next_step(2).unwrap()).unwrap();
        assert_eq!(w.steps_written(), 2);
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let open = |b: Vec<u8>, g: &MoeGeometry| -> String {
            match TraceReader::from_reader(Cursor::new(b), "t.ftrt", g) {
                Err(e) => e.to_string(),
                Ok(mut r) => loop {
                    if let Err(e) = r.next_step(2) {
                        break e.to_string();
                    }
                },
            }
        };
        // Cut in the middle of the second step.
        let e = open(bytes[..bytes.len() - 5].to_vec(), &g);
        assert!(e.contains("truncated") && e.contains("step 1"), "{e}");
        let mut v = bytes.clone();
        v[8] = 2;
        assert!(open(v, &g).contains("version 2"));
        let mut v = bytes.clone();
        v[12] = 3;
        assert!(open(v, &g).contains("id width 3"));
        let mut v = bytes.clone();
        // First route's first id (after header and step header) set out of range.
        v[BINARY_HEADER_BYTES + 12] = 200;
        let e = open(v, &g);
        assert!(e.contains("out of range") && e.contains("byte 44"), "{e}");
        let other = MoeGeometry { top_k: 3, ..g };
        assert!(open(bytes.clone(), &other).contains("top_k = 2 in the trace, 3 in the model"));
        assert!(open(bytes[..20].to_vec(), &g).contains("truncated"));
        assert!(open(bytes, &g).contains("ended after 2 steps"));
    }

    #[test]
    fn writer_checks_its_input() {
        let dir = tempfile::tempdir().unwrap();
        let g = geo();
        assert!(TraceWriter::create(&dir.path().join("t.txt"), &g)
            .unwrap_err()
            .to_string()
            .contains(".jsonl"));
        let mut w = TraceWriter::create(&dir.path().join("t.jsonl"), &g).unwrap();
        let mut src = SyntheticRouting::new(&RoutingProcess::default(), g).unwrap();
        let s = src.next_step(1).unwrap();
        w.write_step(&s).unwrap();
        assert!(w
            .write_step(&s)
            .unwrap_err()
            .to_string()
            .contains("must increase"));
        let mut bad = src.next_step(1).unwrap();
        bad.layers.pop();
        assert!(w
            .write_step(&bad)
            .unwrap_err()
            .to_string()
            .contains("MoE layers"));
        let other = MoeGeometry { experts: 32, ..g };
        let w2 = TraceWriter::create(&dir.path().join("u.jsonl"), &other).unwrap();
        assert!(RecordingSource::new(src, w2).is_err());
        assert_eq!(
            TraceFormat::from_path(Path::new("a.ndjson")).unwrap(),
            TraceFormat::JsonLines
        );
        assert_eq!(
            TraceFormat::from_path(Path::new("a.bin")).unwrap(),
            TraceFormat::Binary
        );
    }

    /// The input the trace fuzzer found (a binary step whose stream count asked for about
    /// 50 GB) is an error naming the limit, with nothing allocated for it.
    #[test]
    fn the_fuzzers_stream_count_input_is_an_error() {
        let data = include_bytes!("../../../fuzz/regressions/trace-binary-stream-count.ftrt");
        let geometry = MoeGeometry {
            hidden: 64,
            intermediate: 64,
            experts: 16,
            top_k: 2,
            moe_layers: 2,
            shared_experts: 0,
        };
        let mut reader =
            TraceReader::from_reader(std::io::Cursor::new(data.to_vec()), "fuzz", &geometry)
                .unwrap();
        let mut error = None;
        for _ in 0..64 {
            match reader.read_step() {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(e) => {
                    error = Some(e.to_string());
                    break;
                }
            }
        }
        let error = error.expect("the crafted stream count is refused");
        assert!(error.contains("limit"), "{error}");
    }
}
