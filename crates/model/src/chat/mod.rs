//! Chat templates (placeholder).
