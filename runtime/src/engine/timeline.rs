//! The events a layer records and how a step's spans are rebuilt from them.
//!
//! Each device operation's end is an event; its start is the latest of the previous
//! operation's end on the same stream, the events it waited for, and the host time it was
//! queued at (a stream runs in order). So one event per operation gives the whole timeline,
//! read once per step after the step's outputs are back (every event has completed by then).
//! The device's times are placed on the host's clock by the step's anchor, an event recorded
//! on the idle compute stream as the step starts ([`Event::timeline_us_from`]), so a step's
//! device and host spans share one axis within a few microseconds.

use crate::device::{Device, Event, Stream};
use crate::error::Result;
use crate::instrument::{ns_of_us, Lane, SpanKind, StepTimeline};

/// The events of one layer, reused every step.
pub(crate) struct LayerEvents {
    /// Compute stream, after the dense part up to the router (gathers wait for it).
    pub router: Event,
    /// Compute stream, after the experts' input rows are ready (the CPU's download waits).
    pub input: Event,
    /// Compute stream, after the dense part's post-router share (timing only).
    pub post: Event,
    /// Compute stream, after the hits' expert step (timing only).
    pub hits: Event,
    /// Compute stream, after the fetched experts' step (timing only).
    pub fetched: Event,
    /// Compute stream, after the CPU rows were read in (timing only).
    pub merged: Event,
    /// Compute stream, after the combine (timing only).
    pub done: Event,
    /// Copy stream, after the gathers (the fetched step waits for it).
    pub gathered: Event,
    /// Copy stream, after each chunk of the gathers but the last (which records
    /// `gathered`): the fetched chunk that follows waits for it.
    pub gathered_chunks: Vec<Event>,
    /// Activation stream, after the download for the CPU (the host waits for it).
    pub down: Event,
    timing: bool,
}

impl LayerEvents {
    /// Events of one layer; with `timing`, timing events that also give the timeline.
    pub fn new(device: &Device, timing: bool, chunk_events: usize) -> Result<Self> {
        let e = || device.new_event(timing);
        Ok(LayerEvents {
            router: e()?,
            input: e()?,
            post: e()?,
            hits: e()?,
            fetched: e()?,
            merged: e()?,
            done: e()?,
            gathered: e()?,
            gathered_chunks: (0..chunk_events).map(|_| e()).collect::<Result<Vec<_>>>()?,
            down: e()?,
            timing,
        })
    }

    /// The event after chunk `c` of `chunks` of the gathers: the last chunk's is `gathered`.
    pub fn chunk_gathered(&self, c: usize, chunks: usize) -> &Event {
        if c + 1 >= chunks {
            &self.gathered
        } else {
            &self.gathered_chunks[c]
        }
    }

    /// Record a timing-only event (nothing without timing).
    pub fn record_timing(&self, stream: &Stream, ev: &Event) -> Result<()> {
        if self.timing {
            stream.record(ev)?;
        }
        Ok(())
    }
}

/// Host-side times (us on the device clock) and facts of one layer of one step.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LayerMarks {
    pub submit_start: f64,
    pub dense_submit: f64,
    pub submit_end: f64,
    /// When the host queued the post-router dense part (the first of the work a CPU share
    /// does not wait for; later than `submit_end` in a layer with a CPU share).
    pub rest_submit: f64,
    pub wait_start: f64,
    pub wait_end: f64,
    pub cpu_end: f64,
    pub merge_end: f64,
    pub layer_end_submit: f64,
    /// The layer gathered experts.
    pub link: bool,
    /// The layer had CPU work.
    pub cpu: bool,
    /// The dense part had a post-router share.
    pub post: bool,
    pub hit_experts: u32,
    pub link_experts: u32,
    pub cpu_experts: u32,
    pub gather_bytes: u64,
    pub cpu_rows_bytes: u64,
    pub down_bytes: u64,
    /// The activations' copy down waited for the router (every layer with a CPU share).
    pub down_after_router: bool,
}

/// Add the spans of a finished step to `tl`: host and CPU spans always, device spans when
/// the events carry timing, placed on the host's axis by the step's `anchor` (an event the
/// host recorded at `t0` on the idle compute stream, [`Event::timeline_us_from`]). `t0` is
/// the step's start and `out` the final download's wait (start, end), us.
pub(crate) fn add_spans(
    tl: &mut StepTimeline,
    marks: &[LayerMarks],
    events: &[LayerEvents],
    anchor: Option<&Event>,
    t0: f64,
    out: (f64, f64),
) -> Result<()> {
    let mut span = |lane, kind, layer, a: f64, b: f64, bytes, experts| {
        tl.span(
            lane,
            kind,
            layer,
            ns_of_us(a),
            ns_of_us(b.max(a)),
            bytes,
            experts,
        )
    };
    let (mut prev_compute, mut prev_copy, mut prev_act) = (t0, t0, t0);
    for (l, (m, ev)) in marks.iter().zip(events).enumerate() {
        // The host's own time in the layer: planning and submitting it (with a CPU share,
        // up to its wait for the activations: planning the next layer is in it), and after
        // the CPU share the merge and the combine. Without one, all of it in one span.
        span(
            Lane::HostSync,
            SpanKind::Submit,
            l,
            m.submit_start,
            if m.cpu {
                m.wait_start
            } else {
                m.layer_end_submit
            },
            0,
            0,
        );
        if m.cpu {
            span(
                Lane::HostSync,
                SpanKind::Wait,
                l,
                m.wait_start,
                m.wait_end,
                0,
                0,
            );
            span(
                Lane::CpuPool,
                SpanKind::CpuExperts,
                l,
                m.wait_end,
                m.cpu_end,
                0,
                m.cpu_experts,
            );
            span(
                Lane::HostSync,
                SpanKind::Submit,
                l,
                m.cpu_end,
                m.layer_end_submit,
                0,
                0,
            );
        }
        let Some(anchor) = anchor else {
            continue;
        };
        let t = |e: &Event| e.timeline_us_from(anchor, t0);
        let router = t(&ev.router)?;
        let input = t(&ev.input)?;
        let post = t(&ev.post)?;
        let hits = t(&ev.hits)?;
        let fetched = t(&ev.fetched)?;
        let done = t(&ev.done)?;
        let dense_start = prev_compute.max(m.dense_submit);
        span(
            Lane::GpuCompute,
            SpanKind::Dense,
            l,
            dense_start,
            router,
            0,
            0,
        );
        if input > router {
            span(Lane::GpuCompute, SpanKind::Prepare, l, router, input, 0, 0);
        }
        // The rest of the layer's GPU work starts once queued (after the CPU share's wait
        // began, with the host's submission overlapped).
        let rest_start = input.max(m.rest_submit);
        if m.post {
            span(Lane::GpuCompute, SpanKind::Dense, l, rest_start, post, 0, 0);
        }
        span(
            Lane::GpuCompute,
            SpanKind::HitExperts,
            l,
            post.max(rest_start),
            hits,
            0,
            m.hit_experts,
        );
        let mut fetched_start = hits;
        if m.link {
            let gathered = t(&ev.gathered)?;
            let start = prev_copy.max(router);
            span(
                Lane::Copy,
                SpanKind::Gather,
                l,
                start,
                gathered,
                m.gather_bytes,
                m.link_experts,
            );
            prev_copy = gathered;
            fetched_start = hits.max(gathered);
        }
        if fetched > hits {
            span(
                Lane::GpuCompute,
                SpanKind::FetchedExperts,
                l,
                fetched_start,
                fetched,
                0,
                m.link_experts,
            );
        }
        let mut combine_start = fetched;
        if m.cpu {
            let down = t(&ev.down)?;
            span(
                Lane::Copy,
                SpanKind::ActivationsDown,
                l,
                prev_act.max(if m.down_after_router { router } else { input }),
                down,
                m.down_bytes,
                0,
            );
            prev_act = down;
            let merged = t(&ev.merged)?;
            span(
                Lane::Copy,
                SpanKind::PartialUp,
                l,
                fetched.max(m.cpu_end),
                merged,
                m.cpu_rows_bytes,
                m.cpu_experts,
            );
            combine_start = merged;
        }
        span(
            Lane::GpuCompute,
            SpanKind::Combine,
            l,
            combine_start,
            done,
            0,
            0,
        );
        prev_compute = done;
    }
    let last = marks.len().saturating_sub(1);
    span(Lane::HostSync, SpanKind::Wait, last, out.0, out.1, 0, 0);
    Ok(())
}
