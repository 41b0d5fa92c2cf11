//! A channel of server-sent-event texts as a response body stream.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::mpsc::UnboundedReceiver;

pub struct ChannelStream(pub UnboundedReceiver<String>);

impl futures_core::Stream for ChannelStream {
    type Item = Result<String, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|o| o.map(Ok))
    }
}

/// One SSE event holding `data`.
pub fn event(data: &serde_json::Value) -> String {
    format!("data: {data}\n\n")
}

pub const DONE: &str = "data: [DONE]\n\n";
