//! Counters, gauges and the time-to-first-token histogram shown by GET /metrics in
//! Prometheus' text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::park::ParkStats;

/// Upper bounds (seconds) of the time-to-first-token histogram's buckets.
const TTFT_BUCKETS: [f64; 12] = [
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

#[derive(Default)]
pub struct Metrics {
    pub requests_total: AtomicU64,
    pub requests_failed_total: AtomicU64,
    pub requests_cancelled_total: AtomicU64,
    pub prompt_tokens_total: AtomicU64,
    pub completion_tokens_total: AtomicU64,
    pub prefill_tokens_total: AtomicU64,
    pub prefill_micros_total: AtomicU64,
    pub decode_tokens_total: AtomicU64,
    pub decode_micros_total: AtomicU64,
    pub resumed_tokens_total: AtomicU64,
    pub resumes_device_total: AtomicU64,
    pub resumes_host_total: AtomicU64,
    pub resumes_disk_total: AtomicU64,
    pub parked_host_conversations: AtomicU64,
    pub parked_host_bytes: AtomicU64,
    pub parked_disk_conversations: AtomicU64,
    pub parked_disk_bytes: AtomicU64,
    pub queue_depth: AtomicU64,
    pub slots_busy: AtomicU64,
    /// Elastic K/V (`--kv-grow`): grows, trims, their summed and longest stalls, the
    /// requests stopped because the K/V could not grow, and the cells of every context.
    pub kv_grows_total: AtomicU64,
    pub kv_trims_total: AtomicU64,
    pub kv_grow_micros_total: AtomicU64,
    pub kv_trim_micros_total: AtomicU64,
    pub kv_grow_micros_max: AtomicU64,
    pub kv_trim_micros_max: AtomicU64,
    pub kv_refusals_total: AtomicU64,
    pub kv_cells: AtomicU64,
    /// Speculative decoding (`--spec K`): verify windows, drafts verified in them, drafts
    /// accepted.
    pub spec_windows_total: AtomicU64,
    pub spec_draft_tokens_total: AtomicU64,
    pub spec_accepted_tokens_total: AtomicU64,
    ttft_buckets: [AtomicU64; TTFT_BUCKETS.len()],
    ttft_count: AtomicU64,
    ttft_micros_sum: AtomicU64,
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn prefill(&self, tokens: usize, took: Duration) {
        Self::add(&self.prefill_tokens_total, tokens as u64);
        Self::add(&self.prefill_micros_total, took.as_micros() as u64);
    }

    pub fn decode(&self, tokens: usize, took: Duration) {
        Self::add(&self.decode_tokens_total, tokens as u64);
        Self::add(&self.decode_micros_total, took.as_micros() as u64);
    }

    /// A verify window of `drafted` drafts accepted `accepted` of them.
    pub fn spec_window(&self, drafted: usize, accepted: usize) {
        Self::add(&self.spec_windows_total, 1);
        Self::add(&self.spec_draft_tokens_total, drafted as u64);
        Self::add(&self.spec_accepted_tokens_total, accepted as u64);
    }

    pub fn observe_ttft(&self, t: Duration) {
        let s = t.as_secs_f64();
        for (b, le) in self.ttft_buckets.iter().zip(TTFT_BUCKETS) {
            if s <= le {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        Self::add(&self.ttft_count, 1);
        Self::add(&self.ttft_micros_sum, t.as_micros() as u64);
    }

    /// A K/V grow (or trim) that took `took`.
    pub fn kv_change(&self, grew: bool, took: Duration) {
        let us = took.as_micros() as u64;
        let (count, sum, max) = if grew {
            (
                &self.kv_grows_total,
                &self.kv_grow_micros_total,
                &self.kv_grow_micros_max,
            )
        } else {
            (
                &self.kv_trims_total,
                &self.kv_trim_micros_total,
                &self.kv_trim_micros_max,
            )
        };
        Self::add(count, 1);
        Self::add(sum, us);
        max.fetch_max(us, Ordering::Relaxed);
    }

    pub fn set_parked(&self, s: ParkStats) {
        let set = |c: &AtomicU64, v: usize| c.store(v as u64, Ordering::Relaxed);
        set(&self.parked_host_conversations, s.host_conversations);
        set(&self.parked_host_bytes, s.host_bytes);
        set(&self.parked_disk_conversations, s.disk_conversations);
        set(&self.parked_disk_bytes, s.disk_bytes);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut row = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {value}");
        };
        let rate = |tokens: &AtomicU64, micros: &AtomicU64| {
            let us = get(micros);
            if us == 0 {
                0.0
            } else {
                get(tokens) as f64 / (us as f64 / 1e6)
            }
        };
        let counters: [(&str, &str, &AtomicU64); 17] = [
            (
                "strata_requests_total",
                "Completion requests received.",
                &self.requests_total,
            ),
            (
                "strata_requests_failed_total",
                "Requests that failed inside the engine.",
                &self.requests_failed_total,
            ),
            (
                "strata_requests_cancelled_total",
                "Requests whose client left before the end.",
                &self.requests_cancelled_total,
            ),
            (
                "strata_prompt_tokens_total",
                "Prompt tokens of served requests.",
                &self.prompt_tokens_total,
            ),
            (
                "strata_completion_tokens_total",
                "Tokens generated.",
                &self.completion_tokens_total,
            ),
            (
                "strata_prefill_tokens_total",
                "Prompt tokens fed through the model (reused ones are not).",
                &self.prefill_tokens_total,
            ),
            (
                "strata_decode_tokens_total",
                "Tokens taken from decode steps (a verify window gives its accepted drafts and one more).",
                &self.decode_tokens_total,
            ),
            (
                "strata_resumed_tokens_total",
                "Prompt tokens whose K/V was reused instead of read.",
                &self.resumed_tokens_total,
            ),
            (
                "strata_resumes_device_total",
                "Requests that reused K/V still resident in a context.",
                &self.resumes_device_total,
            ),
            (
                "strata_resumes_host_total",
                "Requests resumed from a conversation parked in host memory.",
                &self.resumes_host_total,
            ),
            (
                "strata_resumes_disk_total",
                "Requests resumed from a conversation parked on disk.",
                &self.resumes_disk_total,
            ),
            (
                "strata_kv_grows_total",
                "Times an elastic K/V grew (--kv-grow).",
                &self.kv_grows_total,
            ),
            (
                "strata_kv_trims_total",
                "Times an elastic K/V was trimmed back to its initial cells.",
                &self.kv_trims_total,
            ),
            (
                "strata_kv_refusals_total",
                "Requests stopped (finish_reason length) because the K/V could not grow beside --vram-reserve-mib.",
                &self.kv_refusals_total,
            ),
            (
                "strata_spec_windows_total",
                "Speculative verify windows (--spec K): decode steps that checked drafts.",
                &self.spec_windows_total,
            ),
            (
                "strata_spec_draft_tokens_total",
                "Drafted tokens verified in windows.",
                &self.spec_draft_tokens_total,
            ),
            (
                "strata_spec_accepted_tokens_total",
                "Drafted tokens the model accepted.",
                &self.spec_accepted_tokens_total,
            ),
        ];
        for (name, help, c) in counters {
            row(name, "counter", help, get(c).to_string());
        }
        row(
            "strata_prefill_seconds_total",
            "counter",
            "Seconds spent feeding prompts.",
            format!("{:.6}", get(&self.prefill_micros_total) as f64 / 1e6),
        );
        row(
            "strata_decode_seconds_total",
            "counter",
            "Seconds spent in decode steps (verify windows included).",
            format!("{:.6}", get(&self.decode_micros_total) as f64 / 1e6),
        );
        row(
            "strata_prefill_tokens_per_second",
            "gauge",
            "Prompt tokens per second of prefill, over the server's life.",
            format!(
                "{:.2}",
                rate(&self.prefill_tokens_total, &self.prefill_micros_total)
            ),
        );
        row(
            "strata_decode_tokens_per_second",
            "gauge",
            "Tokens per second of decode steps (verify windows included), over the server's life.",
            format!(
                "{:.2}",
                rate(&self.decode_tokens_total, &self.decode_micros_total)
            ),
        );
        let secs = |c: &AtomicU64| format!("{:.6}", get(c) as f64 / 1e6);
        let stalls: [(&str, &str, &str, &AtomicU64); 4] = [
            (
                "strata_kv_grow_seconds_total",
                "counter",
                "Seconds K/V grows held their context (moved rows and slot copies landed).",
                &self.kv_grow_micros_total,
            ),
            (
                "strata_kv_trim_seconds_total",
                "counter",
                "Seconds K/V trims held their context (moved rows, refills and table uploads landed).",
                &self.kv_trim_micros_total,
            ),
            (
                "strata_kv_grow_seconds_max",
                "gauge",
                "The longest K/V grow.",
                &self.kv_grow_micros_max,
            ),
            (
                "strata_kv_trim_seconds_max",
                "gauge",
                "The longest K/V trim.",
                &self.kv_trim_micros_max,
            ),
        ];
        for (name, kind, help, c) in stalls {
            row(name, kind, help, secs(c));
        }
        let parked = get(&self.parked_host_conversations) + get(&self.parked_disk_conversations);
        let gauges: [(&str, &str, u64); 8] = [
            (
                "strata_queue_depth",
                "Requests waiting for or being served by the engine.",
                get(&self.queue_depth),
            ),
            (
                "strata_slots_busy",
                "Contexts serving a request now.",
                get(&self.slots_busy),
            ),
            (
                "strata_parked_conversations",
                "Conversations parked (host memory and disk).",
                parked,
            ),
            (
                "strata_parked_host_conversations",
                "Conversations parked in host memory.",
                get(&self.parked_host_conversations),
            ),
            (
                "strata_parked_host_bytes",
                "Bytes of K/V parked in host memory.",
                get(&self.parked_host_bytes),
            ),
            (
                "strata_parked_disk_conversations",
                "Conversations parked on disk.",
                get(&self.parked_disk_conversations),
            ),
            (
                "strata_parked_disk_bytes",
                "Bytes of K/V parked on disk.",
                get(&self.parked_disk_bytes),
            ),
            (
                "strata_kv_cells",
                "K/V cells the contexts hold now (all of them, elastic or not).",
                get(&self.kv_cells),
            ),
        ];
        for (name, help, v) in gauges {
            row(name, "gauge", help, v.to_string());
        }
        let name = "strata_time_to_first_token_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from a request's arrival to its first token."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (b, le) in self.ttft_buckets.iter().zip(TTFT_BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {}", get(b));
        }
        let count = get(&self.ttft_count);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {:.6}",
            get(&self.ttft_micros_sum) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {count}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_is_cumulative_and_every_metric_has_help_and_type() {
        let m = Metrics::default();
        m.observe_ttft(Duration::from_millis(30));
        m.observe_ttft(Duration::from_secs(2));
        m.prefill(100, Duration::from_millis(500));
        m.spec_window(4, 3);
        m.spec_window(2, 0);
        let text = m.render();
        assert!(text.contains("strata_spec_windows_total 2\n"));
        assert!(text.contains("strata_spec_draft_tokens_total 6\n"));
        assert!(text.contains("strata_spec_accepted_tokens_total 3\n"));
        assert!(text.contains("strata_time_to_first_token_seconds_bucket{le=\"0.025\"} 0"));
        assert!(text.contains("strata_time_to_first_token_seconds_bucket{le=\"0.05\"} 1"));
        assert!(text.contains("strata_time_to_first_token_seconds_bucket{le=\"2.5\"} 2"));
        assert!(text.contains("strata_time_to_first_token_seconds_count 2"));
        assert!(text.contains("strata_prefill_tokens_per_second 200.00"));
        let names: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split([' ', '{']).next().unwrap_or(""))
            .collect();
        for n in names {
            let family = n
                .strip_suffix("_bucket")
                .or_else(|| n.strip_suffix("_sum"))
                .or_else(|| n.strip_suffix("_count").filter(|f| f.ends_with("_seconds")))
                .unwrap_or(n);
            assert!(text.contains(&format!("# TYPE {family} ")), "{family}");
        }
    }
}
