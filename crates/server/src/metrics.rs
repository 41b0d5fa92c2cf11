//! Counters shown by GET /metrics in Prometheus' text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct Metrics {
    pub requests_total: AtomicU64,
    pub requests_failed_total: AtomicU64,
    pub prompt_tokens_total: AtomicU64,
    pub completion_tokens_total: AtomicU64,
    pub resumed_tokens_total: AtomicU64,
    pub parked_conversations: AtomicU64,
    pub queue_depth: AtomicU64,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let rows: [(&str, &str, &str, &AtomicU64); 7] = [
            (
                "strata_requests_total",
                "counter",
                "Completion requests received.",
                &self.requests_total,
            ),
            (
                "strata_requests_failed_total",
                "counter",
                "Completion requests that failed inside the engine.",
                &self.requests_failed_total,
            ),
            (
                "strata_prompt_tokens_total",
                "counter",
                "Prompt tokens of served requests.",
                &self.prompt_tokens_total,
            ),
            (
                "strata_completion_tokens_total",
                "counter",
                "Tokens generated.",
                &self.completion_tokens_total,
            ),
            (
                "strata_resumed_tokens_total",
                "counter",
                "Prompt tokens whose K/V was reused from a parked conversation.",
                &self.resumed_tokens_total,
            ),
            (
                "strata_parked_conversations",
                "gauge",
                "Conversations parked with their K/V.",
                &self.parked_conversations,
            ),
            (
                "strata_queue_depth",
                "gauge",
                "Requests waiting for or being served by the engine.",
                &self.queue_depth,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        out
    }
}
