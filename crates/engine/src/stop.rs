//! Stop strings over streamed text (`strata run` and the server): what may be sent now, and
//! where a stop string begins.
//! Text that could still grow into a stop string is held back, so a client never sees the
//! start of one.

/// For the generated `text` of which `emitted` bytes were already sent: the end of what
/// is safe to send now, and the first stop string found (its byte offset and itself).
pub fn split_stop(
    text: &str,
    emitted: usize,
    stops: &[String],
) -> (usize, Option<(usize, String)>) {
    let found = stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()).map(|at| (at, s.clone())))
        .min_by_key(|(at, _)| *at);
    if let Some((at, s)) = found {
        return (at.max(emitted), Some((at, s)));
    }
    let held = stops
        .iter()
        .map(|s| longest_suffix_prefix(text, s))
        .max()
        .unwrap_or(0);
    ((text.len() - held).max(emitted), None)
}

/// The length of the longest proper prefix of `stop` that `text` ends with, at a char
/// boundary of `text`.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&k| {
            text.is_char_boundary(text.len() - k)
                && stop
                    .as_bytes()
                    .starts_with(&text.as_bytes()[text.len() - k..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::split_stop;

    #[test]
    fn holds_back_what_may_become_a_stop_string() {
        let stops = vec!["</end>".to_string()];
        assert_eq!(split_stop("hello </e", 0, &stops), (6, None));
        assert_eq!(
            split_stop("hello </end> more", 0, &stops),
            (6, Some((6, "</end>".into())))
        );
        assert_eq!(split_stop("plain", 0, &stops), (5, None));
        assert_eq!(split_stop("abc", 0, &[]), (3, None));
        // Never behind what was already sent.
        assert_eq!(split_stop("ab<", 3, &["<x".to_string()]), (3, None));
        // The earliest of several stop strings wins.
        let two = vec!["c".to_string(), "b".to_string()];
        assert_eq!(split_stop("abcd", 0, &two), (1, Some((1, "b".into()))));
        // A multi-byte character is never split.
        assert_eq!(split_stop("aé", 0, &["\u{e9}x".to_string()]), (1, None));
    }
}
